"""lmcached driven by upstream LMCache's own code (lmcache 0.5.6 from PyPI,
tests/upstream/README.md): its ZMQ client and typed RPC contract, its key,
descriptor and payload types, vLLM's scheduler and worker adapters in
server-driven mode over CPU shared tensors, its engine-driven shared-memory
context and its token hasher.  Nothing here reimplements upstream: where a
test needs bytes or layouts, it computes them with torch from the engine's
own tensors and compares with what came back."""
import ctypes
import glob
import json
import mmap
import os
import signal
import sys
import time
import types
import urllib.request

import msgpack
import pytest
import zmq

from conftest import ROOT, Server, free_port

sys.path.insert(0, os.path.join(ROOT, "tests", "pickles"))
import descriptors  # noqa: E402

CS = 256                      # lmcached's default chunk size
L, BS, H, D = 2, 16, 2, 32    # layers, tokens per block, heads, head size
TIMEOUT = 10.0


@pytest.fixture(scope="session")
def up(upstream):
    """The upstream names the tests use, imported once the platform fills
    are in place (compat.py)."""
    from lmcache.integration.vllm.vllm_multi_process_adapter import (
        LMCacheMPSchedulerAdapter, LMCacheMPWorkerAdapter, LoadStoreOp, ParallelStrategy)
    from lmcache.utils import EngineType
    from lmcache.v1.multiprocess.custom_types import (
        BlockAllocationRecord, IPCCacheServerKey, RegisterEngineDrivenContextPayload)
    from lmcache.v1.multiprocess.group_view import EngineGroupInfo
    from lmcache.v1.multiprocess.rpc import get_rpc_specs
    from lmcache.v1.multiprocess.token_hasher import TokenHasher
    from lmcache.v1.multiprocess.transfer_context import (
        EngineDrivenContextMetadata, EngineDrivenContextShm, create_engine_driven_context)
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory
    from lmcache.v1.multiprocess.transport.zmq_impl.wire import LEGACY_OPERATION_IDS
    from lmcache.v1.platform.base.ipc_wrapper import DeviceIPCWrapper
    from lmcache.v1.platform.devices.cpu.shm import CpuShmTensorWrapper
    import torch
    return types.SimpleNamespace(**locals())


def client(up, srv):
    return up.RequestClientFactory.create(srv.url, context=zmq.Context.instance())


def strategy(up):
    return up.ParallelStrategy(mla_only=False, vllm_world_size=1, vllm_worker_id=0, tp_size=1,
                               pp_size=1, n_servers=1)


def extra(mode, **more):
    cfg = {"lmcache.mp.mp_transfer_mode": mode, "lmcache.mp.mq_timeout": TIMEOUT,
           "lmcache.mp.heartbeat_interval": 1.0}
    cfg.update({f"lmcache.mp.{k}": v for k, v in more.items()})
    return cfg


def until(pred, timeout=TIMEOUT, every=0.02):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(every)
    return pred()


def prompt(seed, n_tokens):
    return [(seed * 7919 + i * 31) % 50000 + 1 for i in range(n_tokens)]


def key(up, tokens, start, end, rid, worker_id=0, model="m"):
    return up.IPCCacheServerKey(model_name=model, world_size=1, worker_id=worker_id,
                                token_ids=tuple(tokens), start=start, end=end, request_id=rid,
                                num_kv_readers=1)


def paged_kv(up, nb, seed):
    """vLLM's KV cache on a CPU: per layer [2, blocks, block size, heads,
    head size] (NHD), random fp16."""
    g = up.torch.Generator().manual_seed(seed)
    return {f"model.layers.{i}.self_attn": up.torch.randn(2, nb, BS, H, D, generator=g)
            .to(up.torch.float16) for i in range(L)}


def chunk_of(up, kv, blocks, c):
    """Chunk c of the blocks as an engine-driven object holds it:
    [2, layers, chunk tokens, heads x head size]."""
    per = CS // BS
    ids = up.torch.tensor(blocks[c * per:(c + 1) * per])
    layers = [t[:, ids].reshape(2, CS, H * D) for t in kv.values()]
    return up.torch.stack(layers, dim=1)


def wait_finished(w, store=None, retrieve=None):
    """get_finished() until the request shows up as finished."""
    seen = {}

    def done():
        sending, recving = w.get_finished({store} if store else set())
        seen.setdefault("sending", set()).update(sending or ())
        seen.setdefault("recving", set()).update(recving or ())
        return (not store or store in seen["sending"]) and \
            (not retrieve or retrieve in seen["recving"])

    assert until(done), f"not finished: {seen}"


def stores(srv):
    """lmcached's server-driven STORE counts: (succeeded, failed)."""
    url = f"http://127.0.0.1:{srv.http_port}/metrics"
    with urllib.request.urlopen(url, timeout=5) as r:
        values = {line.split()[0]: float(line.split()[1]) for line in r.read().decode().splitlines()
                  if line.startswith("lmcache_mp_server_driven_store")}
    return (values["lmcache_mp_server_driven_stores_total"],
            values["lmcache_mp_server_driven_store_failures_total"])


def hash_log_hashes(log_dir):
    rows = []
    for path in sorted(glob.glob(os.path.join(log_dir, "*"))):
        with open(path) as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


# ---- the client and the typed contract -----------------------------------

def test_management_ops_through_upstream_client(lmcached, up):
    """Every reply decodes with upstream's own typed decoder (a reply of the
    wrong type would raise here)."""
    srv = lmcached()
    c = client(up, srv)
    assert c.noop().result(timeout=5) == "OK"
    assert c.get_chunk_size().result(timeout=5) == CS
    # The KV event log is on by default (docs/kv_events.md); 0.5.6 subscribes
    # only where "kv_event_stream" is advertised, so it leaves this alone.
    assert c.get_experimental().result(timeout=5) == ["kv_events"]
    assert c.ping(None).result(timeout=5) is True
    assert c.ping(12345).result(timeout=5) is True
    assert c.query_prefetch_status("nobody").result(timeout=5) == 0   # unknown id, as upstream
    assert c.end_session("nobody").result(timeout=5) is None
    rec = up.BlockAllocationRecord(req_id="r", new_block_ids=[1, 2], new_token_ids=[5, 6])
    assert c.report_block_allocation(7, "m", [rec]).result(timeout=5) is None
    assert c.unregister_kv_cache(777).result(timeout=5) is None
    assert c.unregister_kv_cache_engine_driven_context(778).result(timeout=5) is None
    assert c.clear().result(timeout=5) is None
    assert c.clear(True).result(timeout=5) is None
    c.close()


def test_ops_lmcached_does_not_serve_are_dropped_and_logged(lmcached, up):
    """Upstream 0.5.6's contract has ops lmcached does not serve (CacheBlend,
    Q caches, the KV event stream, server modules:
    docs/compatibility.md).  Each gets upstream's own answer to an op it
    has no handler for: none, the op logged; the server keeps serving."""
    served = {"register_kv_cache", "unregister_kv_cache", "store", "retrieve", "lookup",
              "query_prefetch_status", "wait_prefetch_status", "free_lookup_locks",
              "end_session", "register_kv_cache_engine_driven_context",
              "unregister_kv_cache_engine_driven_context", "prepare_store", "commit_store",
              "prepare_retrieve", "commit_retrieve", "clear", "get_chunk_size", "ping",
              "report_block_allocation", "noop", "get_experimental", "p2p_lookup_and_lock",
              "p2p_query_lookup_results", "p2p_unlock_objects"}
    specs = up.get_rpc_specs()
    unserved = sorted(set(specs) - served)
    assert unserved == ["cb_protocol_handshake", "cb_register_rope", "cb_reorder_plan",
                        "cb_retrieve_pre_computed", "cb_unified_lookup", "cb_unregister_rope",
                        "register_q_cache", "server_module_call", "store_q",
                        "subscribe_kv_events", "unregister_q_cache"]
    srv = lmcached()
    c = client(up, srv)
    futures = {}
    for name in unserved:
        args = [0] * len(specs[name].signature.parameters)
        futures[name] = getattr(c, name)(*args)
        time.sleep(0.12)   # lmcached logs at most 10 dropped requests a second
    time.sleep(0.5)
    for name, fut in futures.items():
        if name == "subscribe_kv_events":   # a stream: nothing arrived on it
            continue
        assert not fut.query(), f"{name} was answered"
    assert c.noop().result(timeout=5) == "OK"
    log = srv.output()
    for name in unserved:
        wire = up.LEGACY_OPERATION_IDS.get(name)
        shown = f"{wire}" if wire is not None else f"'{name}'"
        assert f"no handler registered for request type {shown}\n" in log, (name, log[-3000:])
    c.close()


def test_p2p_serving_ops_with_upstreams_own_types(lmcached, up, tmp_path):
    """Upstream's P2P requester calls (its client, ObjectKey and
    MemoryLayoutDesc encoders, its TransferChannelAddress decoder) against
    lmcached's serving side (docs/p2p.md, "Serving side"): the leased
    objects' addresses decode, point at the stored bytes, and unlock."""
    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from test_lookup_engine_driven import CS as ECS, HIDDEN, LAYERS, OBJ, chunk_bytes
    from test_p2p_serve import RANK1, status, store_prompt
    from lmc.server import l2_fs_args
    srv = lmcached("--chunk-size", str(ECS), *l2_fs_args(tmp_path))
    w, toks, wire_keys = store_prompt(srv, tmp_path, 11, n_chunks=2)
    keys = [ObjectKey(chunk_hash=k["chunk_hash"], model_name="m", kv_rank=RANK1)
            for k in wire_keys]
    keys.append(ObjectKey(chunk_hash=b"\x07" * 32, model_name="m", kv_rank=RANK1))
    desc = MemoryLayoutDesc(shapes=[up.torch.Size([2, LAYERS, ECS, HIDDEN])],
                            dtypes=[up.torch.float16])
    c = client(up, srv)
    task = c.p2p_lookup_and_lock(keys, {0: desc}).result(timeout=5)
    assert isinstance(task, int)
    addrs = c.p2p_query_lookup_results(task).result(timeout=5)
    assert [a.is_valid() for a in addrs] == [True, True, False]
    for chunk, a in enumerate(addrs[:2]):
        assert a.size == OBJ
        assert w.pool[a.offset:a.offset + a.size] == chunk_bytes(0, toks, chunk)
    assert c.p2p_query_lookup_results(task).result(timeout=5) is None
    assert status(srv)["leases_held"] == 2
    assert c.p2p_unlock_objects(keys).result(timeout=5) is None
    assert status(srv)["leases_held"] == 0
    c.close()
    w.close()


def test_descriptors_are_byte_for_byte_what_upstream_encodes(up):
    """tests/pickles/descriptors.py, which the C unit tests and the fuzz
    corpus are made from, writes the bytes upstream's encoder writes."""
    name = f"/lmc_up_desc_{os.getpid()}"
    nbytes = 2 * 8 * BS * H * D * 2 + 80
    fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, nbytes)
        mm = mmap.mmap(fd, nbytes)
        flat = up.torch.frombuffer(mm, dtype=up.torch.float16)
        whole = flat[:2 * 8 * BS * H * D].view(2, 8, BS, H, D)
        view = flat[40:40 + 2 * 8 * BS * H * D].view(2, 8, BS, H, D)
        for tensor, offset in ((whole, 0), (view, 40)):
            wrapper = up.CpuShmTensorWrapper(tensor, name, segment_nbytes=nbytes)
            ours = descriptors.cpu_shm(name, [2, 8, BS, H, D], storage_offset=offset,
                                       nbytes=nbytes)
            assert up.DeviceIPCWrapper.Serialize(wrapper) == ours
        del flat, whole, view
        mm.close()
    finally:
        os.close(fd)
        os.unlink("/dev/shm" + name)


# ---- vLLM's adapters, server-driven over CPU shared tensors ---------------

def test_vllm_adapters_store_lookup_retrieve(lmcached, up, tmp_path):
    """The scheduler and worker adapters of upstream's vLLM connector, as
    vLLM drives them: the worker registers its KV tensors (upstream moves
    them into shared memory and sends 0.5.6 descriptors), stores a prompt
    of two chunks and a partial block, the scheduler looks it up, the
    worker retrieves it into other blocks.  Then an engine-driven worker
    reads the same objects through upstream's shared-memory context, and
    lmcached's chunk hashes are upstream's TokenHasher's."""
    log_dir = tmp_path / "hashes"
    srv = lmcached("--cpu-kv-layout", "hint", "--lookup-hash-log-dir", str(log_dir))
    ctx = zmq.Context.instance()
    sched = up.LMCacheMPSchedulerAdapter([srv.url], ctx, "m", BS, strategy(up),
                                         extra_config=extra("lmcache_driven"))
    w = up.LMCacheMPWorkerAdapter(srv.url, ctx, "m", BS, strategy(up),
                                  extra_config=extra("lmcache_driven"))
    kv = paged_kv(up, nb=96, seed=1)
    w.register_kv_caches(kv, [up.EngineGroupInfo(0, tuple(range(L)), BS)], {"kv_layout": "NHD"})
    assert "server-driven instance" in srv.output()

    tokens = prompt(1, 2 * CS + 7)
    src = list(range(1, 34))                 # 32 blocks of two chunks, and the partial one
    w.submit_store_request("s1", up.LoadStoreOp(token_ids=tokens, block_ids=[src], start=0,
                                                end=2 * CS), w.create_recorded_event())
    wait_finished(w, store="s1")
    assert stores(srv) == (1, 0)

    sched.maybe_submit_lookup_request("r1", tokens)
    assert until(lambda: sched.check_lookup_result("r1") is not None)
    assert sched.check_lookup_result("r1") == 2 * CS

    dst = list(range(50, 83))
    before = {n: t.clone() for n, t in kv.items()}
    for t in kv.values():
        t[:, dst] = 0
    w.submit_retrieve_request("r1", up.LoadStoreOp(token_ids=tokens, block_ids=[dst], start=0,
                                                   end=2 * CS), w.create_recorded_event())
    wait_finished(w, retrieve="r1")
    assert not w.get_block_ids_with_load_errors()
    for n, t in kv.items():
        assert up.torch.equal(t[:, dst[:32]], before[n][:, src[:32]]), n
        assert not t[:, dst[32]].any(), "the partial block was written"
    sched.end_session("r1")

    # The same objects, read by an engine-driven worker of the same model.
    c = client(up, srv)
    payload = up.RegisterEngineDrivenContextPayload(
        instance_id=4242, model_name="m", world_size=1, block_size=BS, num_layers=L,
        hidden_dim_size=H * D, dtype_str="float16", use_mla=False)
    reg = c.register_kv_cache_engine_driven_context(payload).result(timeout=TIMEOUT)
    ed = up.create_engine_driven_context(up.EngineDrivenContextMetadata(None, BS, False), c,
                                         TIMEOUT, reg.shm_name, reg.pool_size)
    assert isinstance(ed, up.EngineDrivenContextShm)
    sched.maybe_submit_lookup_request("r2", tokens)
    assert until(lambda: sched.check_lookup_result("r2") is not None)
    chunks = ed.prepare_retrieve(key(up, tokens, 0, 2 * CS, "r2"), 4242)
    assert chunks is not None and len(chunks) == 2
    for i in range(2):
        assert up.torch.equal(chunks[i], chunk_of(up, before, src, i)), i
    assert ed.commit_retrieve(key(up, tokens, 0, 2 * CS, "r2"), 4242) is True
    sched.end_session("r2")
    ed.close()
    c.close()

    hasher = up.TokenHasher(chunk_size=CS, hash_algorithm="blake3")
    theirs = [up.TokenHasher.hash_to_bytes(h).hex()
              for h in hasher.compute_chunk_hashes(tokens)]
    rows = until(lambda: [r for r in hash_log_hashes(log_dir) if r.get("request_id") == "r1"])
    assert rows and rows[0]["hashes"] == theirs[:2], (rows, theirs)

    w.shutdown()
    sched.shutdown()
    assert until(lambda: "unregistered" in srv.output())


def test_vllm_worker_reregisters_after_a_server_restart(lmcached, up):
    """Upstream's heartbeat notices a restarted server and registers the
    KV caches again, which the new lmcached accepts: stores work again."""
    port = free_port()
    srv = lmcached("--cpu-kv-layout", "hint", port=port)
    ctx = zmq.Context.instance()
    w = up.LMCacheMPWorkerAdapter(srv.url, ctx, "m", BS, strategy(up),
                                  extra_config=extra("lmcache_driven", heartbeat_interval=0.3))
    kv = paged_kv(up, nb=40, seed=2)
    w.register_kv_caches(kv, [up.EngineGroupInfo(0, tuple(range(L)), BS)], {"kv_layout": "NHD"})
    tokens = prompt(2, CS)
    w.submit_store_request("a", up.LoadStoreOp(token_ids=tokens, block_ids=[list(range(1, 17))],
                                               start=0, end=CS), w.create_recorded_event())
    wait_finished(w, store="a")

    srv.stop(signal.SIGKILL)
    assert until(lambda: not w.is_healthy, timeout=15), "the heartbeat never noticed"
    srv2 = lmcached("--cpu-kv-layout", "hint", port=port)
    assert until(lambda: w.is_healthy, timeout=15), "the worker never recovered"
    assert "server-driven instance" in srv2.output()
    w.submit_store_request("b", up.LoadStoreOp(token_ids=tokens, block_ids=[list(range(1, 17))],
                                               start=0, end=CS), w.create_recorded_event())
    wait_finished(w, store="b")
    assert stores(srv2) == (1, 0)
    sched = up.LMCacheMPSchedulerAdapter([srv2.url], ctx, "m", BS, strategy(up),
                                         extra_config=extra("lmcache_driven"))
    sched.maybe_submit_lookup_request("q", tokens)
    assert until(lambda: sched.check_lookup_result("q") is not None)
    assert sched.check_lookup_result("q") == CS
    sched.end_session("q")
    w.shutdown()
    sched.shutdown()


# ---- engine-driven, through upstream's shared-memory context --------------

def test_engine_driven_store_and_retrieve_through_upstream_context(lmcached, up):
    """The prepare/commit protocol as upstream's EngineDrivenContextShm runs
    it: slots in lmcached's pool, filled in place, committed; a second
    prepare finds everything cached; a retrieve after a LOOKUP gives the
    bytes back.  (The worker adapter's own gather from paged tensors needs
    torch >= 2.1, tests/upstream/README.md, so the chunks are filled here.)"""
    srv = lmcached()
    c = client(up, srv)
    ctx = zmq.Context.instance()
    w = up.LMCacheMPWorkerAdapter(srv.url, ctx, "m", BS, strategy(up),
                                  extra_config=extra("engine_driven"))
    kv = paged_kv(up, nb=8, seed=3)
    w.register_kv_caches(kv, [up.EngineGroupInfo(0, tuple(range(L)), BS)], {"kv_layout": "NHD"})
    assert "engine-driven instance" in srv.output()

    payload = up.RegisterEngineDrivenContextPayload(
        instance_id=99, model_name="m", world_size=1, block_size=BS, num_layers=L,
        hidden_dim_size=H * D, dtype_str="float16", use_mla=False)
    reg = c.register_kv_cache_engine_driven_context(payload).result(timeout=TIMEOUT)
    assert reg.shm_name and reg.pool_size > 0
    ed = up.create_engine_driven_context(up.EngineDrivenContextMetadata(None, BS, False), c,
                                         TIMEOUT, reg.shm_name, reg.pool_size)
    assert isinstance(ed, up.EngineDrivenContextShm)
    tokens = prompt(3, 3 * CS)
    k = key(up, tokens, 0, 3 * CS, "s")
    slots, indices = ed.prepare_store(k, 99)
    assert indices == [0, 1, 2]
    g = up.torch.Generator().manual_seed(4)
    written = []
    for s in slots:
        assert tuple(s.shape) == (2, L, CS, H * D) and s.dtype == up.torch.float16
        s.copy_(up.torch.randn(s.shape, generator=g).to(up.torch.float16))
        written.append(s.clone())
    assert ed.commit_store(k, 99, slots) is True
    assert ed.prepare_store(k, 99) == ([], [])     # everything is cached now

    sched = up.LMCacheMPSchedulerAdapter([srv.url], ctx, "m", BS, strategy(up),
                                         extra_config=extra("engine_driven"))
    assert ed.prepare_retrieve(key(up, tokens, 0, 3 * CS, "nolookup"), 99) is None
    sched.maybe_submit_lookup_request("r", tokens)
    assert until(lambda: sched.check_lookup_result("r") is not None)
    assert sched.check_lookup_result("r") == 3 * CS
    got = ed.prepare_retrieve(key(up, tokens, 0, 3 * CS, "r"), 99)
    assert got is not None and [up.torch.equal(a, b) for a, b in zip(got, written)] == [True] * 3
    assert ed.commit_retrieve(key(up, tokens, 0, 3 * CS, "r"), 99) is True
    sched.end_session("r")
    assert sched.reset_cache() is True
    sched.maybe_submit_lookup_request("r3", tokens)
    assert until(lambda: sched.check_lookup_result("r3") is not None)
    assert sched.check_lookup_result("r3") == 0
    ed.close()
    w.shutdown()
    sched.shutdown()
    c.close()


# ---- error paths -----------------------------------------------------------

def test_error_paths_answer_as_upstream_expects(lmcached, up):
    srv = lmcached()
    c = client(up, srv)
    tokens = prompt(5, CS)
    # A STORE or RETRIEVE for an instance that never registered: an empty
    # event handle and false, which upstream's adapter treats as a failure.
    assert c.store(key(up, tokens, 0, CS, "s"), 999, [[1]], b"").result(timeout=5) == \
        (b"", False)
    assert c.retrieve(key(up, tokens, 0, CS, "s"), 999, [[1]], b"", 0).result(timeout=5) == \
        (b"", False)
    # A registration naming a segment that does not exist: no reply (as
    # upstream's server, whose handler raises), the reason in the log.
    name = f"/lmc_up_missing_{os.getpid()}"
    nbytes = 2 * 4 * BS * H * D * 2
    fd = os.open("/dev/shm" + name, os.O_CREAT | os.O_RDWR, 0o600)
    os.ftruncate(fd, nbytes)
    mm = mmap.mmap(fd, nbytes)
    os.close(fd)
    t = up.torch.frombuffer(mm, dtype=up.torch.float16).view(2, 4, BS, H, D)
    wrapper = up.CpuShmTensorWrapper(t, name)
    os.unlink("/dev/shm" + name)
    f = c.register_kv_cache(5, [wrapper], "m", 1, up.EngineType.VLLM, {"kv_layout": "NHD"},
                            [up.EngineGroupInfo(0, (0,), BS)])
    assert until(lambda: "cannot open segment " + name in srv.output(), timeout=5), \
        srv.output()[-2000:]
    assert not f.query()
    del t
    mm.close()
    # A key whose cache salt upstream itself refuses never leaves the client.
    with pytest.raises(ValueError):
        up.IPCCacheServerKey(model_name="m", world_size=1, worker_id=0, token_ids=(1,),
                             start=0, end=1, request_id="x", cache_salt="a@b")
    assert c.noop().result(timeout=5) == "OK"
    c.close()


def test_the_libstdcxx_fill_replaces_like_std_string(upstream):
    """cxx_compat.c against Python's own string slicing, overlapping cases
    included: a wrong fill would corrupt upstream's strings silently."""
    lib = ctypes.CDLL(os.environ["LMC_UPSTREAM_CXX_COMPAT"])
    fn = lib._ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE15_M_replace_coldEPcmPKcmm
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p,
                   ctypes.c_size_t, ctypes.c_size_t]
    text = b"0123456789abcdefghijklmnopqrstuvwxyz"
    cases = 0
    for pos in range(0, 12, 3):
        for len1 in range(0, 6):
            for src in range(0, 20, 4):
                for len2 in range(0, 6):
                    tail = len(text) - pos - len1
                    buf = ctypes.create_string_buffer(text, 64)
                    base = ctypes.addressof(buf)
                    fn(None, base + pos, len1, base + src, len2, tail)
                    want = text[:pos] + text[src:src + len2] + text[pos + len1:]
                    assert buf.raw[:len(want)] == want, (pos, len1, src, len2)
                    cases += 1
    assert cases == 4 * 6 * 5 * 6
