"""Lookup, prefetch sessions and the engine-driven (PREPARE/COMMIT over SHM)
transfer path, emulating upstream's scheduler and worker DEALERs byte for
byte (docs/protocol.md: "Keys", "Engine-driven flow, end to end")."""
import functools
import hashlib
import json
import mmap
import os
import threading
import time
import urllib.request

import msgpack
import pytest

from lmc.client import lookup as lmc_lookup
from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import (CLEAR, COMMIT_RETRIEVE, COMMIT_STORE, END_SESSION, FREE_LOOKUP_LOCKS, LOOKUP,
                     NOOP, PING, PREPARE_RETRIEVE, PREPARE_STORE, QUERY_PREFETCH_LOOKUP_HITS,
                     QUERY_PREFETCH_STATUS, REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT,
                     UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, WAIT_PREFETCH_STATUS)

CS = 16
LAYERS, HIDDEN = 2, 8
OBJ = 2 * LAYERS * CS * HIDDEN * 2          # float16 [2, L, cs, H]
SERVER_ARGS = ("--chunk-size", str(CS))      # the srv fixture's (conftest.py)

# This module's keys and lookups are those of a world of two ranks (the
# pair fixture); lookups come from the scheduler (worker_id None).
key = functools.partial(ipc_key, world_size=2)
lookup = functools.partial(lmc_lookup, cs=CS, world_size=2)



def payload(instance_id, world_size=2, model="m", hidden=HIDDEN, layers=LAYERS, **extra):
    p = {"instance_id": instance_id, "model_name": model, "world_size": world_size,
         "block_size": CS, "num_layers": layers, "hidden_dim_size": hidden,
         "dtype_str": "float16", "use_mla": False, "num_physical_slots": None,
         "engine_group_infos": [], "group_hidden_dim_sizes": None,
         "group_layout_descs": None, "enable_l1_kvweave_quant": False}
    p.update(extra)
    return p


def chunk_bytes(rank, tokens, c, size=OBJ):
    seed = hashlib.sha256(repr((rank, tokens[: (c + 1) * CS])).encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


class Worker:
    """A worker adapter: registers, maps the server pool, fills slots."""

    def __init__(self, server, instance_id, rank, world_size=2, model="m", **reg):
        self.d = server.dealer()
        self.id, self.rank, self.ws, self.model = instance_id, rank, world_size, model
        self.reply = unpack(self.d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, payload(instance_id, world_size, model, **reg)))
        self.pool = None
        if self.reply.get("shm_name") and self.reply["pool_size"] > 0:
            fd = os.open("/dev/shm/" + self.reply["shm_name"], os.O_RDWR)
            self.pool = mmap.mmap(fd, self.reply["pool_size"])
            os.close(fd)

    def key(self, tokens, start, end, rid, **kw):
        kw.setdefault("world_size", self.ws)
        kw.setdefault("model", self.model)
        return key(tokens, start, end, rid, worker_id=self.rank, **kw)

    def store(self, tokens, start, end, rid="s", commit=True, **kw):
        k = self.key(tokens, start, end, rid, **kw)
        ctx = unpack(self.d.call(PREPARE_STORE, k, self.id))["context"]
        for slot, idx in zip(ctx["slots"], ctx["chunk_indices"]):
            data = chunk_bytes(self.rank, tokens, start // CS + idx, slot["length"])
            self.pool[slot["offset"]:slot["offset"] + slot["length"]] = data
        if commit and ctx["slots"]:
            assert unpack(self.d.call(COMMIT_STORE, k, self.id, b"")) is True
        return ctx

    def retrieve(self, tokens, start, end, rid, **kw):
        k = self.key(tokens, start, end, rid, **kw)
        r = unpack(self.d.call(PREPARE_RETRIEVE, k, self.id))
        if not r["success"]:
            return None
        out = [bytes(self.pool[s["offset"]:s["offset"] + s["length"]]) for s in r["context"]["slots"]]
        assert unpack(self.d.call(COMMIT_RETRIEVE, k, self.id)) is True
        return out

    def close(self):
        if self.pool:
            self.pool.close()
        self.d.close()


def prompt(seed, n_chunks=4):
    return [(seed * 7919 + i * 31) % 50000 for i in range(n_chunks * CS)]


@pytest.fixture
def pair(srv):
    ws = [Worker(srv, 1001, 0), Worker(srv, 1002, 1)]
    yield ws
    for w in ws:
        w.close()


def test_store_lookup_retrieve_two_ranks(srv, pair):
    toks = prompt(1)
    for w in pair:
        ctx = w.store(toks, 0, 64)
        assert ctx["chunk_indices"] == [0, 1, 2, 3]
        assert ctx["slots"][0]["shape"] == [2, LAYERS, CS, HIDDEN]
        assert ctx["slots"][0]["dtype"] == "float16" and ctx["slots"][0]["length"] == OBJ
    sched = srv.dealer()
    assert lookup(sched, toks, "r1") == 4
    assert unpack(sched.call(QUERY_PREFETCH_STATUS, "r1")) == 0          # exactly once
    for w in pair:
        got = w.retrieve(toks, 0, 64, "r1")
        assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)]
    # Each rank's share consumed: a second retrieve has no lookup lock any more.
    assert pair[0].retrieve(toks, 0, 64, "r1") is None
    shared = toks[:32] + prompt(2)[32:]
    assert lookup(sched, shared, "r2") == 2
    assert lookup(sched, toks, "r3", salt="tenant") == 0
    assert lookup(sched, toks, "r4", model="other") == 0
    assert lookup(sched, toks[:63], "r5") == 3             # only whole chunks
    sched.close()


def test_retrieve_without_lookup_and_prepare_twice(srv, pair):
    toks = prompt(3)
    w = pair[0]
    assert w.retrieve(toks, 0, 64, "x") is None             # no lock: success false
    r = unpack(w.d.call(PREPARE_RETRIEVE, w.key(toks, 0, 64, "x"), w.id))
    assert r == {"success": False, "data": b"", "context": {}}
    first = w.store(toks, 0, 64, commit=False)
    assert len(first["slots"]) == 4
    assert w.store(toks, 0, 64, commit=False) == {"slots": [], "chunk_indices": []}
    k = w.key(toks, 0, 64, "s")
    assert unpack(w.d.call(COMMIT_STORE, k, w.id, b"")) is True
    assert unpack(w.d.call(COMMIT_STORE, k, w.id, b"")) is False  # nothing pending any more
    other = w.key(prompt(4), 0, 32, "s")
    assert unpack(w.d.call(COMMIT_STORE, other, w.id, b"")) is False
    assert unpack(w.d.call(COMMIT_STORE, k, w.id, b"\x80\x04")) is False  # pickle fallback
    assert w.store(toks, 0, 64) == {"slots": [], "chunk_indices": []}


def test_free_lookup_locks_releases_exactly_the_lookup(srv, pair):
    toks = prompt(5)
    for w in pair:
        w.store(toks, 0, 64)
    sched = srv.dealer()
    assert lookup(sched, toks, "A", readers=2) == 4
    assert sched.call(CLEAR, False) is not None
    assert lookup(sched, toks, "B") == 4                    # A's locks kept them
    assert sched.call(FREE_LOOKUP_LOCKS, key(toks, 0, 64, "B"), 1) is not None
    assert sched.call(FREE_LOOKUP_LOCKS, key(toks, 0, 32, "A"), 1) is not None
    assert sched.call(FREE_LOOKUP_LOCKS, key(toks, 0, 32, "A"), 1) is not None   # no double release
    assert sched.call(FREE_LOOKUP_LOCKS, key(toks, 32, 32, "A"), 1) is not None  # start >= end: no-op
    assert sched.call(CLEAR, False) is not None
    # Chunks 0-1 went, 2-3 are still locked by A.
    assert pair[0].store(toks, 0, 64, commit=False)["chunk_indices"] == [0, 1]
    assert sched.call(FREE_LOOKUP_LOCKS, key(toks, 32, 64, "A"), 1) is not None
    assert sched.call(CLEAR, False) is not None
    assert pair[1].store(toks, 0, 64, commit=False)["chunk_indices"] == [0, 1, 2, 3]
    sched.close()


def test_end_session_drops_session_and_unqueried_locks(srv, pair):
    toks = prompt(6)
    for w in pair:
        w.store(toks, 0, 64)
    sched = srv.dealer()
    assert sched.call(LOOKUP, key(toks, 0, 64, "E", readers=2), 1) is not None
    assert unpack(sched.call(QUERY_PREFETCH_LOOKUP_HITS, "E")) == 4        # does not consume
    assert sched.call(END_SESSION, "E") is not None
    assert sched.call(END_SESSION, "E", {"finish_reason": "stop", "stop_token_id": -1}) is not None
    assert unpack(sched.call(QUERY_PREFETCH_STATUS, "E")) == 0
    assert unpack(sched.call(QUERY_PREFETCH_LOOKUP_HITS, "E")) == 0
    assert sched.call(CLEAR, False) is not None             # nothing is locked any more
    assert lookup(sched, toks, "E2") == 0
    sched.close()


def test_wait_prefetch_status(srv, pair):
    toks = prompt(7)
    for w in pair:
        w.store(toks, 0, 64)
    sched = srv.dealer()
    t0 = time.monotonic()
    assert unpack(sched.call(WAIT_PREFETCH_STATUS, "nope", 5.0)) == 0
    assert sched.call(LOOKUP, key(toks, 0, 64, "W"), 1) is not None
    assert unpack(sched.call(WAIT_PREFETCH_STATUS, "W", 0.05)) == 4
    assert unpack(sched.call(WAIT_PREFETCH_STATUS, "W", 5.0)) == 0
    assert time.monotonic() - t0 < 2
    sched.close()


def test_malformed_keys_are_dropped(srv, pair):
    sched = srv.dealer()
    toks = prompt(8)
    bad = [key(toks, 3, 64, "m1"), key(toks, 0, 65, "m2"), key(toks, 0, 80, "m3"),
           key([2 ** 32] + toks[1:], 0, 64, "m4"), key(toks, 0, 64, "m5", world_size=0),
           key(toks, 0, 64, "m6", model="a@b"), key(toks, 0, 64, "m7", salt="x/y"),
           {"model_name": "m"}, [1, 2]]
    for k in bad:
        assert sched.call(LOOKUP, k, 1, timeout_ms=300) is None
    w = pair[0]
    assert w.d.call(PREPARE_STORE, key(toks, 0, 64, "t"), w.id, timeout_ms=300) is None   # worker None
    assert w.d.call(PREPARE_STORE, key(toks, 0, 64, "t", worker_id=2), w.id, timeout_ms=300) is None
    assert w.d.call(PREPARE_RETRIEVE, key(toks, 8, 64, "t", worker_id=0), w.id, timeout_ms=300) is None
    for p in ({"instance_id": 9}, {**payload(9), "model_name": 3}, "x"):
        assert w.d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, p, timeout_ms=300) is None     # malformed payload: dropped
    assert w.d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, timeout_ms=300) is None            # no payload frame at all
    assert w.d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, raw=[b"\xc1"], timeout_ms=300) is None   # not msgpack
    assert unpack(sched.call(NOOP)) == "OK"
    assert lookup(sched, toks, "ok") == 0
    assert lookup(sched, toks, "") == 0           # "" is a request id too (msgpack-c: NULL ptr)
    assert sched.call(END_SESSION, "") is not None
    sched.close()


def test_concurrent_sessions(srv, pair):
    prompts = [prompt(100 + i, 2 + i % 3) for i in range(6)]
    for p in prompts:
        for w in pair:
            w.store(p, 0, len(p))
    errors = []

    def client(t):
        # An assertion in a thread would only end the thread: every failure,
        # raised or counted, goes to `errors`, which the test asserts.
        d = srv.dealer()
        try:
            for i in range(25):
                p = prompts[(t + i) % len(prompts)]
                rid = f"c{t}-{i}"
                got = lookup(d, p, rid)
                if got != len(p) // CS:
                    errors.append((rid, got))
                if d.call(FREE_LOOKUP_LOCKS, key(p, 0, len(p), rid), 1) is None:
                    errors.append((rid, "FREE_LOOKUP_LOCKS unanswered"))
                if d.call(END_SESSION, rid) is None:
                    errors.append((rid, "END_SESSION unanswered"))
        except BaseException as e:  # noqa: BLE001 - reported to the main thread
            errors.append((t, repr(e)))
        finally:
            d.close()

    threads = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert srv.alive()


def test_memory_pressure_keeps_locked_and_evicts_lru(start_server):
    s = start_server("--chunk-size", str(CS), "--l1-size-gb", "0.01",
                     "--eviction-trigger-watermark", "0.5")
    hidden = 1024
    w = Worker(s, 7, 0, world_size=1, hidden=hidden)
    obj = 2 * LAYERS * CS * hidden * 2
    sched = s.dealer()
    locked = prompt(200)
    w.store(locked, 0, 64)
    assert lookup(sched, locked, "L", world_size=1) == 4
    prompts = [prompt(300 + i) for i in range(30)]          # ~120 objects > pool
    for p in prompts:
        w.store(p, 0, 64)
    time.sleep(1.2)                                          # one eviction period
    got = w.retrieve(locked, 0, 64, "L", world_size=1)
    assert got == [chunk_bytes(0, locked, c, obj) for c in range(4)]
    hits = [lookup(sched, p, f"q{i}", world_size=1) for i, p in enumerate(prompts)]
    assert min(hits) < 4 and max(hits) == 4                  # old ones went, new ones stay
    assert hits[-1] == 4
    for i, (p, h) in enumerate(zip(prompts, hits)):
        if h:
            assert w.retrieve(p, 0, h * CS, f"q{i}", world_size=1) == \
                [chunk_bytes(0, p, c, obj) for c in range(h)]
    w.close()
    sched.close()


def test_reaped_worker_writes_never_visible(start_server, monkeypatch):
    monkeypatch.setenv("LMCACHED_TEST_REAP_SCALE", "60")     # 30 s -> 0.5 s
    s = start_server("--chunk-size", str(CS), "--worker-reap-timeout-seconds", "30",
                     "--worker-registration-grace-seconds", "30")
    keeper = Worker(s, 1, 0, world_size=1)                   # keeps the layout alive
    dead = Worker(s, 2, 0, world_size=1)
    toks = prompt(9)
    ctx = dead.store(toks, 0, 64, commit=False)
    assert len(ctx["slots"]) == 4
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert unpack(keeper.d.call(PING, keeper.id)) is True
        time.sleep(0.1)
    k = dead.key(toks, 0, 64, "s")
    assert unpack(dead.d.call(COMMIT_STORE, k, dead.id, b"")) is False
    sched = s.dealer()
    assert lookup(sched, toks, "R", world_size=1) == 0
    again = Worker(s, 2, 0, world_size=1)                    # re-registration works
    assert again.reply["pool_size"] > 0
    assert len(again.store(toks, 0, 64)["slots"]) == 4
    assert lookup(sched, toks, "R2", world_size=1) == 4
    for w in (keeper, dead, again):
        w.close()
    sched.close()


def test_register_replies(start_server):
    s = start_server("--chunk-size", str(CS))
    d = s.dealer()
    r = d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, payload(5))
    name = msgpack.unpackb(r[2])["shm_name"]
    assert name.startswith("lmcache_l1_pool_")
    assert r[2].startswith(b"\x82\xa8shm_name")
    assert d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, payload(5))[2] == r[2]               # idempotent
    bad = [payload(6, group_layout_descs=[{"shapes": [[1]], "dtypes": ["float16"]}]),
           payload(6, enable_l1_kvweave_quant=True),
           payload(6, engine_group_infos=[{"engine_group_id": 0}, {"engine_group_id": 1}]),
           payload(6, dtype_str="complex64"),
           payload(6, hidden=16)]                           # conflicts with instance 5
    for p in bad:
        rep = unpack(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, p))
        assert rep["shm_name"] == "" and rep["pool_size"] == 0 and rep["error"]
    assert d.call(UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, 5) is not None
    assert d.call(UNREGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, 5) is not None                     # unknown: warning only
    d.close()
    p = start_server("--chunk-size", str(CS), "--shm-name", "")
    d = p.dealer()
    assert unpack(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, payload(5))) == {"shm_name": "", "pool_size": 0}
    d.close()
    q = start_server("--supported-transfer-mode", "lmcache_driven")
    d = q.dealer()
    assert d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, payload(5), timeout_ms=300) is None
    assert unpack(d.call(NOOP)) == "OK"
    d.close()


def test_spec_byte_examples(start_server):
    s = start_server("--chunk-size", "4")
    d = s.dealer()
    spec_key = bytes.fromhex(
        "8baa6d6f64656c5f6e616d65a16daa776f726c645f73697a6501"
        "a9776f726b65725f6964c0a9746f6b656e5f696473940102030"
        "4a573746172740 0a3656e6404aa726571756573745f6964a27231"
        "aa63616368655f73616c74a0af726571756573745f636f6e666967"
        "73c0ae6e756d5f6b765f7265616465727301af6e756c6c5f636875"
        "6e6b5f6d61736bc0".replace(" ", ""))
    d.uid = 0
    assert d.call(LOOKUP, raw=[spec_key, b"\x01"]) == [b"\x00", b"\x08"]
    assert d.call(QUERY_PREFETCH_STATUS, raw=[b"\xa2r1"]) == [b"\x01", b"\x09", b"\x00"]   # no layout: 0
    w = s.dealer()
    reg = payload(12345, world_size=1, hidden=1, layers=1)
    reg["block_size"] = 4
    assert unpack(w.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, reg))["pool_size"] > 0
    k = key([1, 2, 3, 4], 0, 4, "r1", worker_id=0, world_size=1)
    rep = w.call(PREPARE_STORE, k, 12345)[2]
    off = msgpack.unpackb(rep)["context"]["slots"][0]["offset"]
    expect = (b"\x81\xa7context\x82\xa5slots\x91\x84\xa6offset" + msgpack.packb(off) +
              b"\xa6length\x10\xa5shape\x94\x02\x01\x04\x01\xa5dtype\xa7float16"
              b"\xadchunk_indices\x91\x00")
    assert rep == expect
    assert w.call(COMMIT_STORE, k, 12345, b"")[2] == b"\xc3"
    d.uid = 0
    assert d.call(LOOKUP, raw=[spec_key, b"\x01"]) == [b"\x00", b"\x08"]
    assert d.call(QUERY_PREFETCH_STATUS, raw=[b"\xa2r1"]) == [b"\x01", b"\x09", b"\x01"]
    assert d.call(QUERY_PREFETCH_STATUS, raw=[b"\xa2r1"]) == [b"\x02", b"\x09", b"\x00"]
    miss = w.call(PREPARE_RETRIEVE, key([9, 9, 9, 9], 0, 4, "zz", worker_id=0, world_size=1), 12345)[2]
    assert miss == bytes.fromhex("83a773756363657373c2a464617461c400a7636f6e7465787480")
    d.close()
    w.close()


def retired_bytes(srv):
    body = urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/metrics", timeout=5).read()
    for line in body.decode().splitlines():
        if line.startswith("lmcache_mp_l1_retired_bytes "):
            return float(line.split()[1])
    raise AssertionError("no lmcache_mp_l1_retired_bytes in /metrics")


def test_clear_during_transfers_never_hands_out_memory_in_use(srv, pair):
    """A CLEAR (forced) while one worker is copying into its slots and another
    is copying out of its retrieve slots: the keys are gone at once, but no
    store that follows may be given those slots until the copies finish, so
    neither a late write nor a late read touches another prompt's chunks."""
    w0, w1 = pair
    sched = srv.dealer()
    old = prompt(11)
    w1.store(old, 0, 64)
    assert lookup(sched, old, "r-old", worker_id=None) in (0, 4)
    w0.store(old, 0, 64)
    assert lookup(sched, old, "r-old") == 4
    k_read = w1.key(old, 0, 64, "r-old")
    reading = unpack(w1.d.call(PREPARE_RETRIEVE, k_read, w1.id))
    assert reading["success"]
    new = prompt(12)
    k_write = w0.key(new, 0, 64, "w")
    writing = unpack(w0.d.call(PREPARE_STORE, k_write, w0.id))["context"]["slots"]
    assert sched.call(CLEAR) is not None                     # forced: drops everything
    assert lookup(sched, old, "r-after") == 0
    # 4 chunks being read + 4 being written, each OBJ rounded up to 4 KiB.
    assert retired_bytes(srv) == 8 * 4096
    busy = {s["offset"] for s in reading["context"]["slots"]} | {s["offset"] for s in writing}
    other = prompt(13)
    fresh = w1.store(other, 0, 64, rid="x")["slots"]
    assert len(fresh) == 4 and not busy & {s["offset"] for s in fresh}
    # The writer is given no second buffer of a key its cleared write holds:
    # its COMMIT_STORE could not tell which of the two it publishes.
    assert unpack(w0.d.call(PREPARE_STORE, k_write, w0.id))["context"]["chunk_indices"] == []
    # The late copies: the reader still sees the old chunks, the writer's
    # bytes land in its own slots, and the commit of a cleared write is void.
    got = [bytes(w1.pool[s["offset"]:s["offset"] + s["length"]]) for s in reading["context"]["slots"]]
    assert got == [chunk_bytes(1, old, c) for c in range(4)]
    assert unpack(w1.d.call(COMMIT_RETRIEVE, k_read, w1.id)) is True
    for s in writing:
        w0.pool[s["offset"]:s["offset"] + s["length"]] = b"\xee" * s["length"]
    assert unpack(w0.d.call(COMMIT_STORE, k_write, w0.id, b"")) is False  # processed, voided...
    assert retired_bytes(srv) == 0
    again = unpack(w0.d.call(PREPARE_STORE, k_write, w0.id))["context"]   # ...but not published
    assert again["chunk_indices"] == [0, 1, 2, 3]
    w0.store(other, 0, 64, rid="x")
    assert lookup(sched, other, "r-other") == 4
    assert w1.retrieve(other, 0, 64, "r-other") == [chunk_bytes(1, other, c) for c in range(4)]
    sched.close()


def assert_both_ranks_retrieve(pair, p, rid):
    for w in reversed(pair):
        assert w.retrieve(p, 0, 64, rid) == [chunk_bytes(w.rank, p, c) for c in range(4)]


def test_commit_retrieve_after_clear_leaves_the_new_copy_locked(srv, pair):
    """A retrieve in flight across a forced CLEAR, the prompt stored again
    and looked up by another request: the old retrieve's COMMIT_RETRIEVE
    gives its share back on the copy it read (now gone), not on the new
    copy, whose lookup share must still let its own retrieve run."""
    w0, w1 = pair
    sched = srv.dealer()
    p = prompt(21)
    for w in pair:
        w.store(p, 0, 64)
    assert lookup(sched, p, "r-old") == 4
    k_old = w1.key(p, 0, 64, "r-old")
    assert unpack(w1.d.call(PREPARE_RETRIEVE, k_old, w1.id))["success"]
    assert sched.call(CLEAR) is not None
    for w in pair:
        w.store(p, 0, 64, rid="again")
    assert lookup(sched, p, "r-new") == 4                  # one share per object
    assert unpack(w1.d.call(COMMIT_RETRIEVE, k_old, w1.id)) is True  # the old reader is done
    assert retired_bytes(srv) == 0
    assert_both_ranks_retrieve(pair, p, "r-new")
    sched.close()


def test_freeing_an_old_lookup_after_clear_spares_the_new_copy(srv, pair):
    """A lookup's locks freed after a forced CLEAR and a new store of the
    prompt: FREE_LOOKUP_LOCKS (and END_SESSION of an undelivered lookup) give
    nothing back, since the copies they locked are gone; the new copies,
    which may reuse the old offsets, keep the shares a newer lookup took."""
    sched = srv.dealer()
    p = prompt(22)
    for w in pair:
        w.store(p, 0, 64)
    assert lookup(sched, p, "r-old") == 4
    assert sched.call(LOOKUP, key(p, 0, 64, "r-undelivered"), 1) is not None
    assert sched.call(CLEAR) is not None
    for w in pair:
        w.store(p, 0, 64, rid="again")
    assert lookup(sched, p, "r-new") == 4                  # one share per object
    assert sched.call(FREE_LOOKUP_LOCKS, key(p, 0, 64, "r-old"), 1) is not None
    assert sched.call(END_SESSION, "r-undelivered") is not None    # its locks were never delivered
    assert retired_bytes(srv) == 0
    assert_both_ranks_retrieve(pair, p, "r-new")
    sched.close()


def l1_status(srv):
    body = urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/status", timeout=5).read()
    return json.loads(body)["storage_manager"]["l1_manager"]


def test_lease_ledger_settles_after_every_path(srv, pair):
    """Every lease the engine-driven path, the lookup and a forced CLEAR
    hand out comes back exactly once (docs/storage.md, "Leases"): nothing
    WRITE or COPY stays outstanding, nothing is given back twice, the books
    balance, and a retrieve in flight across a clear gives back the buffer
    the clear retired for it."""
    w0, w1 = pair
    sched = srv.dealer()
    p = prompt(31)
    for w in pair:
        w.store(p, 0, 64)
    assert lookup(sched, p, "r1") == 4
    assert_both_ranks_retrieve(pair, p, "r1")
    assert lookup(sched, p, "r2") == 4
    k = w1.key(p, 0, 64, "r2")
    assert unpack(w1.d.call(PREPARE_RETRIEVE, k, w1.id))["success"]
    st = l1_status(srv)["leases"]
    assert st["copy"]["outstanding"] == 4 and st["write"]["outstanding"] == 0, st
    assert sched.call(CLEAR) is not None
    assert unpack(w1.d.call(COMMIT_RETRIEVE, k, w1.id)) is True      # its copy is gone: stale
    l1 = l1_status(srv)
    st = l1["leases"]
    assert l1["is_healthy"] and l1["invariant_violations"] == 0, l1
    assert st["write"]["outstanding"] == 0 and st["copy"]["outstanding"] == 0, st
    assert st["write"]["granted"] == 8 and st["write"]["returned"] == 8, st
    assert st["copy"]["granted"] == 12 and st["copy"]["returned"] == 12, st
    assert st["returned_twice"] == 0 and st["returned_stale"] == 0, st
    assert l1["num_retired_buffers"] == 0
    sched.close()
