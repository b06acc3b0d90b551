"""Server-driven ("lmcache_driven") transfer over CPU shared tensors
(docs/protocol.md, "Server-driven transfer ops"): an engine registers its
paged KV tensors with pickles byte-identical to upstream's wrappers, STOREs
chunks from some blocks, a scheduler LOOKUPs them, and RETRIEVE writes them
into other blocks, compared row by row.  Also: sharing chunk objects with
the engine-driven path both ways, several engine groups, sliding windows,
skip_first_n_tokens, null blocks, every failure's reply, and hostile
pickles that are never run."""
import functools
import hashlib
import json
import mmap
import os
import sys
import time
import urllib.error
import urllib.request

import msgpack
import pytest

from lmc.client import lookup as lmc_lookup
from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.server import run_lmcached
from lmc.ops import (CLEAR, COMMIT_RETRIEVE, COMMIT_STORE, LOOKUP, NOOP, PING, PREPARE_RETRIEVE,
                     PREPARE_STORE, QUERY_PREFETCH_STATUS,
                     REGISTER_KV_CACHE, REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, RETRIEVE, STORE,
                     UNREGISTER_KV_CACHE, WAIT_PREFETCH_STATUS)
from paged_kv import PagedKV, Tensor

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pickles"))
import gen_vectors  # noqa: E402
import wrappers as w  # noqa: E402

ZEROS = b"\0" * 64
CS = 32
SERVER_ARGS = ("--chunk-size", str(CS))      # srv and hint_srv's (conftest.py)

# This module's keys: rank 0 of a world of one; its lookups open their own
# DEALER on the server they are given.
key = functools.partial(ipc_key, worker_id=0)
lookup = functools.partial(lmc_lookup, cs=CS)


def ext(data):
    return msgpack.ExtType(1, data)


def prompt(seed, n_chunks=3, cs=CS):
    return [(seed * 7919 + i * 31) % 50000 for i in range(n_chunks * cs)]


def until(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.01)
    return pred()


def wait_for_log(srv, text, timeout=5.0):
    return until(lambda: text in srv.output(), timeout)


def status(srv):
    url = f"http://127.0.0.1:{srv.http_port}/status"
    with urllib.request.urlopen(url, timeout=5) as r:
        return json.load(r)


def metrics(srv):
    url = f"http://127.0.0.1:{srv.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        lines = r.read().decode().splitlines()
    return {l.split()[0]: float(l.split()[1]) for l in lines
            if l.startswith("lmcache_mp_server_driven")}


class Engine:
    """One worker: its paged KV groups, registered with the server."""

    def __init__(self, srv, instance, groups, hints=None, infos=None, model="m",
                 engine="vllm", expect_registered=True, descriptors=False):
        self.srv, self.id, self.groups, self.model = srv, instance, groups, model
        self.d = srv.dealer()
        handles = [h for g in groups for h in g.handles(descriptor=descriptors)]
        frames = self.d.call(REGISTER_KV_CACHE, instance, handles, model, 1, engine,
                             hints if hints is not None else {"kv_layout": "NHD"},
                             infos or [], timeout_ms=3000 if expect_registered else 500)
        if expect_registered:
            assert frames is not None and len(frames) == 2, srv.output()   # void
        else:
            assert frames is None

    def store(self, tokens, start, end, blocks, rid="s"):
        return unpack(self.d.call(STORE, key(tokens, start, end, rid, model=self.model),
                                  self.id, blocks, ZEROS))

    def retrieve(self, tokens, start, end, blocks, rid, skip=None):
        args = [key(tokens, start, end, rid, model=self.model), self.id, blocks, ZEROS]
        if skip is not None:
            args.append(skip)
        return unpack(self.d.call(RETRIEVE, *args))

    def close(self, unregister=True):
        if unregister:
            assert len(self.d.call(UNREGISTER_KV_CACHE, self.id)) == 2
        self.d.close()
        for g in self.groups:
            g.close()


def chunk_rows(g, blocks, chunk, cs=CS):
    """The rows chunk `chunk` of group g occupies over the given block list."""
    per = cs // g.bs
    return g.rows(blocks[chunk * per:(chunk + 1) * per], cs)


# ---- round trips ---------------------------------------------------------

def round_trip(srv, g, e):
    """STORE three chunks from blocks 1-6, LOOKUP, RETRIEVE them into other
    blocks (out of order), compare row by row; block 15 stays untouched.
    Then an engine-driven worker of the same model reads the very objects:
    their bytes are the [kv, layers, chunk, heads x head size] layout."""
    toks = prompt(1)
    src, dst = list(range(1, 7)), [13, 8, 9, 10, 11, 12]
    untouched = g.block_bytes(15)
    assert e.store(toks, 0, 3 * CS, [src]) == [ZEROS, True]
    assert lookup(srv, toks, "r") == 3
    assert e.retrieve(toks, 0, 3 * CS, [dst], "r", skip=0) == [ZEROS, True]
    for c in range(3):
        assert chunk_rows(g, dst, c) == chunk_rows(g, src, c), (g.fmt, c)
    assert g.block_bytes(15) == untouched
    ed = EdWorker(srv, e.id + 1000, layers=g.nl, hidden=g.nh * g.row_elems,
                  use_mla=g.kv_size == 1)
    assert lookup(srv, toks, "r-ed") == 3
    assert ed.retrieve(toks, 0, 3 * CS, "r-ed") == \
        [b"".join(chunk_rows(g, src, c)) for c in range(3)]
    ed.close()
    e.close()


FORMAT_HINTS = [("fa_nhd", "NHD"), ("fa_hnd", "HND"), ("fi_nhd", "NHD"), ("fi_hnd", "HND"),
                ("mla", "NHD"), ("fused_nhd", "LBNHC"), ("fused_hnd", "LBHNC"), ("cross", "NHD")]


@pytest.mark.parametrize("fmt,hint", FORMAT_HINTS)
def test_every_vllm_format_round_trips(hint_srv, fmt, hint):
    g = PagedKV(fmt, fmt, nl=3, nb=16, bs=16, nh=2, hs=8, pad=24 if fmt == "mla" else 0)
    round_trip(hint_srv, g, Engine(hint_srv, 11, [g], hints={"kv_layout": hint}))


@pytest.mark.parametrize("fmt,hint", [("fa_nhd", "NHD"), ("fused_hnd", "LBHNC"), ("mla", "NHD")])
def test_descriptor_handles_round_trip(hint_srv, fmt, hint):
    """lmcache 0.5.6 and later send msgpack descriptors, not pickles
    (docs/protocol.md, "Descriptors"): the same registrations, the same
    round trips."""
    g = PagedKV(fmt + "_d", fmt, nl=3, nb=16, bs=16, nh=2, hs=8, pad=24 if fmt == "mla" else 0)
    e = Engine(hint_srv, 45, [g], hints={"kv_layout": hint}, descriptors=True)
    round_trip(hint_srv, g, e)
    g.close()


def test_block_ids_past_the_chunks_are_ignored(hint_srv):
    """vLLM's adapter sends the blocks of the request's partial last chunk
    along; upstream ignores them, and so does lmcached."""
    g = PagedKV("extra", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(hint_srv, 46, [g])
    toks = prompt(12)
    src, dst = list(range(1, 8)), list(range(8, 15))
    assert e.store(toks, 0, 3 * CS, [src]) == [ZEROS, True]
    assert lookup(hint_srv, toks, "r") == 3
    extra = g.block_bytes(14)
    assert e.retrieve(toks, 0, 3 * CS, [dst], "r", skip=0) == [ZEROS, True]
    for c in range(3):
        assert chunk_rows(g, dst, c) == chunk_rows(g, src, c)
    assert g.block_bytes(14) == extra
    assert e.store(toks, 0, 3 * CS, [src[:5]]) == [ZEROS, False]   # still too few
    e.close()


@pytest.mark.parametrize("fmt,engine,hints", [
    ("sglang_kv", "sglang", {"tokens_per_block": 16, "kv_list_layout": "k_v"}),
    ("sglang_kv", "sglang", {"tokens_per_block": 16}),              # older adapters
    ("sglang_mla", "sglang", {"tokens_per_block": 16}),
    ("trt4", "trtllm", {"kv_layout": "HND", "num_kv_heads": 2, "tokens_per_block": 16,
                        "head_dim": 8}),
    ("trt6", "trtllm", {"kv_layout": "HND"}),
])
def test_sglang_and_trtllm_formats_round_trip(srv, fmt, engine, hints):
    g = PagedKV(fmt, fmt, nl=3, nb=16, bs=16, nh=2, hs=8)
    round_trip(srv, g, Engine(srv, 13, [g], hints=hints, engine=engine))


# ---- one request across the copy workers (docs/architecture.md) ----------

SPLIT_ARGS = ("--max-gpu-workers", "2", "--copy-split-bytes", "1")


def sd_status(srv):
    return status(srv)["modules"]["lmcache_driven_transfer"]


@pytest.fixture
def split_srv(start_server):
    """Two copy workers, and every copy of two chunks or more split."""
    return start_server(*SERVER_ARGS, "--cpu-kv-layout", "hint", *SPLIT_ARGS)


@pytest.mark.parametrize("fmt,engine,hints", [
    *((fmt, "vllm", {"kv_layout": hint}) for fmt, hint in FORMAT_HINTS),
    ("sglang_kv", "sglang", {"tokens_per_block": 16, "kv_list_layout": "k_v"}),
    ("sglang_mla", "sglang", {"tokens_per_block": 16}),
    ("trt4", "trtllm", {"kv_layout": "HND", "num_kv_heads": 2, "tokens_per_block": 16,
                        "head_dim": 8}),
    ("trt6", "trtllm", {"kv_layout": "HND"}),
])
def test_a_copy_split_across_the_workers_round_trips(split_srv, fmt, engine, hints):
    """--copy-split-bytes 1 cuts every STORE and RETRIEVE of three chunks
    into three pieces: the same bytes land, block 15 stays untouched, and
    the engine-driven path reads the very objects (round_trip)."""
    g = PagedKV("split_" + fmt, fmt, nl=3, nb=16, bs=16, nh=2, hs=8,
                pad=24 if fmt == "mla" else 0)
    before = sd_status(split_srv)["split_copies"]
    round_trip(split_srv, g, Engine(split_srv, 14, [g], hints=hints, engine=engine))
    assert sd_status(split_srv)["split_copies"] - before == 2   # the STORE and the RETRIEVE


def test_three_engine_groups_split_across_the_workers(start_server):
    """Several object groups (a sliding window kept apart): each group's
    RETRIEVE and the STORE of all of them, split, round trip."""
    s = start_server("--chunk-size", "64", "--cpu-kv-layout", "hint", *SPLIT_ARGS)
    three_engine_groups_round_trip(s, True)
    assert sd_status(s)["split_copies"] >= 2


def test_the_idle_worker_takes_pieces_of_a_large_copy(start_server):
    """Sixteen chunks of 1 MiB with the default --copy-split-bytes (1 MiB):
    eight pieces a request, and the second worker, idle, takes some of them
    (counted in /status and /metrics); every byte comes back."""
    s = start_server(*SERVER_ARGS, "--cpu-kv-layout", "hint", "--max-gpu-workers", "2",
                     "--l1-size-gb", "0.25")
    g = PagedKV("split_big", "fa_nhd", nl=8, nb=64, bs=16, nh=8, hs=128)
    e = Engine(s, 15, [g])
    n = 16
    src, dst = list(range(0, 2 * n)), list(range(2 * n, 4 * n))[::-1]
    for attempt in range(20):
        toks = prompt(100 + attempt, n_chunks=n)
        assert e.store(toks, 0, n * CS, [src]) == [ZEROS, True], s.output()[-3000:]
        assert lookup(s, toks, f"big{attempt}") == n
        assert e.retrieve(toks, 0, n * CS, [dst], f"big{attempt}", skip=0) == [ZEROS, True]
        if sd_status(s)["pieces_helped"] > 0:
            break
    st = sd_status(s)
    assert st["copy_split_bytes"] == 1 << 20
    assert st["split_copies"] >= 2 * (attempt + 1)
    assert st["pieces_helped"] > 0, st
    assert metrics(s)["lmcache_mp_server_driven_pieces_helped_total"] == st["pieces_helped"]
    for c in (0, 7, 15):
        assert chunk_rows(g, dst, c) == chunk_rows(g, src, c), c
    e.close()


@pytest.mark.parametrize("args", [("--max-gpu-workers", "1", "--copy-split-bytes", "1"),
                                  ("--max-gpu-workers", "2", "--copy-split-bytes", "0")])
def test_one_worker_or_split_bytes_0_never_splits(start_server, args):
    s = start_server(*SERVER_ARGS, "--cpu-kv-layout", "hint", *args)
    g = PagedKV("nosplit", "fa_nhd", nl=3, nb=16, bs=16, nh=2, hs=8)
    round_trip(s, g, Engine(s, 16, [g]))
    assert sd_status(s)["split_copies"] == 0
    assert sd_status(s)["pieces_helped"] == 0


@pytest.mark.parametrize("value", ["-1", "1073741825", "1mb"])
def test_bad_split_sizes_are_refused_naming_the_flag(value):
    r = run_lmcached("--copy-split-bytes", value)
    assert r.returncode == 2, r.stderr
    assert "--copy-split-bytes" in r.stderr, r.stderr


@pytest.mark.parametrize("frames", [2, 4])
def test_older_registrations_with_fewer_frames(srv, frames):
    """[instance_id, kv_caches] (the layout then goes under the first op's
    model and world size) and [instance_id, kv_caches, model, world_size]."""
    g = PagedKV(f"old{frames}", "fa_hnd", nl=2, nb=16, bs=16, nh=2, hs=8)
    d = srv.dealer()
    args = [15, g.handles()] + (["m", 1] if frames == 4 else [])
    reply = d.call(REGISTER_KV_CACHE, *args)
    assert reply is not None and len(reply) == 2, srv.output()
    toks = prompt(16)
    assert unpack(d.call(STORE, key(toks, 0, 2 * CS, "s"), 15, [[1, 2, 3, 4]], b"")) == \
        [ZEROS, True]
    assert lookup(srv, toks, "r") == 2
    assert unpack(d.call(RETRIEVE, key(toks, 0, 2 * CS, "r"), 15, [5, 6, 7, 8], b"")) == \
        [ZEROS, True]                                  # a flat block list, no skip frame
    for c in range(2):
        assert chunk_rows(g, [5, 6, 7, 8], c) == chunk_rows(g, [1, 2, 3, 4], c)
    assert len(d.call(UNREGISTER_KV_CACHE, 15)) == 2
    d.close()
    g.close()


def test_cpu_server_reads_vllm_tensors_as_hnd_whatever_the_hint(srv):
    g = PagedKV("hnd", "fa_hnd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(srv, 12, [g], hints={"kv_layout": "NHD"})
    toks = prompt(2)
    assert e.store(toks, 0, 2 * CS, [[1, 2, 3, 4]]) == [ZEROS, True]
    assert lookup(srv, toks, "r") == 2
    assert e.retrieve(toks, 0, 2 * CS, [[5, 6, 7, 8]], "r") == [ZEROS, True]
    for c in range(2):
        assert chunk_rows(g, [5, 6, 7, 8], c) == chunk_rows(g, [1, 2, 3, 4], c)
    assert "server-driven instance 12 registered: m, 1 kernel group(s), 1 object group(s), " \
           "first NL_X_TWO_NB_NH_BS_HS" in srv.output()
    e.close()


# ---- sharing objects with the engine-driven path ------------------------

class EdWorker:
    """An engine-driven worker of the same model: sees the L1 pool."""

    def __init__(self, srv, instance, layers, hidden, model="m", use_mla=False):
        self.d, self.id, self.model = srv.dealer(), instance, model
        p = {"instance_id": instance, "model_name": model, "world_size": 1, "block_size": CS,
             "num_layers": layers, "hidden_dim_size": hidden, "dtype_str": "float16",
             "use_mla": use_mla, "num_physical_slots": None, "engine_group_infos": [],
             "group_hidden_dim_sizes": None, "group_layout_descs": None,
             "enable_l1_kvweave_quant": False}
        r = unpack(self.d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, p))
        fd = os.open("/dev/shm/" + r["shm_name"], os.O_RDWR)
        self.pool = mmap.mmap(fd, r["pool_size"])
        os.close(fd)

    def retrieve(self, tokens, start, end, rid):
        k = key(tokens, start, end, rid, model=self.model)
        r = unpack(self.d.call(PREPARE_RETRIEVE, k, self.id))
        assert r["success"], r
        out = [bytes(self.pool[s["offset"]:s["offset"] + s["length"]])
               for s in r["context"]["slots"]]
        assert unpack(self.d.call(COMMIT_RETRIEVE, k, self.id)) is True
        return out

    def store(self, tokens, start, end, chunks):
        k = key(tokens, start, end, "s", model=self.model)
        ctx = unpack(self.d.call(PREPARE_STORE, k, self.id))["context"]
        for slot, idx in zip(ctx["slots"], ctx["chunk_indices"]):
            self.pool[slot["offset"]:slot["offset"] + slot["length"]] = chunks[idx]
        assert unpack(self.d.call(COMMIT_STORE, k, self.id, b"")) is True

    def close(self):
        self.pool.close()
        self.d.close()


@pytest.mark.parametrize("fmt", ["fa_hnd", "mla"])
def test_chunks_cross_between_the_two_transfer_paths(srv, fmt):
    g = PagedKV("x" + fmt, fmt, nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(srv, 21, [g])
    ed = EdWorker(srv, 22, layers=2, hidden=g.nh * g.hs, use_mla=fmt == "mla")
    toks = prompt(3)
    # server-driven STORE -> engine-driven retrieve: the object is [2, L, chunk, H]
    assert e.store(toks, 0, 2 * CS, [[1, 2, 3, 4]]) == [ZEROS, True]
    assert lookup(srv, toks, "a") == 2
    objs = ed.retrieve(toks, 0, 2 * CS, "a")
    assert objs == [b"".join(chunk_rows(g, [1, 2, 3, 4], c)) for c in range(2)]
    # engine-driven store -> server-driven RETRIEVE into blocks
    other = prompt(4)
    row = g.row_elems * 2
    chunks = [os.urandom(len(objs[0])) for _ in range(2)]
    ed.store(other, 0, 2 * CS, chunks)
    assert lookup(srv, other, "b") == 2
    assert e.retrieve(other, 0, 2 * CS, [[9, 10, 11, 12]], "b") == [ZEROS, True]
    for c in range(2):
        want = [chunks[c][i:i + row] for i in range(0, len(chunks[c]), row)]
        assert chunk_rows(g, [9, 10, 11, 12], c) == want
    ed.close()
    e.close()


# ---- engine groups -------------------------------------------------------

def info(gid, layers, tpb, sw=-1, p=1):
    return {"engine_group_id": gid, "layer_indices": layers, "tokens_per_block": tpb,
            "sw_size_tokens": sw, "physical_blocks_per_engine_block": p}


def physical(ids, p):
    """Engine block ids as upstream's client sends them: each split into its
    p consecutive physical kernel blocks."""
    return [b * p + o for b in ids for o in range(p)]


@pytest.mark.parametrize("separate", [True, False])
def test_three_engine_groups_block_sizes_and_a_window(start_server, separate):
    s = start_server("--chunk-size", "64", "--cpu-kv-layout", "hint",
                     *([] if separate else ["--no-separate-object-groups"]))
    three_engine_groups_round_trip(s, separate)


def three_engine_groups_round_trip(s, separate, cs=64):
    """Three engine groups of different block sizes, one of them a
    sliding window, on a server of --chunk-size cs."""
    full = PagedKV("g0", "fa_nhd", nl=2, nb=32, bs=16, nh=2, hs=8)       # 4 blocks a chunk
    big = PagedKV("g1", "fi_nhd", nl=1, nb=16, bs=32, nh=1, hs=16)       # 2 blocks a chunk
    swa = PagedKV("g2", "fa_nhd", nl=2, nb=32, bs=16, nh=2, hs=4)        # window 32 tokens
    infos = [info(0, [0, 1], 16), info(1, [2], 32), info(2, [3, 4], 16, sw=32)]
    e = Engine(s, 31, [full, big, swa], infos=infos)
    toks = prompt(5, n_chunks=3, cs=cs)
    src = [list(range(1, 13)), list(range(1, 7)), list(range(1, 13))]
    dst = [list(range(13, 25)), list(range(7, 13)), list(range(13, 25))]
    before = swa.block_bytes(13) + swa.block_bytes(14)
    assert e.store(toks, 0, 3 * cs, src) == [ZEROS, True]
    d = s.dealer()
    assert d.call(LOOKUP, key(toks, 0, 3 * cs, "r", worker_id=None), 1) is not None
    assert unpack(d.call(QUERY_PREFETCH_STATUS, "r")) == 3
    d.close()
    assert e.retrieve(toks, 0, 3 * cs, dst, "r") == [ZEROS, True]
    for c in range(3):
        assert full.rows(dst[0][4 * c:4 * c + 4], cs) == full.rows(src[0][4 * c:4 * c + 4], cs)
        assert big.rows(dst[1][2 * c:2 * c + 2], cs) == big.rows(src[1][2 * c:2 * c + 2], cs)
    # The window keeps the last two of each chunk's four blocks; with its own
    # object group a RETRIEVE writes only the last chunk's.
    for c in range(3):
        kept = list(range(2 + 4 * c, 4 + 4 * c))
        wrote = [dst[2][i] for i in kept]
        if separate and c < 2:
            continue
        assert swa.rows(wrote, 32) == swa.rows([src[2][i] for i in kept], 32)
    assert swa.block_bytes(13) + swa.block_bytes(14) == before   # dropped blocks stay
    layouts = status(s)
    assert "3 kernel group(s), %d object group(s)" % (2 if separate else 1) in s.output()
    assert layouts is not None
    e.close()


def test_engine_blocks_split_into_physical_blocks(start_server):
    """physical_blocks_per_engine_block: a 16-token engine block held in two
    8-slot kernel blocks arrives as twice the ids; the chunks stored are the
    very objects a one-to-one registration of 16-slot blocks reads back, and
    a window group's null engine block (0: physical 0 and 1) stores nothing."""
    cs = 64
    s = start_server("--chunk-size", str(cs), "--cpu-kv-layout", "hint")
    split = PagedKV("p0", "fa_nhd", nl=2, nb=40, bs=8, nh=2, hs=8)
    e = Engine(s, 41, [split], infos=[info(0, [0, 1], 16, p=2)])
    toks = prompt(21, n_chunks=2, cs=cs)
    src = physical(range(1, 9), 2)                     # 4 engine blocks a chunk
    assert e.store(toks, 0, 2 * cs, [src]) == [ZEROS, True]
    assert lookup(s, toks, "r", cs=cs) == 2
    dst = physical(range(9, 17), 2)
    assert e.retrieve(toks, 0, 2 * cs, [dst], "r") == [ZEROS, True]
    stored = split.rows(src, 2 * cs)
    assert split.rows(dst, 2 * cs) == stored
    e.close()
    # The objects are [2, 2, 64, 16] whatever the blocks were: a one-to-one
    # registration of 16-slot blocks reads them.
    plain = PagedKV("p1", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    f = Engine(s, 42, [plain])
    assert lookup(s, toks, "q", cs=cs) == 2
    assert f.retrieve(toks, 0, 2 * cs, [list(range(1, 9))], "q") == [ZEROS, True]
    assert plain.rows(list(range(1, 9)), 2 * cs) == stored
    f.close()
    # A window group whose first chunk is the null engine block.
    full = PagedKV("p2", "fa_nhd", nl=2, nb=40, bs=8, nh=2, hs=8)
    swa = PagedKV("p3", "fa_nhd", nl=1, nb=40, bs=8, nh=2, hs=4)
    g = Engine(s, 43, [full, swa], model="w",
               infos=[info(0, [0, 1], 16, p=2), info(1, [2], 16, sw=32, p=2)])
    before = status(s)["storage_manager"]["l1_manager"]["num_objects"]
    swa_src = physical([0] * 4 + [5, 6, 7, 8], 2)
    assert g.store(toks, 0, 2 * cs, [src, swa_src]) == [ZEROS, True]
    # two full-attention objects and the window's second chunk only
    assert status(s)["storage_manager"]["l1_manager"]["num_objects"] == before + 3
    assert lookup(s, toks, "w", model="w", cs=cs) == 2
    swa_dst = physical(range(9, 17), 2)
    assert g.retrieve(toks, 0, 2 * cs, [dst, swa_dst], "w") == [ZEROS, True]
    assert full.rows(dst, 2 * cs) == full.rows(src, 2 * cs)
    assert swa.rows(swa_dst[12:], 32) == swa.rows(swa_src[12:], 32)   # its last 32 tokens
    g.close()
    # A negative null block: engine block -1 arrives as physical -2 and -1,
    # both of which round down to -1.
    neg = PagedKV("p4", "fa_nhd", nl=2, nb=40, bs=8, nh=2, hs=8)
    n_info = dict(info(0, [0, 1], 16, p=2), null_block_id=-1)
    h = Engine(s, 44, [neg], model="n", infos=[n_info])
    before = status(s)["storage_manager"]["l1_manager"]["num_objects"]
    assert h.store(toks, 0, 2 * cs, [src[:8] + physical([-1] * 4, 2)]) == [ZEROS, True]
    assert status(s)["storage_manager"]["l1_manager"]["num_objects"] == before + 1
    assert lookup(s, toks, "n", model="n", cs=cs) == 1
    h.close()


def test_a_window_group_needs_only_its_last_chunks(start_server):
    """A sliding-window group whose early chunks were null blocks (nothing
    stored) still lets the prefix hit: LOOKUP asks it for its last chunk
    only, and RETRIEVE writes only that one."""
    cs = 64
    s = start_server("--chunk-size", str(cs), "--cpu-kv-layout", "hint")
    full = PagedKV("w0", "fa_nhd", nl=2, nb=32, bs=16, nh=2, hs=8)
    swa = PagedKV("w1", "fa_nhd", nl=2, nb=32, bs=16, nh=2, hs=4)
    e = Engine(s, 33, [full, swa], infos=[info(0, [0, 1], 16), info(1, [2, 3], 16, sw=64)])
    toks = prompt(11, n_chunks=3, cs=cs)
    src = [list(range(1, 13)), [0] * 8 + [5, 6, 7, 8]]
    assert e.store(toks, 0, 3 * cs, src) == [ZEROS, True]
    d = s.dealer()
    assert d.call(LOOKUP, key(toks, 0, 3 * cs, "r", worker_id=None), 1) is not None
    assert unpack(d.call(QUERY_PREFETCH_STATUS, "r")) == 3
    d.close()
    dst = [list(range(13, 25)), list(range(13, 25))]
    before = swa.block_bytes(13)
    assert e.retrieve(toks, 0, 3 * cs, dst, "r") == [ZEROS, True]
    assert full.rows(dst[0], 3 * cs) == full.rows(src[0], 3 * cs)
    assert swa.rows(dst[1][8:], cs) == swa.rows([5, 6, 7, 8], cs)
    assert swa.block_bytes(13) == before
    e.close()


def test_object_groups_of_different_sizes_come_back_from_l2(start_server, tmp_path):
    """Two object groups (a full group and a window group, objects of
    different sizes) written behind to the fs adapter, evicted from L1 by a
    CLEAR, then found by LOOKUP in L2, each loaded at its own size."""
    cs = 64
    spec = json.dumps({"type": "fs", "base_path": str(tmp_path)})
    s = start_server("--chunk-size", str(cs), "--cpu-kv-layout", "hint", "--l2-adapter", spec)
    full = PagedKV("l0", "fa_nhd", nl=2, nb=32, bs=16, nh=2, hs=8)
    swa = PagedKV("l1", "fa_nhd", nl=1, nb=32, bs=16, nh=2, hs=4)
    e = Engine(s, 34, [full, swa], infos=[info(0, [0, 1], 16), info(1, [2], 16, sw=64)])
    toks = prompt(12, n_chunks=2, cs=cs)
    src = [list(range(1, 9)), list(range(1, 9))]
    assert e.store(toks, 0, 2 * cs, src) == [ZEROS, True]
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        sc = status(s)["storage_manager"]["store_controller"]
        if len([f for f in os.listdir(tmp_path) if f.endswith(".data")]) >= 4 \
                and sc["batches_in_flight"] == 0:
            break
        time.sleep(0.05)
    sizes = sorted(os.path.getsize(os.path.join(tmp_path, f)) for f in os.listdir(tmp_path)
                   if f.endswith(".data"))
    assert sizes == [2 * 1 * cs * 8 * 2] * 2 + [2 * 2 * cs * 16 * 2] * 2
    d = s.dealer()
    assert d.call(CLEAR, False) is not None                 # L1 is empty
    assert d.call(LOOKUP, key(toks, 0, 2 * cs, "r", worker_id=None), 1) is not None
    assert unpack(d.call(WAIT_PREFETCH_STATUS, "r", 10.0, timeout_ms=15000)) == 2   # from L2
    d.close()
    dst = [list(range(9, 17)), list(range(9, 17))]
    assert e.retrieve(toks, 0, 2 * cs, dst, "r") == [ZEROS, True]
    assert full.rows(dst[0], 2 * cs) == full.rows(src[0], 2 * cs)
    assert swa.rows(dst[1][4:], cs) == swa.rows(src[1][4:], cs)
    e.close()


# ---- skip, null blocks ---------------------------------------------------

def test_skip_first_n_tokens_leaves_shared_blocks_alone(hint_srv):
    g = PagedKV("skip", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(hint_srv, 41, [g])
    toks = prompt(6)
    assert e.store(toks, 0, 3 * CS, [[1, 2, 3, 4, 5, 6]]) == [ZEROS, True]
    assert lookup(hint_srv, toks, "r") == 3
    dst = [7, 8, 9, 10, 11, 12]
    before = [g.block_bytes(b) for b in dst]
    assert e.retrieve(toks, 0, 3 * CS, [dst], "r", skip=48) == [ZEROS, True]
    for i, b in enumerate(dst):
        if i < 3:
            assert g.block_bytes(b) == before[i]             # the first 48 tokens
        else:
            assert g.block_bytes(b) == g.block_bytes(i + 1)
    # A skip over the whole range copies nothing but consumes the locks.
    assert lookup(hint_srv, toks, "r2") == 3
    assert e.retrieve(toks, 0, 3 * CS, [[13, 14, 15, 13, 14, 15]], "r2", skip=96) == \
        [ZEROS, True]
    assert e.retrieve(toks, 0, 3 * CS, [dst], "r2") == [ZEROS, False]
    e.close()


def test_null_blocks_are_not_stored(hint_srv):
    g = PagedKV("null", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(hint_srv, 42, [g])
    toks = prompt(7)
    assert e.store(toks, 0, 3 * CS, [[1, 2, 0, 0, 5, 6]]) == [ZEROS, True]
    assert lookup(hint_srv, toks, "r") == 1          # chunk 1 was null: a hole
    e.close()


# ---- /cache/checksums ----------------------------------------------------

def http_post(srv, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def md5_of_blocks(g, blocks, layers, bf16):
    """Upstream's digest: per layer in order, the gathered blocks' bytes
    ([2, n, ...] for FlashAttention: K blocks then V blocks), bf16 widened."""
    h = hashlib.md5()
    for l in layers:
        for kv in range(2):
            for b in blocks:
                raw = b"".join(g.row(kv, l, b, s, hh) for s in range(g.bs) for hh in range(g.nh))
                if bf16:
                    raw = b"".join(b"\0\0" + raw[i:i + 2] for i in range(0, len(raw), 2))
                h.update(raw)
    return h.hexdigest()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_checksums_of_stored_and_retrieved_blocks_agree(hint_srv, dtype):
    g = PagedKV("ck" + dtype, "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8, dtype=dtype)
    e = Engine(hint_srv, 71, [g])
    toks = prompt(13)
    assert e.store(toks, 0, 2 * CS, [[1, 2, 3, 4]]) == [ZEROS, True]
    assert lookup(hint_srv, toks, "r") == 2
    assert e.retrieve(toks, 0, 2 * CS, [[9, 10, 11, 12]], "r") == [ZEROS, True]
    st, a = http_post(hint_srv, "/cache/checksums",
                      {"block_ids": [1, 2, 3, 4, 7], "chunk_size": 2, "instance_id": 71})
    assert st == 200, a
    assert a["num_chunks"] == 3 and a["block_id_ranges"] == "[1,4],7" and not a["layerwise"]
    bf16 = dtype == "bfloat16"
    assert a["chunk_checksums"] == [md5_of_blocks(g, [1, 2], [0, 1], bf16),
                                    md5_of_blocks(g, [3, 4], [0, 1], bf16),
                                    md5_of_blocks(g, [7], [0, 1], bf16)]
    st, b = http_post(hint_srv, "/cache/checksums",
                      {"block_ids": [9, 10, 11, 12], "chunk_size": 2, "instance_id": 71})
    assert b["chunk_checksums"] == a["chunk_checksums"][:2]      # the retrieve's copy
    st, lw = http_post(hint_srv, "/cache/checksums", {"block_ids": [1, 2], "chunk_size": 2,
                                                      "instance_id": 71, "layerwise": True})
    assert lw["chunk_checksums"] == {"layer_0": [md5_of_blocks(g, [1, 2], [0], bf16)],
                                     "layer_1": [md5_of_blocks(g, [1, 2], [1], bf16)]}
    url = (f"http://127.0.0.1:{hint_srv.http_port}/kvcache/check"
           "?block_ids=[1,4],7&chunk_size=2&instance_id=71")
    with urllib.request.urlopen(url, timeout=10) as r:
        assert json.loads(r.read())["chunk_checksums"] == a["chunk_checksums"]
    for body, code in [({"block_ids": [], "chunk_size": 2, "instance_id": 71}, 400),
                       ({"block_ids": [1], "chunk_size": 0, "instance_id": 71}, 400),
                       ({"block_ids": [99], "chunk_size": 1, "instance_id": 71}, 400),
                       ({"block_ids": [1], "chunk_size": 1, "instance_id": 5}, 404),
                       ({"block_ids": "1", "chunk_size": 1}, 400)]:
        assert http_post(hint_srv, "/cache/checksums", body)[0] == code, body
    e.close()


def test_checksums_refuse_formats_without_a_block_axis(srv):
    g = PagedKV("ck_sg", "sglang_kv", nl=1, nb=8, bs=16, nh=2, hs=8)
    e = Engine(srv, 72, [g], hints={"tokens_per_block": 16, "kv_list_layout": "k_v"},
               engine="sglang")
    st, body = http_post(srv, "/cache/checksums", {"block_ids": [1], "chunk_size": 1,
                                                   "instance_id": 72})
    assert st == 501 and "not supported" in body["detail"], body
    e.close()


# ---- failures ------------------------------------------------------------

def test_failures_get_their_replies_and_publish_nothing(hint_srv):
    g = PagedKV("fail", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(hint_srv, 51, [g])
    toks = prompt(8)
    assert e.store(toks, 0, 3 * CS, [[1, 2, 3, 4, 5]]) == [ZEROS, False]     # too few
    assert e.store(toks, 0, 3 * CS, [[1, 2, 3], [4, 5, 6]]) == [ZEROS, False]  # two lists
    assert e.store(toks, 0, 3 * CS, [[1, 2, 3, 4, 5, 99]]) == [ZEROS, False]  # out of range
    assert e.store(toks, 0, 3 * CS, [["x"] * 6]) == [ZEROS, False]
    assert lookup(hint_srv, toks, "r") == 0                                  # nothing stored
    d = hint_srv.dealer()
    assert unpack(d.call(STORE, key(toks, 0, CS, "s"), 999, [[1, 2]], ZEROS)) == [b"", False]
    assert unpack(d.call(RETRIEVE, key(toks, 0, CS, "s"), 999, [[1, 2]], ZEROS, 0)) == \
        [b"", False]
    assert e.store(toks, 0, 3 * CS, [[1, 2, 3, 4, 5, 6]]) == [ZEROS, True]
    assert e.retrieve(toks, 0, 3 * CS, [[7, 8, 9, 10, 11, 12]], "nolookup") == [ZEROS, False]
    assert unpack(d.call(RETRIEVE, key(toks, 0, CS, "s"), 51, [[1, 2]], ZEROS, -1)) == \
        [ZEROS, False]
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    m = metrics(hint_srv)
    assert m["lmcache_mp_server_driven_store_failures_total"] == 5
    assert m["lmcache_mp_server_driven_stores_total"] == 1
    assert m["lmcache_mp_server_driven_retrieve_failures_total"] == 3
    assert m["lmcache_mp_server_driven_stored_bytes_total"] == 3 * 2 * 2 * CS * 16 * 2
    e.close()


def test_an_engine_that_shrinks_its_segment_gets_false(hint_srv):
    """A segment truncated under the server's mapping: the copy faults
    (SIGBUS), that request fails, nothing is published or leaked, and the
    server keeps serving."""
    g = PagedKV("shrink", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(hint_srv, 62, [g])
    toks = prompt(14)
    assert e.store(toks, 0, CS, [[1, 2]]) == [ZEROS, True]
    assert lookup(hint_srv, toks, "r") == 1
    for t in g.tensors:
        os.truncate("/dev/shm" + t.name, 0)
    other = prompt(15)
    assert e.store(other, 0, CS, [[3, 4]]) == [ZEROS, False]
    assert e.retrieve(toks, 0, CS, [[5, 6]], "r") == [ZEROS, False]
    assert "memory went away under the copy" in hint_srv.output()
    # /cache/checksums reads the same segments, under the same guard.
    st, body = http_post(hint_srv, "/cache/checksums", {"block_ids": [1, 2], "chunk_size": 2,
                                                        "instance_id": 62})
    assert st == 500 and "memory went away under the read" in body["detail"], (st, body)
    assert lookup(hint_srv, other, "r2") == 0
    leases = status(hint_srv)["storage_manager"]["l1_manager"]["leases"]
    assert leases["write"]["outstanding"] == 0 and leases["copy"]["outstanding"] == 0
    d = hint_srv.dealer()
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    e.close()


def test_unregister_and_reap_release_everything(start_server, monkeypatch):
    monkeypatch.setenv("LMCACHED_TEST_REAP_SCALE", "60")     # 30 s -> 0.5 s
    s = start_server("--chunk-size", str(CS), "--cpu-kv-layout", "hint",
                     "--worker-reap-timeout-seconds", "30",
                     "--worker-registration-grace-seconds", "30")
    g = PagedKV("reap", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    e = Engine(s, 61, [g])
    # Re-registering a known instance only refreshes it, whatever it carries.
    assert len(e.d.call(REGISTER_KV_CACHE, 61, [ext(b"junk")], "m", 1, "vllm", {}, [])) == 2
    toks = prompt(9)
    # The client unmaps and unlinks its segments: the server's mapping stays.
    g.close(unlink=True)
    assert e.store(toks, 0, CS, [[1, 2]]) == [ZEROS, True]
    maps = open(f"/proc/{s.proc.pid}/maps").read()
    assert "lmcache_kv_" in maps
    time.sleep(1.5)                                          # never pinged: reaped
    assert wait_for_log(s, "reaped server-driven instance 61")
    assert e.store(toks, 0, CS, [[1, 2]]) == [b"", False]
    assert "lmcache_kv_" not in open(f"/proc/{s.proc.pid}/maps").read()
    assert lookup(s, toks, "r") == 0          # no worker left: no layout, no hits
    assert status(s)["storage_manager"]["l1_manager"]["num_objects"] == 1   # but it stays
    e.close(unregister=False)


def plane_block(g, t, kv, b):
    """Block b of plane kv of fa_nhd tensor t ([2, NB, BS, NH, HS]), whole."""
    n = g.bs * g.nh * g.hs * g.item
    off = g.tensors[t].offset([kv, b, 0, 0, 0])
    return g.tensors[t].mm[off:off + n]


@pytest.mark.parametrize("how", ["unregister", "reap"])
def test_a_worker_gone_mid_store_still_lands_its_store(start_server, monkeypatch, how):
    """The worker is unregistered, or reaped, while its STORE is copying:
    the request holds its own reference to the registration, so its copy
    finishes and its chunks are published whole; the segments are
    unmapped when it returns.  Each attempt knows whether the drop landed
    mid-request (the UNREGISTER reply, or the reap in the log, while the
    STORE reply is still outstanding); one of them must have.  A keeper of
    the same layout stays registered, so LOOKUP can see what landed."""
    # The STORE must still be copying when the drop lands. With the L1 and
    # the engine's segments faulted in ahead (docs/storage.md, "Pre-fault")
    # a STORE of 128 MiB takes some tens of milliseconds on a release
    # build, several times that under a sanitizer: the attempts grow from
    # 64 to 256 chunks of 2 MiB, so that one of them outlasts the 50 ms
    # reap window whatever the build's speed.
    cs, sizes = 256, (64, 128, 256, 256)
    # Reap mode: a worker that pinged is reaped 50 ms after its last sign
    # of life (a STORE is one; 100 ms under a sanitizer, which picks the
    # STORE up later); the keeper, which never pings, after 100 s (50 s).
    sanitized = bool(os.environ.get("LMC_SANITIZE"))
    monkeypatch.setenv("LMCACHED_TEST_REAP_SCALE",
                       ("300" if sanitized else "600") if how == "reap" else "1")
    s = start_server("--chunk-size", str(cs), "--cpu-kv-layout", "hint", "--l1-size-gb", "1",
                     "--worker-reap-timeout-seconds", "30",
                     "--worker-registration-grace-seconds", "60000")
    geometry = dict(nl=8, bs=16, nh=2, hs=128)
    keeper = Engine(s, 99, [PagedKV("keep", "fa_nhd", nb=2, **geometry)])
    g = PagedKV("mid", "fa_nhd", nb=1 + 2 * max(sizes) * 16, **geometry)
    d, other = s.dealer(), s.dealer()
    mid, published = False, []
    for attempt, n in enumerate(sizes):
        src = list(range(1, 1 + n * 16))
        instance = 70 + attempt
        assert d.call(REGISTER_KV_CACHE, instance, g.handles(), "m", 1, "vllm", {"kv_layout": "NHD"}, [],
                      timeout_ms=5000) is not None, s.output()
        toks = prompt(40 + attempt, n_chunks=n, cs=cs)
        store_key = key(toks, 0, n * cs, "s")
        if how == "reap":   # the window opens here: nothing slow before the STORE
            assert unpack(d.call(PING, instance)) is True
        d.send(STORE, store_key, instance, [src], ZEROS)
        drop = (f"reaped server-driven instance {instance}" if how == "reap"
                else f"server-driven instance {instance} unregistered")
        if how == "unregister":    # once the STORE holds its L1 reservations
            until(lambda: d.sock.poll(0) or status(s)["storage_manager"]["l1_manager"]
                  ["leases"]["write"]["outstanding"] > 0)
            assert len(other.call(UNREGISTER_KV_CACHE, instance)) == 2
        deadline = time.monotonic() + 30
        while not d.sock.poll(1) and time.monotonic() < deadline:
            if drop in s.output():
                mid = mid or not d.sock.poll(0)
                break
        reply = d.recv(timeout_ms=30000)
        assert reply is not None, s.output()
        ok = unpack(reply)[1]
        assert wait_for_log(s, drop), s.output()
        assert until(lambda: f"lmcache_kv_{os.getpid()}_mid_" not in
                     open(f"/proc/{s.proc.pid}/maps").read())
        leases = status(s)["storage_manager"]["l1_manager"]["leases"]
        assert leases["write"]["outstanding"] == 0 and leases["copy"]["outstanding"] == 0
        assert lookup(s, toks, f"p{attempt}", cs=cs) == (n if ok else 0)   # all or nothing
        if ok:
            published.append((toks, n))
        if mid and ok:
            break
    assert mid and published, s.output()
    # The bytes are whole: a new registration of the same segments reads
    # the last published prompt back into other blocks.
    e = Engine(s, 90, [g])
    toks, n = published[-1]
    src = list(range(1, 1 + n * 16))
    dst = list(range(1 + n * 16, 1 + 2 * n * 16))
    assert lookup(s, toks, "back", cs=cs) == n
    assert e.retrieve(toks, 0, n * cs, [dst], "back") == [ZEROS, True]
    for t in range(g.nl):
        for kv in range(2):
            for a, b in zip(src, dst):
                assert plane_block(g, t, kv, a) == plane_block(g, t, kv, b), (t, kv, a)
    assert other.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    other.close()
    e.close()
    keeper.close()


# ---- refusals ------------------------------------------------------------

def register_raw(srv, d, instance, handles, hints=None, infos=None, engine="vllm"):
    payload = [instance, handles, "org/model", 1, engine, hints or {}, infos or []]
    return d.call(REGISTER_KV_CACHE, *payload, timeout_ms=500)


def test_registrations_refused_with_the_reason(srv):
    d = srv.dealer()
    cuda = [ext(gen_vectors.vectors()[0]["cuda_ipc_v2"])]
    assert register_raw(srv, d, 78, cuda) is None
    assert wait_for_log(srv, "REGISTER_KV_CACHE 78: CUDA tensors need the CUDA transfer: "), \
        srv.output()
    assert "CUDA transfer unavailable: " in srv.output()   # why, once
    missing = [ext(w.dumps(w.cpu_shm("/lmcache_kv_missing_0", [2, 4, 16, 2, 8])))]
    assert register_raw(srv, d, 79, missing) is None
    assert wait_for_log(srv, "cannot open segment /lmcache_kv_missing_0")
    g = PagedKV("bad", "fa_nhd", nl=2, nb=4, bs=16, nh=2, hs=8)
    assert register_raw(srv, d, 80, g.handles(), hints={"kv_layout": "BLHNC"}) is None
    assert wait_for_log(srv, "kv_layout BLHNC is not supported yet")
    assert register_raw(srv, d, 81, g.handles(), infos=[info(0, [0, 1], 24)]) is None
    assert wait_for_log(srv, "tokens_per_block 24 must be a multiple")
    assert register_raw(srv, d, 82, g.handles(), infos=[info(0, [1, 0], 16)]) is None
    assert wait_for_log(srv, "out of range, repeated or out of order")
    for i, (tpb, p) in enumerate([(16, 3), (16, 0), (0, 2)]):
        assert register_raw(srv, d, 84 + i, g.handles(), infos=[info(0, [0, 1], tpb, p=p)]) \
            is None
        assert wait_for_log(srv, "REGISTER_KV_CACHE %d: physical_blocks_per_engine_block %d "
                                 "must be 1, or divide a tokens_per_block above 0 (got %d)"
                            % (84 + i, p, tpb)), srv.output()
    # A handle claiming more bytes than its segment has.  (The map-time
    # check that a kernel group's span fits its segment is a second line:
    # the handle's own check, that its view fits the bytes it claims,
    # already refuses every CPU tensor that could fail it.)
    big = ext(w.dumps(w.cpu_shm(g.tensors[0].name, [2, 64, 16, 2, 8])))
    assert register_raw(srv, d, 83, [big]) is None
    assert wait_for_log(srv, "REGISTER_KV_CACHE 83: cannot open segment %s of %d bytes: it is "
                             "smaller" % (g.tensors[0].name, 2 * 64 * 16 * 2 * 8 * 2)), \
        srv.output()
    # Another cache server's L1 pool is no engine's KV cache (issue 29).
    pool = ext(w.dumps(w.cpu_shm("/lmcache_l1_pool_999", [2, 4, 16, 2, 8])))
    assert register_raw(srv, d, 88, [pool]) is None
    assert wait_for_log(srv, "REGISTER_KV_CACHE 88: kv_cache[0]: shm_name '/lmcache_l1_pool_999' "
                             "does not name an engine's segment") or \
        wait_for_log(srv, "REGISTER_KV_CACHE 88: shm_name '/lmcache_l1_pool_999' does not name "
                          "an engine's segment"), srv.output()
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    g.close()
    d.close()


@pytest.mark.parametrize("name,reason", [
    ("reduce_os_system", "global posix.system is not allowed"),
    ("global_builtins_eval", "global builtins.eval is not allowed"),
    ("expandable_segment", "expandable-segment CUDA handle"),
    ("vmm", "VmmCudaIPCWrapper"),
    ("deep_nesting", "nest deeper than 16"),
    ("truncated", "runs past the end of the pickle"),
])
def test_hostile_handles_are_refused_and_never_run(srv, name, reason):
    d = srv.dealer()
    if os.path.exists(gen_vectors.PWNED):
        os.unlink(gen_vectors.PWNED)
    good = ext(w.dumps(w.cpu_shm("/lmcache_kv_1_0", [2, 16, 8])))
    bad = ext(gen_vectors.vectors()[1][name])
    assert register_raw(srv, d, 5, [good, bad]) is None
    assert wait_for_log(srv, "REGISTER_KV_CACHE 5: kv_cache[1]: "), srv.output()
    assert reason in srv.output(), srv.output()
    assert not os.path.exists(gen_vectors.PWNED)
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()


@pytest.mark.parametrize("name,reason", [
    ("desc_version_2", "descriptor version 2 is not 1"),
    ("desc_vmm", "a cuda_vmm descriptor"),
    ("desc_unknown_type", "descriptor type 'musa' is not supported"),
    ("desc_past_its_segment", "the tensor reaches past the 511 bytes"),
    ("desc_huge_shape", "shape and stride overflow"),
    ("desc_deep", "the descriptor is not one well-formed msgpack map"),
])
def test_hostile_descriptors_are_refused_with_the_reason(srv, name, reason):
    d = srv.dealer()
    good = ext(gen_vectors.vectors()[0]["desc_cpu_shm"])
    bad = ext(gen_vectors.vectors()[1][name])
    assert register_raw(srv, d, 6, [good, bad]) is None
    assert wait_for_log(srv, "REGISTER_KV_CACHE 6: kv_cache[1]: " + reason), srv.output()
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()


@pytest.mark.parametrize("engine,shape,hints,reason", [
    # TRT-LLM hints whose product wraps to the row length (issue 29): the
    # segment is real and as large as the shape says.
    ("trtllm", [2, 1, 2, 291840], {"num_kv_heads": 1711252907, "tokens_per_block": 256,
                                   "head_dim": 2147512668},
     "pool rows of 291840 elements are not num_kv_heads x tokens_per_block x head_dim"),
    # A vLLM tensor of 2^63 elements claimed in a small segment.
    ("vllm", [2, 2, 1, 2 ** 31, 2 ** 30], {"kv_layout": "NHD"},
     "the tensor reaches past the"),
])
def test_sizes_that_overflow_are_refused_at_registration(srv, engine, shape, hints, reason):
    """The claimed geometry is refused before anything is mapped or copied;
    a STORE for the instance then finds nothing registered."""
    real = shape if engine == "trtllm" else [2, 1, 2, 8]
    t = Tensor("/lmc_e2e_overflow", real, "float16")
    stride, acc = [], 1
    for n in reversed(shape):
        stride.insert(0, acc)
        acc *= n
    handle = w.cpu_shm(t.name, shape, stride=stride, nbytes=t.nbytes)
    d = srv.dealer()
    assert register_raw(srv, d, 8, [ext(w.dumps(handle))], hints=hints, engine=engine) is None
    assert wait_for_log(srv, "REGISTER_KV_CACHE 8: "), srv.output()
    assert reason in srv.output(), srv.output()
    toks = prompt(30)
    assert unpack(d.call(STORE, key(toks, 0, CS, "s"), 8, [[1]], ZEROS)) == [b"", False]
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    t.close()


def test_malformed_registrations_keep_the_server_serving(srv):
    d = srv.dealer()
    assert register_raw(srv, d, 9, []) is None
    assert wait_for_log(srv, "kv_cache must be a list of 1..4096 tensor handles")
    assert register_raw(srv, d, 9, [b"not an ext"]) is None
    assert wait_for_log(srv, "kv_cache[0] is not a msgpack ext type 1")
    assert d.call(REGISTER_KV_CACHE, "nine", timeout_ms=500) is None
    assert wait_for_log(srv, "instance_id must be an int")
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()


def test_unregister_of_an_unknown_instance_is_answered(srv):
    d = srv.dealer()
    frames = d.call(UNREGISTER_KV_CACHE, 77)
    assert frames is not None and len(frames) == 2    # void: [uid, op]
    assert wait_for_log(srv, "UNREGISTER_KV_CACHE: instance 77 is not registered")
    d.close()


def test_engine_driven_mode_leaves_the_ops_unanswered(start_server):
    s = start_server("--supported-transfer-mode", "engine_driven")
    d = s.dealer()
    assert d.call(UNREGISTER_KV_CACHE, 77, timeout_ms=500) is None
    d.close()
