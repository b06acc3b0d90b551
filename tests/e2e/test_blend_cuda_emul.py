"""CacheBlend's GPU path (issue 35; docs/cacheblend.md, "The GPU path") on
a machine without a GPU: lmcached loads the CPU stand-in of
liblmcached_cuda.so (tests/cuda_emul/cuda_emul.c), and the stand-in runs
CacheBlend's CUDA kernels built for the host (tests/gpu/host_shim/,
libblend_host_plugin.so, through LMCACHED_CUDA_EMUL_BLEND) on the emulated
device memory, which is host memory.  What runs is lmcached's own code: a
blend instance registered with CUDA IPC handles, its cos/sin cache opened
from a CUDA IPC handle (shape and mscale read back through the plugin),
STOREs through the stream, the unified lookup, and
CB_RETRIEVE_PRE_COMPUTED waiting on the client's event, enqueueing the
plan, replying with a fresh event and giving the read locks back behind
the stream.  The bytes are checked against the float64 reference of
blend_client.py, as test_blend.py checks the CPU path."""
import os
import time

import msgpack
import pytest

import blend_client as bc
from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import CLEAR, END_SESSION, REGISTER_KV_CACHE, STORE, UNREGISTER_KV_CACHE
from lmc.server import ROOT
from paged_kv import PagedKV
from test_blend import (BS, CS, DST, DST2, EXPECTED, HINTS, HS, MAX_POSITION, NB, NEW_PROMPT, NH,
                        NL, changed_slots, check_found, check_scattered, noop_answers,
                        registered_chunks, slots_of, snapshot, src_blocks, status,
                        stored_prompt)
from test_server_driven_cuda_emul import cuda_handles
import wrappers as w

EMUL = os.environ.get("LMCACHED_CUDA_EMUL", os.path.join(ROOT, "build", "libcuda_emul.so"))
KERNELS = os.environ.get("LMCACHED_CUDA_EMUL_BLEND",
                         os.path.join(os.path.dirname(EMUL), "libblend_host_plugin.so"))
SERVER_ARGS = ("--engine-type", "blend", "--chunk-size", str(CS), "--rpc-error-frames")


def server_env():
    """The emulator and the host build of the blend kernels; without them
    the test is skipped (failed under CI=true)."""
    for lib in (EMUL, KERNELS):
        if not os.path.exists(lib):
            if os.environ.get("CI") == "true":
                pytest.fail(f"{lib} was not built")
            pytest.skip(f"{lib} not built")
    return {"LMCACHED_CUDA_LIB": EMUL, "LMCACHED_CUDA_EMUL_BLEND": KERNELS}


def cache_handle(cache, uuid="emul-0", name=None):
    """A CudaIPCWrapper of a RopeCache's segment (the emulator's memory
    handle is the segment's name)."""
    t = cache.t
    raw = (name or t.name).encode().ljust(64, b"\0")
    wr = w.cuda_ipc(t.shape, t.stride, dtype=t.dtype, storage_bytes=t.nbytes, mem_handle=raw,
                    version=None, event_sync=False, uuid=uuid)
    return msgpack.ExtType(1, w.dumps(wr))


def settled(srv):
    """Every lease is back: the stream has passed every copy and plan."""
    leases = status(srv)["storage_manager"]["l1_manager"]["leases"]
    return leases["copy"]["outstanding"] == 0 and leases["write"]["outstanding"] == 0


def until(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class CudaWorker:
    """One vLLM worker whose paged KV `g` is registered as CUDA tensors."""

    def __init__(self, srv, instance, g):
        self.srv, self.id, self.g = srv, instance, g
        self.d = srv.dealer()
        frames = self.d.call(REGISTER_KV_CACHE, instance, cuda_handles(g), "m", 1, "vllm",
                             {"kv_layout": HINTS[g.fmt]}, [])
        assert frames is not None and len(frames) == 2, srv.output()[-3000:]

    def store_documents(self, seed):
        r = bc.rng(seed)
        for i in range(4):
            bc.fill_blocks(self.g, src_blocks(i), r)
            key = ipc_key(stored_prompt(i), 0, 3 * CS, f"store-{i}", worker_id=0, model="m",
                          world_size=1)
            h, ok = unpack(self.d.call(STORE, key, self.id, [src_blocks(i)], os.urandom(64)))
            assert ok and len(h) == 64, (h, ok)
            self.d.call(END_SESSION, f"store-{i}")
        assert registered_chunks(self.srv, 8) == 8
        assert until(lambda: settled(self.srv))   # published behind the stream

    def close(self):
        self.d.close()
        self.g.close()


def fresh(reply, seen, ran):
    """A reply [handle, scatter_ran]: a 64-byte event recorded by the
    server (never a client's, never one handed out before) and ran."""
    h, got = reply
    assert got is ran, reply
    assert len(h) == 64 and h[:4] == b"emul" and h not in seen, reply
    seen.add(h)


LAYOUTS = [  # fmt, K/V dtype, NeoX, rot_dim, cache dtype, mscale baked into the cache
    ("fa_nhd", "bfloat16", True, 16, "float32", 1.0),
    ("fa_hnd", "float32", False, 8, "float16", 1.0),
    ("fa_nhd", "bfloat16", False, 16, "float32", 1.5),     # YaRN-like
]


@pytest.mark.parametrize("fmt,dtype,neox,rot_dim,cache_dtype,mscale", LAYOUTS)
def test_retrieve_runs_the_plan_on_the_device(srv, fmt, dtype, neox, rot_dim, cache_dtype,
                                              mscale):
    """Documents stored through the stream, found at other positions: the
    retrieve replies a fresh 64-byte event and true, V lands verbatim and
    K re-rotated in exactly the matched slots (by a pure rotation where
    the cache carries an mscale: the server divides it out, spec §2.2),
    and the read locks go back once the stream passed the plan."""
    g = PagedKV(f"cbcu_{fmt}", fmt, nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype=dtype)
    wk = CudaWorker(srv, 7, g)
    cache = bc.RopeCache(f"cbcu_{fmt}", MAX_POSITION, rot_dim, cache_dtype)
    if mscale != 1:
        cache.t.mm[:] = bc.encode([mscale * v for r in cache.rows for v in r], cache_dtype)
    assert len(bc.register_rope(wk.d, 7, [cache_handle(cache)], HS, neox)) == 2
    assert status(srv)["modules"]["blend"]["rope_instances"] == 1
    wk.store_documents(seed=LAYOUTS.index((fmt, dtype, neox, rot_dim, cache_dtype, mscale)))

    found = check_found(bc.unified_lookup(wk.d, NEW_PROMPT, "new", CS))
    before = snapshot(g)
    client = os.urandom(64)
    seen = {client}
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "new", CS, found, [DST], 7, event=client), seen, True)
    assert until(lambda: changed_slots(g, before) == slots_of(DST, found))
    check_scattered(g, found, DST, cache, neox, rot_dim)
    assert until(lambda: settled(srv)), status(srv)["storage_manager"]["l1_manager"]["leases"]
    counts = status(srv)["modules"]["blend"]["counts"]
    assert counts["retrieves_ok"] == 1 and counts["chunks_scattered"] == len(EXPECTED), counts
    noop_answers(wk.d)
    cache.close()
    wk.close()


@pytest.fixture
def world(srv):
    g = PagedKV("cbcu_out", "fa_nhd", nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    wk = CudaWorker(srv, 5, g)
    wk.cache = bc.RopeCache("cbcu_out", MAX_POSITION, HS)
    assert len(bc.register_rope(wk.d, 5, [cache_handle(wk.cache)], HS, True)) == 2
    wk.store_documents(seed=1)
    yield wk
    wk.cache.close()
    wk.close()


def test_every_outcome_replies_a_fresh_event(world, srv):
    """The outcomes of the spec's table on the GPU path (§5.1, §5.2), each
    with an event the server recorded: deferred (true, nothing written),
    scattered, repeated (true, nothing rewritten), straddling (false),
    objects gone (false)."""
    wk, g = world, world.g
    seen = set()
    found = check_found(bc.unified_lookup(wk.d, NEW_PROMPT, "a", CS))
    before = snapshot(g)
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "a", CS, found, [DST[:2]], 5, event=os.urandom(64)),
          seen, True)
    assert changed_slots(g, before) == set()
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "a", CS, found, [DST], 5, event=os.urandom(64)),
          seen, True)
    assert until(lambda: changed_slots(g, before) == slots_of(DST, found))
    check_scattered(g, found, DST, wk.cache, True, HS)
    b0, s0 = DST[23 // BS], 23 % BS
    for kv in (0, 1):
        bc.write_row(g, kv, 0, b0, s0, 0, b"\x5a" * (HS * 2))
    after = snapshot(g)
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "a", CS, found, [DST], 5, event=os.urandom(64)),
          seen, True)
    assert changed_slots(g, after) == set()

    found = check_found(bc.unified_lookup(wk.d, NEW_PROMPT, "b", CS))
    before = snapshot(g)
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "b", CS, found, [DST2[:8]], 5), seen, False)
    fake = bc.match(16, 0, b"\xee" * 32, CS)
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "c", CS, [fake], [DST2], 5), seen, False)
    found = check_found(bc.unified_lookup(wk.d, NEW_PROMPT, "e", CS))
    assert wk.d.call(CLEAR, True) is not None
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "f", CS, found, [DST2], 5), seen, False)
    assert changed_slots(g, before) == set()
    assert until(lambda: settled(srv))
    noop_answers(wk.d)


def test_bad_cos_sin_caches_are_refused_and_the_server_serves_on(srv):
    """CB_REGISTER_ROPE for a CUDA instance refuses, naming the reason, a
    handle that opens nothing, a cache on another device, a CPU shared
    cache, an all-zero cache and a cache larger than its allocation; no rope state is kept, a retrieve then raises, a good
    cache registers after them, and goes with its instance."""
    g = PagedKV("cbcu_bad", "fa_nhd", nl=NL, nb=8, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    wk = CudaWorker(srv, 9, g)
    cache = bc.RopeCache("cbcu_bad", MAX_POSITION, HS)
    zero = bc.RopeCache("cbcu_zero", MAX_POSITION, HS)
    zero.t.mm[:] = bytes(len(zero.t.mm))
    big = w.cuda_ipc([2 * MAX_POSITION, HS], [HS, 1], dtype="float32",
                     storage_bytes=2 * cache.t.nbytes,
                     mem_handle=cache.t.name.encode().ljust(64, b"\0"), version=None,
                     event_sync=False, uuid="emul-0")
    for handle, why in [(cache_handle(cache, name="/lmcache_no_such_segment"),
                         "cannot open the memory handle"),
                        (cache_handle(cache, uuid="emul-1"), "no device with that UUID"),
                        (cache.handle(), "CPU shared tensor"),
                        (cache_handle(zero), "every value is zero"),
                        (msgpack.ExtType(1, w.dumps(big)), "allocation")]:
        msg = bc.error_message(bc.register_rope(wk.d, 9, [handle], HS, True))
        assert msg is not None and "CB_REGISTER_ROPE 9" in msg and why in msg, (why, msg)
        noop_answers(wk.d)
    assert status(srv)["modules"]["blend"]["rope_instances"] == 0
    msg = bc.error_message(bc.retrieve_frames(wk.d, NEW_PROMPT, "x", CS, [], [DST[:8]], 9))
    assert msg is not None and "no rope state" in msg, msg
    assert len(bc.register_rope(wk.d, 9, [cache_handle(cache)], HS, True)) == 2
    assert status(srv)["modules"]["blend"]["rope_instances"] == 1
    # Unregistering the instance drops its rope state and closes the cache.
    assert len(wk.d.call(UNREGISTER_KV_CACHE, 9)) == 2
    assert until(lambda: status(srv)["modules"]["blend"]["rope_instances"] == 0)
    noop_answers(wk.d)
    zero.close()
    cache.close()
    wk.close()


def test_without_the_device_executor_the_retrieve_answers_false(start_server):
    """A plugin whose blend_execute cannot run plans (the emulator without
    the host build of the kernels): the retrieve answers a fresh event and
    false, the reason in the log, nothing written, the locks given back."""
    env = dict(server_env())
    env["LMCACHED_CUDA_EMUL_BLEND"] = ""
    s = start_server(*SERVER_ARGS, env=env)
    g = PagedKV("cbcu_none", "fa_nhd", nl=NL, nb=NB, bs=BS, nh=NH, hs=HS, dtype="bfloat16")
    wk = CudaWorker(s, 4, g)
    cache = bc.RopeCache("cbcu_none", MAX_POSITION, HS)
    assert len(bc.register_rope(wk.d, 4, [cache_handle(cache)], HS, True)) == 2
    wk.store_documents(seed=2)
    found = check_found(bc.unified_lookup(wk.d, NEW_PROMPT, "n", CS))
    before = snapshot(g)
    fresh(bc.retrieve(wk.d, NEW_PROMPT, "n", CS, found, [DST], 4, event=os.urandom(64)),
          set(), False)
    assert until(lambda: "LMCACHED_CUDA_EMUL_BLEND" in s.output())
    assert changed_slots(g, before) == set()
    assert until(lambda: settled(s))
    noop_answers(wk.d)
    cache.close()
    wk.close()
