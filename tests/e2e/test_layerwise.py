"""Layerwise retrieve over CPU shared tensors (docs/protocol.md,
"RETRIEVE_LAYERWISE"): REGISTER_LAYERWISE_IPC_EVENT_POOL answers the batch
setting and one event handle per layer; RETRIEVE_LAYERWISE streams one reply
per batch of layers, in layer order, each sent once its layers are in the
engine's blocks, then a final one.  Failed and abandoned retrieves give
every lease back, and a client that stops reading holds up nobody."""
import os
import struct
import time
import urllib.request

import msgpack
import pytest
import zmq

from lmc.client import unpack
from lmc.ops import NOOP, REGISTER_KV_CACHE, STORE, UNREGISTER_KV_CACHE
from lmc.server import run_lmcached
from paged_kv import PagedKV
from test_server_driven import (CS, ZEROS, Engine, chunk_rows, info, key, lookup, prompt,
                                status, until)

SERVER_ARGS = ("--chunk-size", str(CS))      # srv's (conftest.py)
POOL = "register_layerwise_ipc_event_pool"
RETRIEVE_LW = "retrieve_layerwise"


def lw_status(srv):
    st = status(srv)["modules"]["lmcache_driven_transfer"]
    return st["layerwise_retrieves_ok"], st["layerwise_retrieves_failed"]


def finished_retrieves(srv):
    """lmcache_mp_num_finished_retrieves_total: the RETRIEVE_END events."""
    url = f"http://127.0.0.1:{srv.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        lines = r.read().decode().splitlines()
    return sum(float(l.split()[-1]) for l in lines
               if l.startswith("lmcache_mp_num_finished_retrieves_total"))


def copy_leases(srv):
    return status(srv)["storage_manager"]["l1_manager"]["leases"]["copy"]["outstanding"]


def retrieve_lw(e, tokens, start, end, blocks, rid, on_frame=None, skip=0):
    """Sends RETRIEVE_LAYERWISE and reads its replies up to the final one:
    the decoded batch frames (first, count, pool index[, indices]) and the
    final [payload, is_final, ok].  on_frame(frame) runs as each batch's
    reply arrives, before the next one is read."""
    uid = e.d.send(RETRIEVE_LW, key(tokens, start, end, rid, model=e.model), e.id, blocks,
                   ZEROS, skip)
    batches = []
    while True:
        frames = e.d.recv(5000)
        assert frames is not None, "no final reply"
        assert msgpack.unpackb(frames[0]) == uid
        assert msgpack.unpackb(frames[1]) == RETRIEVE_LW     # the op, echoed
        payload, final, ok = unpack(frames)
        if final:
            return batches, [payload, final, ok]
        assert ok is False and len(payload) >= 12
        n = len(payload) // 4
        frame = struct.unpack(f"<{n}i", payload)
        if on_frame:
            on_frame(frame)
        batches.append(frame)


@pytest.mark.parametrize("how", ["flag", "env", "split"])
def test_replies_arrive_per_layer_batch_in_order(start_server, how):
    """`split`: each batch's copy is cut into pieces for two copy workers
    (docs/protocol.md, "One request across the copy workers")."""
    split = ("--max-gpu-workers", "2", "--copy-split-bytes", "1") if how == "split" else ()
    s = (start_server("--chunk-size", str(CS), "--cpu-kv-layout", "hint",
                      "--layerwise-batch", "2", *split) if how != "env" else
         start_server("--chunk-size", str(CS), "--cpu-kv-layout", "hint",
                      env={"LMCACHE_MP_LAYERWISE_BATCH": "2"}))
    g = PagedKV("lw", "fa_nhd", nl=5, nb=16, bs=16, nh=2, hs=8)
    e = Engine(s, 71, [g])
    assert unpack(e.d.call(POOL, 71)) == [2, [ZEROS] * 5]
    toks = prompt(21)
    src, dst = list(range(1, 7)), [13, 8, 9, 10, 11, 12]
    assert e.store(toks, 0, 3 * CS, [src]) == [ZEROS, True]
    assert lookup(s, toks, "r") == 3

    def landed(frame):
        # Every layer a reply names is already in the blocks when it arrives.
        first, count, pool = frame
        for layer in range(first, first + count):
            for c in range(3):
                want = chunk_rows(g, src, c)
                got = chunk_rows(g, dst, c)
                per = len(want) // (2 * g.nl)
                for kv in range(2):
                    at = (kv * g.nl + layer) * per
                    assert got[at:at + per] == want[at:at + per], (frame, layer, c, kv)

    batches, final = retrieve_lw(e, toks, 0, 3 * CS, [dst], "r", on_frame=landed)
    assert batches == [(0, 2, 0), (2, 2, 2), (4, 1, 4)]
    assert final == [b"", True, True]
    for c in range(3):
        assert chunk_rows(g, dst, c) == chunk_rows(g, src, c)
    assert copy_leases(s) == 0
    assert lw_status(s) == (1, 0)
    assert finished_retrieves(s) == 1          # its RETRIEVE_START / END events
    split_copies = status(s)["modules"]["lmcache_driven_transfer"]["split_copies"]
    assert split_copies == (1 + 3 if split else 0)   # the STORE, then each batch
    e.close()


def test_layers_of_separate_groups_name_their_indices(start_server):
    """Two engine groups whose layers interleave: each object group's
    batches follow the registration index, and a batch whose indices are
    not consecutive lists them (first field -1)."""
    s = start_server("--chunk-size", str(CS), "--cpu-kv-layout", "hint", "--layerwise-batch", "2")
    g = PagedKV("lwa", "fa_nhd", nl=4, nb=16, bs=16, nh=2, hs=8)
    e = Engine(s, 72, [g], infos=[info(0, [0, 2], 16), info(1, [1, 3], 16, sw=CS)])
    toks = prompt(22)
    src, dst = [[1, 2, 3, 4]] * 2, [[5, 6, 7, 8]] * 2
    assert e.store(toks, 0, 2 * CS, src) == [ZEROS, True]
    assert lookup(s, toks, "r") == 2
    batches, final = retrieve_lw(e, toks, 0, 2 * CS, dst, "r")
    assert final == [b"", True, True]
    assert batches == [(-1, 2, 0, 0, 2), (-1, 2, 1, 1, 3)]
    # The window's object group holds the last chunk only.
    assert chunk_rows(g, dst[0], 1) == chunk_rows(g, src[0], 1)
    e.close()


def test_failed_and_abandoned_retrieves_leave_no_lease(start_server):
    s = start_server("--chunk-size", str(CS), "--cpu-kv-layout", "hint", "--layerwise-batch", "1")
    g = PagedKV("lwf", "fa_nhd", nl=4, nb=16, bs=16, nh=2, hs=8)
    e = Engine(s, 73, [g])
    toks = prompt(23)
    assert e.store(toks, 0, 2 * CS, [[1, 2, 3, 4]]) == [ZEROS, True]
    # Never looked up: nothing to read, only the final reply.
    assert retrieve_lw(e, toks, 0, 2 * CS, [[5, 6, 7, 8]], "none") == ([], [b"", True, False])
    # One chunk of three is missing: nothing is copied or announced.
    assert lookup(s, toks, "r2") == 2
    assert retrieve_lw(e, toks, 0, 3 * CS, [[5, 6, 7, 8, 9, 10]], "r2") == \
        ([], [b"", True, False])
    # Out-of-range blocks, and an unknown instance.
    assert lookup(s, toks, "r3") == 2
    assert retrieve_lw(e, toks, 0, 2 * CS, [[5, 6, 7, 99]], "r3") == ([], [b"", True, False])
    d = s.dealer()
    d.send(RETRIEVE_LW, key(toks, 0, CS, "r4"), 999, [[1, 2]], ZEROS, 0)
    assert unpack(d.recv(5000)) == [b"", True, False]
    assert copy_leases(s) == 0
    # A worker that goes away after the first batch's reply.
    assert lookup(s, toks, "r5") == 2
    gone = s.dealer()
    gone.send(RETRIEVE_LW, key(toks, 0, 2 * CS, "r5"), 73, [[5, 6, 7, 8]], ZEROS, 0)
    assert unpack(gone.recv(5000))[1] is False
    gone.close()
    deadline = time.monotonic() + 5
    while lw_status(s)[0] < 1 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lw_status(s) == (1, 4)
    assert copy_leases(s) == 0
    assert chunk_rows(g, [5, 6, 7, 8], 1) == chunk_rows(g, [1, 2, 3, 4], 1)
    d.close()
    e.close()


def test_layerwise_off_answers_zero_and_refuses(hint_srv):
    """Without --layerwise-batch the pool says 0 (an upstream worker then
    sends plain RETRIEVE) and RETRIEVE_LAYERWISE gets its final reply."""
    g = PagedKV("lwo", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(hint_srv, 74, [g])
    assert unpack(e.d.call(POOL, 74)) == [0, []]
    assert unpack(e.d.call(POOL, 999)) == [0, []]
    toks = prompt(24)
    assert e.store(toks, 0, CS, [[1, 2]]) == [ZEROS, True]
    assert lookup(hint_srv, toks, "r") == 1
    assert retrieve_lw(e, toks, 0, CS, [[3, 4]], "r") == ([], [b"", True, False])
    assert "layerwise retrieve is off (--layerwise-batch 0" in hint_srv.output()
    e.close()


def test_a_client_that_stops_reading_blocks_nobody(start_server):
    """One GPU worker thread.  A client sends layerwise retrieves of many
    one-layer batches and reads none of the replies: every one of them is
    served anyway, and another client's requests are answered meanwhile."""
    s = start_server("--chunk-size", str(CS), "--cpu-kv-layout", "hint", "--layerwise-batch", "1",
                     "--max-gpu-workers", "1")
    g = PagedKV("lws", "fa_nhd", nl=64, nb=16, bs=16, nh=1, hs=8)
    e = Engine(s, 75, [g])
    toks = prompt(25)
    assert e.store(toks, 0, CS, [[1, 2]]) == [ZEROS, True]
    stalled = s.dealer(routing_id=b"stalled")
    stalled.sock.setsockopt(zmq.RCVHWM, 1)
    n = 40
    for i in range(n):
        assert lookup(s, toks, f"s{i}") == 1
        stalled.send(RETRIEVE_LW, key(toks, 0, CS, f"s{i}"), 75, [[3, 4]], ZEROS, 0)
    other = s.dealer(routing_id=b"other")
    t0 = time.monotonic()
    assert other.call(NOOP, timeout_ms=3000)[2] == msgpack.packb("OK")
    assert lookup(s, toks, "o") == 1
    assert retrieve_lw(e, toks, 0, CS, [[5, 6]], "o")[1] == [b"", True, True]
    assert time.monotonic() - t0 < 3
    deadline = time.monotonic() + 10
    while lw_status(s)[0] < n + 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lw_status(s) == (n + 1, 0)        # served though never read
    assert copy_leases(s) == 0
    stalled.close()
    other.close()
    e.close()


@pytest.mark.parametrize("args,env", [
    (["--layerwise-batch", "-1"], None),
    (["--layerwise-batch", "4097"], None),
    ([], {"LMCACHE_MP_LAYERWISE_BATCH": "two"}),
    ([], {"LMCACHE_MP_LAYERWISE_BATCH": "-3"}),
])
def test_bad_batch_settings_are_refused_naming_them(args, env):
    r = run_lmcached(*args, env=env)
    assert r.returncode == 2, r.stderr
    assert "layerwise-batch" in r.stderr or "LMCACHE_MP_LAYERWISE_BATCH" in r.stderr, r.stderr


def test_cuda_contexts_stream_batches_with_pool_events(start_server):
    """The CUDA path on the CPU stand-in of liblmcached_cuda.so
    (tests/cuda_emul): the pool reply carries the stream's exported
    events, one per layer; each batch's copies are enqueued and its pool
    event recorded before its reply; the leases go back once the stream
    has passed the copies."""
    from test_server_driven_cuda_emul import copies_settled, cuda_handles, server_env
    s = start_server("--chunk-size", str(CS), "--layerwise-batch", "2", env=server_env())
    g = PagedKV("lwcu", "fa_nhd", nl=3, nb=16, bs=16, nh=2, hs=8)
    d = s.dealer()
    frames = d.call(REGISTER_KV_CACHE, 91, cuda_handles(g), "m", 1, "vllm",
                    {"kv_layout": "NHD"}, [])
    assert frames is not None and len(frames) == 2, s.output()
    batch, handles = unpack(d.call(POOL, 91))
    assert batch == 2 and len(handles) == 3
    assert [h[:8] for h in handles] == [b"emulpool"] * 3
    assert [struct.unpack("<I", h[8:12])[0] for h in handles] == [0, 1, 2]
    assert unpack(d.call(POOL, 91)) == [2, handles]            # the same pool again
    toks = prompt(26)
    src, dst = [1, 2, 3, 4], [9, 10, 11, 12]
    assert unpack(d.call(STORE, key(toks, 0, 2 * CS, "s"), 91, [src], b""))[1] is True
    assert until(lambda: lookup(s, toks, f"p{time.monotonic()}", end=2 * CS) == 2)
    assert lookup(s, toks, "r", end=2 * CS) == 2
    d.send(RETRIEVE_LW, key(toks, 0, 2 * CS, "r"), 91, [dst], os.urandom(64), 0)
    replies = []
    while not replies or not replies[-1][1]:
        r = d.recv(5000)
        assert r is not None, s.output()
        replies.append(unpack(r))
    assert [struct.unpack(f"<{len(p) // 4}i", p) for p, _, _ in replies[:-1]] == \
        [(0, 2, 0), (2, 1, 2)]
    assert replies[-1] == [b"", True, True]
    assert until(lambda: copies_settled(s))
    for c in range(2):
        assert chunk_rows(g, dst, c) == chunk_rows(g, src, c)
    assert len(d.call(UNREGISTER_KV_CACHE, 91)) == 2
    d.close()
    g.close()
