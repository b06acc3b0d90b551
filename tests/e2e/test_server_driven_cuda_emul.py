"""The server-driven module's CUDA path (docs/protocol.md, "Server-driven
copies over CUDA IPC") on a machine without a GPU: lmcached loads the CPU
stand-in of liblmcached_cuda.so (tests/cuda_emul/cuda_emul.c, through
LMCACHED_CUDA_LIB), whose streams are threads that take their time, so
every reply here really does come back before its copies end.  What runs
is lmcached's own code: registration of CudaIPCWrapper handles, copies
enqueued per object, recorded events, and L1 publish and release from the
stream's callbacks on the completion thread."""
import hashlib
import os
import time

import msgpack
import pytest

from lmc.client import unpack
from lmc.ops import NOOP, REGISTER_KV_CACHE, RETRIEVE, STORE, UNREGISTER_KV_CACHE
from lmc.server import ROOT, Server
from paged_kv import PagedKV, create_segment, unlink_segment
from test_server_driven import CS, chunk_rows, http_post, key, lookup, prompt, status, until
import wrappers as w

EMUL = os.environ.get("LMCACHED_CUDA_EMUL", os.path.join(ROOT, "build", "libcuda_emul.so"))
SERVER_ARGS = ("--chunk-size", str(CS))      # the srv fixture's (conftest.py)


def cuda_handles(g):
    """CudaIPCWrapper pickles whose memory handles name g's segments."""
    out = []
    for t in g.tensors:
        name = t.name.encode()
        assert len(name) <= 64
        wr = w.cuda_ipc(t.shape, t.stride, dtype=t.dtype, storage_bytes=t.nbytes,
                        mem_handle=name.ljust(64, b"\0"), version=None, event_sync=False,
                        uuid="emul-0")
        out.append(msgpack.ExtType(1, w.dumps(wr)))
    return out


def server_env():
    """What the srv fixture's server needs (conftest.py): the emulator as
    its CUDA library.  Without the emulator built the test is skipped
    (failed under CI=true)."""
    if not os.path.exists(EMUL):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{EMUL} was not built")
        pytest.skip(f"{EMUL} not built")
    return {"LMCACHED_CUDA_LIB": EMUL}


def blocks_md5(g, blocks, layers):
    """The digest /cache/checksums gives: per layer, each block's bytes as
    the segment holds them (K blocks then V blocks where the tensor starts
    with the K/V axis), straight from memory."""
    h = hashlib.md5()
    for l in layers:
        t = g.tensors[l]
        rest = [0] * (len(t.shape) - 1)
        if g.order[0] == "kv":
            pieces = [(t.offset([kv, b] + rest[1:]), t.stride[1]) for kv in range(2)
                      for b in blocks]
        else:
            pieces = [(t.offset([b] + rest), t.stride[0]) for b in blocks]
        for off, elems in pieces:
            h.update(t.mm[off:off + elems * t.item])
    return h.hexdigest()


def copies_settled(srv):
    """Every copy's lease is back: the stream has passed them all."""
    leases = status(srv)["storage_manager"]["l1_manager"]["leases"]
    return leases["copy"]["outstanding"] == 0 and leases["write"]["outstanding"] == 0


def register(d, instance, g, hint="NHD"):
    frames = d.call(REGISTER_KV_CACHE, instance, cuda_handles(g), "m", 1, "vllm", {"kv_layout": hint}, [])
    return frames is not None and len(frames) == 2


@pytest.mark.parametrize("fmt,hint", [("fa_nhd", "NHD"), ("fa_hnd", "HND"), ("mla", "NHD")])
def test_store_and_retrieve_through_the_stream(srv, fmt, hint):
    g = PagedKV("cu" + fmt, fmt, nl=2, nb=16, bs=16, nh=2, hs=8)
    d = srv.dealer()
    assert register(d, 81, g, hint), srv.output()
    assert "CUDA transfer loaded: 1 device(s)" in srv.output()
    toks = prompt(21)
    ev = os.urandom(64)                        # the engine's event: waited on
    h, ok = unpack(d.call(STORE, key(toks, 0, 3 * CS, "s"), 81, [[1, 2, 3, 4, 5, 6]], ev))
    assert ok and len(h) == 64 and h[:4] == b"emul"
    # Published only once the stream passed the copies.
    assert until(lambda: lookup(d, toks, f"r{time.monotonic()}", end=3 * CS) == 3)
    assert lookup(d, toks, "r", end=3 * CS) == 3
    dst = [13, 8, 9, 10, 11, 12]
    h2, ok = unpack(d.call(RETRIEVE, key(toks, 0, 3 * CS, "r"), 81, [dst], b"", 0))
    assert ok and h2 != h
    assert until(lambda: all(chunk_rows(g, dst, c) == chunk_rows(g, list(range(1, 7)), c)
                             for c in range(3)))
    # The read shares go back after the copies: the books settle.
    assert until(lambda: copies_settled(srv)), \
        status(srv)["storage_manager"]["l1_manager"]["leases"]
    # Checksums read the blocks back from the device: the source blocks and
    # the retrieve's copies digest alike, per chunk and per layer.
    st, a = http_post(srv, "/cache/checksums",
                      {"block_ids": [1, 2, 3, 4, 5, 6], "chunk_size": 2, "instance_id": 81})
    assert st == 200, a
    assert a["chunk_checksums"] == [blocks_md5(g, [1 + 2 * c, 2 + 2 * c], [0, 1])
                                    for c in range(3)]
    st, b = http_post(srv, "/cache/checksums",
                      {"block_ids": dst, "chunk_size": 2, "instance_id": 81, "layerwise": True})
    assert st == 200, b
    assert b["chunk_checksums"] == {
        f"layer_{l}": [blocks_md5(g, [1 + 2 * c, 2 + 2 * c], [l]) for c in range(3)]
        for l in range(2)}
    assert http_post(srv, "/cache/checksums", {"block_ids": [16], "chunk_size": 1,
                                               "instance_id": 81})[0] == 400
    assert len(d.call(UNREGISTER_KV_CACHE, 81)) == 2
    d.close()
    g.close()


class Carved:
    """A tensor's window into the one segment: what PagedKV reads through."""

    def __init__(self, mm, start):
        self.mm, self.start = mm, start

    def __getitem__(self, sl):
        return self.mm[self.start + sl.start:self.start + sl.stop]

    def close(self):
        pass                                   # the segment is closed once, at the end


class OneAllocation:
    """g's tensors moved into one segment, as blocks of one cudaMalloc
    segment: storage i starts at starts[i] (512-byte aligned, with a gap
    after each), its tensor views[i] elements into it.  The gaps hold 0xA5."""

    def __init__(self, g, views):
        self.g, self.views, nbytes = g, views, g.tensors[0].nbytes
        self.name = f"/lmcache_kv_{os.getpid()}_{g.tensors[0].name.split('_')[-2]}_all"
        self.starts, at = [], 4096
        for v in views:
            self.starts.append(at)
            at += (v * g.item + nbytes + 1023) // 512 * 512
        self.big = create_segment(self.name, at)
        self.big[:] = bytes([0xA5]) * at
        data = [s + v * g.item for s, v in zip(self.starts, views)]
        for t, d in zip(g.tensors, data):
            self.big[d:d + nbytes] = t.mm[:]
            t.mm.close()
            t.mm = Carved(self.big, d)
        self.gaps = list(zip([0] + [d + nbytes for d in data], data + [at]))
        assert self.gaps_untouched()

    def handle(self):
        return self.name.encode().ljust(64, b"\0")

    def gaps_untouched(self):
        return all(self.big[a:b] == bytes([0xA5]) * (b - a) for a, b in self.gaps)

    def close(self):
        self.g.close()
        self.big.close()
        unlink_segment(self.name)


def round_trip_carved(srv, d, instance, one, handles, hints, engine="vllm"):
    """REGISTER, STORE blocks 1-6, RETRIEVE into others: the rows agree,
    and nothing outside the tensors changed.  The source and the
    destination blocks."""
    g = one.g
    frames = d.call(REGISTER_KV_CACHE, instance, handles, "m", 1, engine, hints, [])
    assert frames is not None and len(frames) == 2, srv.output()
    toks = prompt(instance)
    src, dst = [1, 2, 3, 4, 5, 6], [13, 8, 9, 10, 11, 12]
    assert unpack(d.call(STORE, key(toks, 0, 3 * CS, "s"), instance, [src], b""))[1]
    assert until(lambda: lookup(d, toks, f"r{time.monotonic()}", end=3 * CS) == 3)
    assert lookup(d, toks, "r", end=3 * CS) == 3
    assert unpack(d.call(RETRIEVE, key(toks, 0, 3 * CS, "r"), instance, [dst], b"", 0))[1]
    assert until(lambda: copies_settled(srv))
    assert all(chunk_rows(g, dst, c) == chunk_rows(g, src, c) for c in range(3))
    assert one.gaps_untouched()
    return src, dst


def test_layers_carved_out_of_one_allocation(srv):
    """As vLLM's caching allocator hands them out: every layer a block of
    one cudaMalloc segment (one memory handle, the storage's offset in the
    segment in the handle), one layer a view starting 40 elements into its
    storage.  Each layer's blocks land where its own offsets say."""
    g = PagedKV("cucarve", "fa_nhd", nl=3, nb=16, bs=16, nh=2, hs=8)
    one = OneAllocation(g, [0, 40, 0])
    handles = [msgpack.ExtType(1, w.dumps(w.cuda_ipc(
        t.shape, t.stride, dtype=t.dtype, storage_bytes=v * g.item + t.nbytes,
        offset_bytes=start, storage_offset=v, mem_handle=one.handle(), version=None,
        event_sync=False, uuid="emul-0")))
        for t, start, v in zip(g.tensors, one.starts, one.views)]
    d = srv.dealer()
    src, dst = round_trip_carved(srv, d, 86, one, handles, {"kv_layout": "NHD"})
    st, a = http_post(srv, "/cache/checksums", {"block_ids": dst, "chunk_size": 2,
                                                "instance_id": 86, "layerwise": True})
    assert st == 200, a
    assert a["chunk_checksums"] == {
        f"layer_{l}": [blocks_md5(g, src[2 * c:2 * c + 2], [l]) for c in range(3)]
        for l in range(3)}
    assert len(d.call(UNREGISTER_KV_CACHE, 86)) == 2
    d.close()
    one.close()


def test_trtllm_pool_at_an_allocation_offset(srv):
    """TRT-LLM's RawCudaIPCWrapper: the pool [NB, NL, 2, NH, BS, HS] starts
    `_alloc_offset` bytes into the allocation its handle names."""
    g = PagedKV("cutrt", "trt6", nl=3, nb=16, bs=16, nh=2, hs=8)
    one = OneAllocation(g, [0])
    t = g.tensors[0]
    handles = [msgpack.ExtType(1, w.dumps(w.raw_cuda_ipc(
        t.shape, t.stride, dtype=t.dtype, alloc_offset=one.starts[0],
        mem_handle=one.handle(), uuid="emul-0")))]
    d = srv.dealer()
    round_trip_carved(srv, d, 87, one, handles, {"kv_layout": "HND"}, engine="trtllm")
    assert len(d.call(UNREGISTER_KV_CACHE, 87)) == 2
    d.close()
    one.close()


def test_checksums_read_long_runs_in_pieces(srv):
    """64 adjoining 32 KiB blocks per plane: more than one device read
    holds (1 MiB), so the run is read in pieces, and digested alike."""
    g = PagedKV("cuck", "fa_nhd", nl=1, nb=80, bs=16, nh=8, hs=128)
    d = srv.dealer()
    assert register(d, 85, g)
    ids = list(range(3, 67))
    st, a = http_post(srv, "/cache/checksums",
                      {"block_ids": ids, "chunk_size": 64, "instance_id": 85})
    assert st == 200, a
    assert a["chunk_checksums"] == [blocks_md5(g, ids, [0])]
    assert len(d.call(UNREGISTER_KV_CACHE, 85)) == 2
    d.close()
    g.close()


def test_failures_reply_with_a_recorded_event(srv):
    g = PagedKV("cufail", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
    d = srv.dealer()
    assert register(d, 82, g)
    toks = prompt(22)
    h, ok = unpack(d.call(STORE, key(toks, 0, 3 * CS, "s"), 82, [[1, 2, 3]], b""))
    assert not ok and len(h) == 64 and h[:4] == b"emul"      # too few block ids
    h, ok = unpack(d.call(STORE, key(toks, 0, CS, "s"), 82, [[1, 2]], b"bad"))
    assert not ok and len(h) == 64                            # a 3-byte event handle
    h, ok = unpack(d.call(RETRIEVE, key(toks, 0, CS, "x"), 82, [[1, 2]], b"", 0))
    assert not ok and len(h) == 64                            # no LOOKUP locks
    fresh = prompt(25)
    assert unpack(d.call(STORE, key(fresh, 0, CS, "f"), 82, [[1, 2]], b""))[1]
    assert until(lambda: lookup(d, fresh, f"q{time.monotonic()}", end=1 * CS) == 1)
    assert lookup(d, fresh, "l", end=1 * CS) == 1
    h, ok = unpack(d.call(RETRIEVE, key(fresh, 0, CS, "l"), 82, [[1, 99]], b"", 0))
    assert not ok and len(h) == 64                            # a block outside the tensor
    other = prompt(24)
    assert unpack(d.call(STORE, key(other, 0, 3 * CS, "s"), 82, [[1, 2, 3]], b""))[1] is False
    assert lookup(d, other, "r", end=3 * CS) == 0                      # nothing half-published
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    g.close()


@pytest.mark.parametrize("how", ["storage", "offset"])
def test_a_claim_larger_than_the_allocation_is_refused(srv, how):
    """A client can claim any storage size in its handle; the server asks
    the driver (here the stand-in: the segment's size) how large the
    opened allocation really is, and refuses a tensor past it, instead of
    letting the copies reach other engines' device memory."""
    g = PagedKV("cuclaim", "fa_nhd", nl=1, nb=16, bs=16, nh=2, hs=8)
    t = g.tensors[0]
    name = t.name.encode().ljust(64, b"\0")
    if how == "storage":   # twice the blocks, in a storage claimed twice as large
        shape, nbytes, offset = [2, 32, 16, 2, 8], 2 * t.nbytes, 0
        stride = [32 * 16 * 2 * 8] + t.stride[1:]
    else:                  # the real shape, placed at an offset past the allocation's end
        shape, stride, nbytes, offset = t.shape, t.stride, t.nbytes, t.nbytes // 2
    wr = w.cuda_ipc(shape, stride, dtype=t.dtype, storage_bytes=nbytes, offset_bytes=offset,
                    mem_handle=name, version=None, event_sync=False, uuid="emul-0")
    d = srv.dealer()
    frames = d.call(REGISTER_KV_CACHE, 88, [msgpack.ExtType(1, w.dumps(wr))], "m", 1, "vllm",
                    {"kv_layout": "NHD"}, [], timeout_ms=1000)
    assert frames is None
    assert until(lambda: f"reaches past the {t.nbytes} bytes of its allocation" in srv.output())
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    g.close()


def test_unregister_with_copies_in_flight(srv):
    """The stream is drained before its mappings go: the STOREs still land
    and the server keeps serving."""
    g = PagedKV("cuflight", "fa_nhd", nl=2, nb=64, bs=16, nh=2, hs=8)
    d = srv.dealer()
    assert register(d, 83, g)
    toks = prompt(23, n_chunks=24)
    ids = list(range(1, 49))
    h, ok = unpack(d.call(STORE, key(toks, 0, 24 * CS, "s"), 83, [ids], b""))
    assert ok
    assert len(d.call(UNREGISTER_KV_CACHE, 83)) == 2
    assert until(lambda: status(srv)["storage_manager"]["l1_manager"]["num_objects"] == 24)
    assert "lmcache_kv_" not in open(f"/proc/{srv.proc.pid}/maps").read()
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()
    g.close()


def test_a_whole_arena_is_pinned_off_the_socket_thread(monkeypatch):
    """--no-l1-use-lazy: the arena is committed whole, so the first CUDA
    registration pins it, on a thread of its own, and unpins it at exit."""
    if not os.path.exists(EMUL):
        if os.environ.get("CI") == "true":
            pytest.fail(f"{EMUL} was not built")
        pytest.skip(f"{EMUL} not built")
    monkeypatch.setenv("LMCACHED_CUDA_LIB", EMUL)
    s = Server("--chunk-size", str(CS), "--no-l1-use-lazy")
    try:
        g = PagedKV("cupin", "fa_nhd", nl=2, nb=16, bs=16, nh=2, hs=8)
        d = s.dealer()
        assert register(d, 85, g)
        toks = prompt(26)
        assert unpack(d.call(STORE, key(toks, 0, CS, "s"), 85, [[1, 2]], b""))[1]
        assert until(lambda: lookup(d, toks, f"p{time.monotonic()}", end=1 * CS) == 1)
        assert "not pinned" not in s.output()
        assert len(d.call(UNREGISTER_KV_CACHE, 85)) == 2
        d.close()
        g.close()
    finally:
        assert s.stop() == 0, s.output()


def test_without_the_cuda_part_registration_is_refused(monkeypatch):
    monkeypatch.setenv("LMCACHED_CUDA_LIB", "/nonexistent/liblmcached_cuda.so")
    s = Server("--chunk-size", str(CS))
    try:
        g = PagedKV("cunone", "fa_nhd", nl=1, nb=4, bs=16, nh=2, hs=8)
        d = s.dealer()
        assert d.call(REGISTER_KV_CACHE, 84, cuda_handles(g), "m", 1, "vllm", {}, [], timeout_ms=500) is None
        assert until(lambda: "CUDA tensors need the CUDA transfer: /nonexistent" in s.output())
        assert d.call(NOOP)[2] == msgpack.packb("OK")
        d.close()
        g.close()
    finally:
        assert s.stop() == 0


def test_sglang_unified_hybrid_through_the_stream(start_server):
    """SGLang's unified layout as CudaIPCWrapper views (docs/protocol.md,
    "SGLang unified layout"): full attention, a window and recurrent state
    registered and copied by the CUDA path, byte for byte, nothing written
    outside the blocks the RETRIEVE names."""
    import test_server_driven_unified as u
    s = start_server("--chunk-size", str(u.CS), env=server_env())
    groups, store, load, writes = u.model("hybrid", "cuu")
    d = s.dealer()
    handles = [h for g in groups for h in cuda_handles(g)]
    frames = d.call(REGISTER_KV_CACHE, 91, handles, "u", 1, "sglang", u.UNIFIED,
                    u.infos(groups), timeout_ms=3000)
    assert frames is not None and len(frames) == 2, s.output()
    ukey = lambda toks, rid: u.ipc_key(toks, 0, len(toks), rid, model="u", worker_id=0)
    toks = u.prompt(31)
    _, ok = unpack(d.call(STORE, ukey(toks, "s"), 91, store, os.urandom(64)))
    assert ok
    assert until(lambda: u.lmc_lookup(d, toks, f"r{time.monotonic()}", cs=u.CS,
                                      model="u") == 3)
    assert u.lmc_lookup(d, toks, "r", cs=u.CS, model="u") == 3
    before = [g.snapshot() for g in groups]
    _, ok = unpack(d.call(RETRIEVE, ukey(toks, "r"), 91, load, b"", 0))
    assert ok
    assert until(lambda: copies_settled(s))
    for g, src_ids, dst_ids, old, (chunks, keep) in zip(groups, store, load, before, writes):
        src, dst = u.written(g, src_ids, chunks, keep), u.written(g, dst_ids, chunks, keep)
        for c in chunks:
            assert g.object_bytes(dst[c]) == g.object_bytes(src[c]), c
        u.assert_only_written(g, old, {b for ids in dst.values() for b in ids})
    assert len(d.call(UNREGISTER_KV_CACHE, 91)) == 2
    d.close()
    for g in groups:
        g.close()
