"""The serving side of P2P between cache servers (docs/p2p.md, "Serving
side"): ops 29-31 lease the leading run of L1 hits to a peer as {offset,
size} in the L1 arena, hand the result out once, keep the bytes in place
until unlocked or the lease's TTL passes, and refuse malformed input."""
import json
import os
import time
import urllib.request

import msgpack

from lmc.client import unpack
from lmc.keys import object_key
from lmc.ops import CLEAR, NOOP, P2P_LOOKUP_AND_LOCK, P2P_QUERY_LOOKUP_RESULTS, P2P_UNLOCK_OBJECTS
from lmc.server import l2_fs_args
from test_lookup_engine_driven import CS, HIDDEN, LAYERS, OBJ, Worker, chunk_bytes, prompt

RANK1 = (1 << 24) | (1 << 8)          # kv_rank of worker 0 of a world of 1
LAYOUT = {0: {"shapes": [[2, LAYERS, CS, HIDDEN]], "dtypes": ["float16"]}}
MISS = {"offset": -1, "size": 0}


def status(s):
    with urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/status", timeout=5) as r:
        return json.loads(r.read())["modules"]["p2p_serve"]


def metrics(s):
    with urllib.request.urlopen(f"http://127.0.0.1:{s.http_port}/metrics", timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {l.split()[0]: float(l.split()[1]) for l in lines
            if l.startswith("lmcache_mp_p2p_serve_")}


def stored_hashes(l2_dir, toks, n_chunks, timeout=20):
    """The chunk hashes of toks' chunks, in chunk order, read off the fs
    L2's file names (docs/l2.md) once the write-behind wrote them."""
    want = {chunk_bytes(0, toks, c): c for c in range(n_chunks)}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = {}
        for name in os.listdir(l2_dir):
            if not name.endswith(".data"):
                continue              # a file still being written
            with open(os.path.join(l2_dir, name), "rb") as f:
                data = f.read()
            for body, c in want.items():
                if body in data:
                    found[c] = bytes.fromhex(name.split("@")[3][:-len(".data")])
        if len(found) == n_chunks:
            return [found[c] for c in range(n_chunks)]
        time.sleep(0.1)
    raise AssertionError(f"the fs L2 holds {sorted(found)} of {n_chunks} chunks")


def store_prompt(s, l2_dir, seed, n_chunks=4):
    w = Worker(s, 2000 + seed, 0, world_size=1)
    toks = prompt(seed, n_chunks)
    w.store(toks, 0, n_chunks * CS)
    keys = [object_key(h, kv_rank=RANK1) for h in stored_hashes(l2_dir, toks, n_chunks)]
    return w, toks, keys


def lock(d, keys, layouts=LAYOUT):
    task = unpack(d.call(P2P_LOOKUP_AND_LOCK, keys, layouts))
    assert isinstance(task, int) and task > 0
    return task


def query(d, task):
    return unpack(d.call(P2P_QUERY_LOOKUP_RESULTS, task))


def test_lease_read_and_unlock(start_server, tmp_path):
    s = start_server("--chunk-size", str(CS), *l2_fs_args(tmp_path))
    w, toks, keys = store_prompt(s, tmp_path, 1)
    d = s.dealer()
    task = lock(d, keys)
    frames = d.call(P2P_QUERY_LOOKUP_RESULTS, task)
    # A list of TransferChannelAddress maps {offset, size}, in that order.
    assert frames[2][:9] == b"\x94\x82\xa6offset"
    addrs = msgpack.unpackb(frames[2])
    assert [a["size"] for a in addrs] == [OBJ] * 4
    for c, a in enumerate(addrs):
        assert 0 <= a["offset"] and a["offset"] + OBJ <= len(w.pool)
        assert w.pool[a["offset"]:a["offset"] + OBJ] == chunk_bytes(0, toks, c)
    assert query(d, task) is None                      # handed out once
    st = status(s)
    assert st["leases_held"] == 4 and st["leased_bytes"] == 4 * OBJ
    assert st["results_handed_out"] == 1 and st["tasks_pending"] == 0
    m = metrics(s)
    assert m["lmcache_mp_p2p_serve_leases"] == 4 and m["lmcache_mp_p2p_serve_results_total"] == 1
    assert m["lmcache_mp_p2p_serve_leased_objects_total"] == 4

    # A plain CLEAR skips leased objects; a second peer leases the same ones.
    assert d.call(CLEAR, False) is not None
    assert query(d, lock(d, keys)) == addrs
    assert d.call(P2P_UNLOCK_OBJECTS, keys) is not None
    assert status(s)["leases_held"] == 4
    # A forced CLEAR unlinks the keys, but the leased bytes stay in place:
    # a store after it gets other memory.
    assert d.call(CLEAR, True) is not None
    w.store(prompt(9), 0, 4 * CS)
    for c, a in enumerate(addrs):
        assert w.pool[a["offset"]:a["offset"] + OBJ] == chunk_bytes(0, toks, c)
    assert query(d, lock(d, keys)) == [MISS] * 4
    assert d.call(P2P_UNLOCK_OBJECTS, keys) is not None
    assert d.call(P2P_UNLOCK_OBJECTS, keys) is not None  # nothing left: ignored
    st = status(s)
    assert st["leases_held"] == 0 and st["unlocks"] == 8 and st["lease_expirations"] == 0
    m = metrics(s)
    assert m["lmcache_mp_p2p_serve_leases"] == 0 and m["lmcache_mp_p2p_serve_unlocked_objects_total"] == 8
    assert unpack(d.call(NOOP)) == "OK"
    w.close()
    d.close()


def test_prefix_misses_and_layouts(start_server, tmp_path):
    s = start_server("--chunk-size", str(CS), *l2_fs_args(tmp_path))
    w, toks, keys = store_prompt(s, tmp_path, 2)
    d = s.dealer()
    absent = object_key(b"\x01" * 32, kv_rank=RANK1)
    got = query(d, lock(d, [keys[0], keys[1], absent, keys[3]]))
    assert [a["size"] for a in got] == [OBJ, OBJ, 0, 0]       # the leading run only
    assert got[2:] == [MISS, MISS]
    assert status(s)["leases_held"] == 2
    assert query(d, lock(d, [dict(keys[0], model_name="other")])) == [MISS]
    assert query(d, lock(d, [dict(keys[0], cache_salt="tenant")])) == [MISS]
    assert query(d, lock(d, [dict(keys[0], kv_rank=0)])) == [MISS]
    assert query(d, lock(d, [])) == []
    # A layout of another size, or naming no group 0, is a miss; None reads any size.
    f32 = {0: {"shapes": [[2, LAYERS, CS, HIDDEN]], "dtypes": ["float32"]}}
    assert query(d, lock(d, keys[:1], f32)) == [MISS]
    assert query(d, lock(d, keys[:1], {1: LAYOUT[0]})) == [MISS]
    torch_names = {0: {"shapes": [[2, LAYERS, CS, HIDDEN]], "dtypes": ["torch.float16"]}}
    assert query(d, lock(d, keys[:1], torch_names))[0]["size"] == OBJ
    assert query(d, lock(d, keys[:1], None))[0]["size"] == OBJ
    assert status(s)["leases_held"] == 4
    assert d.call(P2P_UNLOCK_OBJECTS, keys + [absent]) is not None
    assert d.call(P2P_UNLOCK_OBJECTS, keys[:1] * 2) is not None
    assert status(s)["leases_held"] == 0
    # Left held: the server gives it back at shutdown and exits 0 (finish()).
    assert query(d, lock(d, keys[:1]))[0]["size"] == OBJ
    w.close()
    d.close()


def test_a_peer_unlocks_only_its_own_leases(start_server, tmp_path):
    s = start_server("--chunk-size", str(CS), *l2_fs_args(tmp_path))
    w, toks, keys = store_prompt(s, tmp_path, 4, n_chunks=2)
    a, b = s.dealer(), s.dealer()             # two peers, two connections
    assert len(query(a, lock(a, keys))) == 2
    for _ in range(3):                         # b never leased: nothing to give back
        assert b.call(P2P_UNLOCK_OBJECTS, keys) is not None
    st = status(s)
    assert st["leases_held"] == 2 and st["unlocks"] == 0
    assert query(b, lock(b, keys[:1]))[0]["size"] == OBJ
    assert a.call(P2P_UNLOCK_OBJECTS, keys) is not None
    assert a.call(P2P_UNLOCK_OBJECTS, keys) is not None   # b's lease stays
    assert status(s)["leases_held"] == 1
    assert b.call(P2P_UNLOCK_OBJECTS, keys) is not None
    assert status(s)["leases_held"] == 0
    w.close()
    a.close()
    b.close()


def test_leases_and_results_lapse_after_the_read_ttl(start_server, tmp_path):
    s = start_server("--chunk-size", str(CS), "--l1-read-ttl-seconds", "1",
                     *l2_fs_args(tmp_path))
    w, toks, keys = store_prompt(s, tmp_path, 3)
    d = s.dealer()
    consumed = lock(d, keys)
    assert len(query(d, consumed)) == 4
    unqueried = lock(d, keys[:2])
    st = status(s)
    assert st["leases_held"] == 6 and st["tasks_pending"] == 1
    time.sleep(1.5)
    st = status(s)
    assert st["leases_held"] == 0 and st["lease_expirations"] == 6
    assert st["tasks_pending"] == 0 and st["tasks_expired"] == 1
    m = metrics(s)
    assert m["lmcache_mp_p2p_serve_expired_leases_total"] == 6
    assert m["lmcache_mp_p2p_serve_dropped_tasks_total"] == 1
    assert query(d, unqueried) is None
    # Nothing holds them any more: a plain CLEAR frees them.
    assert d.call(CLEAR, False) is not None
    assert query(d, lock(d, keys)) == [MISS] * 4
    w.close()
    d.close()


def error_of(frames):
    assert frames is not None and frames[2] == b"LMCACHE_RPC_ERROR_V1", frames
    return msgpack.unpackb(frames[3])


def test_malformed_requests_are_refused(start_server):
    s = start_server("--chunk-size", str(CS), "--rpc-error-frames")
    d = s.dealer()
    good = object_key(b"\x02" * 32, kv_rank=RANK1)
    bad_requests = [
        (P2P_LOOKUP_AND_LOCK, ("not a list", LAYOUT), "keys must be a list"),
        (P2P_LOOKUP_AND_LOCK, ([1], LAYOUT), "keys[0]: an ObjectKey must be a map"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, chunk_hash="ab")], None), "chunk_hash"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, chunk_hash=b"")], None), "chunk_hash"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, chunk_hash=b"x" * 33)], None), "chunk_hash"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, kv_rank=True)], None), "kv_rank"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, kv_rank=1 << 32)], None), "kv_rank"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, object_group_id=-1)], None), "object_group_id"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, model_name="a@b")], None), "model_name"),
        (P2P_LOOKUP_AND_LOCK, ([dict(good, cache_salt="a/b")], None), "cache_salt"),
        (P2P_LOOKUP_AND_LOCK, ([good] * 16385, None), "at most 16384"),
        (P2P_LOOKUP_AND_LOCK, ([good], [1]), "group_layout_descs"),
        (P2P_LOOKUP_AND_LOCK, ([good], {0: {"shapes": [[2]], "dtypes": []}}), "MemoryLayoutDesc"),
        (P2P_LOOKUP_AND_LOCK, ([good], {0: {"shapes": [[1 << 62, 8]], "dtypes": ["float16"]}}),
         "fits 64 bits"),
        (P2P_LOOKUP_AND_LOCK, ([good], {0: {"shapes": [[2]], "dtypes": ["complex128"]}}),
         "supported dtype"),
        (P2P_LOOKUP_AND_LOCK, ([good], {"0": LAYOUT[0]}), "keys must be ints"),
        (P2P_QUERY_LOOKUP_RESULTS, ("1",), "task_id must be an int"),
        (P2P_QUERY_LOOKUP_RESULTS, (True,), "task_id must be an int"),
        (P2P_QUERY_LOOKUP_RESULTS, (), "task_id must be an int"),
        (P2P_UNLOCK_OBJECTS, ({"chunk_hash": b"x"},), "keys must be a list"),
        (P2P_UNLOCK_OBJECTS, ([dict(good, kv_rank="0")],), "keys[0]: kv_rank"),
    ]
    for op, args, why in bad_requests:
        err = error_of(d.call(op, *args))
        assert err["error_type"] == "ValidationError" and why in err["message"], (args, err)
    # Unknown, negative and huge task ids are no results, not errors.
    for task in (12345, -1, 0, (1 << 64) - 1):
        assert query(d, task) is None
    assert query(d, lock(d, [good])) == [MISS]
    st = status(s)
    assert st["lookups"] == 1 and st["leases_held"] == 0 and st["tasks_pending"] == 0
    assert unpack(d.call(NOOP)) == "OK" and s.alive()
    d.close()


def test_unqueried_results_are_bounded(start_server):
    s = start_server("--chunk-size", str(CS))
    d = s.dealer()
    absent = [object_key(b"\x03" * 32, kv_rank=RANK1)]
    first = lock(d, absent)
    for _ in range(1024):                  # the table holds 1024 results
        last = lock(d, absent)
    assert query(d, first) is None         # the oldest made room
    assert query(d, last) == [MISS]
    st = status(s)
    assert st["tasks_dropped"] == 1 and st["tasks_pending"] == 1023
    assert st["max_tasks"] == 1024 and st["max_result_addresses"] == 1 << 20
    d.close()


def test_an_unqueried_result_gives_its_leases_back(start_server, tmp_path):
    """A result dropped before anyone queried it (here: for room) names
    leases no peer learnt of, so none would unlock them: they go back at
    once, not at the read-lock TTL (docs/p2p.md, "Bounds")."""
    s = start_server("--chunk-size", str(CS), *l2_fs_args(tmp_path))
    w, toks, keys = store_prompt(s, tmp_path, 5, n_chunks=2)
    d = s.dealer()
    first = lock(d, keys)                  # two leases, never queried
    other = s.dealer()
    kept = lock(other, keys[:1])           # another peer's lease on the same object
    absent = [object_key(b"\x03" * 32, kv_rank=RANK1)]
    for _ in range(1023):                  # the table holds 1024 results
        lock(d, absent)
    assert query(d, first) is None         # dropped for room
    st = status(s)
    assert st["abandoned_leases_returned"] == 2
    assert st["leases_held"] == 1          # the other peer's stays
    assert st["result_life_ms"] == 60000
    got = query(other, kept)               # the other peer's result is whole
    assert len(got) == 1 and got[0]["size"] == OBJ
    d.close()
    other.close()
    w.close()
