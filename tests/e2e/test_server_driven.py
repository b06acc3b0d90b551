"""Server-driven ("lmcache_driven") transfer ops as far as they are built
(docs/protocol.md, "Server-driven transfer ops"): REGISTER_KV_CACHE reads
the engine's tensor handles, pickled by Python's own pickle from stand-ins
of upstream's wrapper classes, and refuses the registration with a log line
that names what it read or what it refused; UNREGISTER_KV_CACHE of an
instance the server does not know is answered.  Hostile pickles are never
run and the server keeps serving."""
import os
import sys
import time

import msgpack
import pytest

from conftest import Server

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "pickles"))
import gen_vectors  # noqa: E402
import wrappers as w  # noqa: E402

REG, UNREG, NOOP = 1, 2, 24


def ext(data):
    return msgpack.ExtType(1, data)


def register(srv, d, instance, handles):
    payload = [instance, handles, "org/model", 1, "vllm", {}, []]
    return d.call(REG, *payload, timeout_ms=500)


def wait_for_log(srv, text, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in srv.output():
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def srv():
    s = Server()
    yield s
    assert s.stop() == 0, s.output()


def test_register_reads_the_handles_and_refuses_with_the_reason(srv):
    d = srv.dealer()
    layers = [ext(w.dumps(w.cpu_shm(f"/lmcache_kv_77_{i}", [2, 64, 16, 2, 8])))
              for i in range(4)]
    assert register(srv, d, 77, layers) is None           # not answered, as upstream
    assert wait_for_log(srv, "REGISTER_KV_CACHE 77: 4 tensors (CpuShmTensorWrapper float16 "
                             "[2, 64, 16, 2, 8], ...) read"), srv.output()
    cuda = [ext(gen_vectors.vectors()[0]["cuda_ipc_v2"])]
    assert register(srv, d, 78, cuda) is None
    assert wait_for_log(srv, "REGISTER_KV_CACHE 78: 1 tensors (CudaIPCWrapper bfloat16 "
                             "[2, 1000, 16, 8, 128], ...)"), srv.output()
    assert d.call(NOOP)[2] == msgpack.packb("OK")
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
    assert register(srv, d, 5, [good, bad]) is None
    assert wait_for_log(srv, f"REGISTER_KV_CACHE 5: kv_cache[1]: "), srv.output()
    assert reason in srv.output(), srv.output()
    assert not os.path.exists(gen_vectors.PWNED)
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()


def test_malformed_registrations_keep_the_server_serving(srv):
    d = srv.dealer()
    assert register(srv, d, 9, []) is None
    assert wait_for_log(srv, "kv_cache must be a list of 1..4096 tensor handles")
    assert register(srv, d, 9, [b"not an ext"]) is None
    assert wait_for_log(srv, "kv_cache[0] is not a msgpack ext type 1")
    assert d.call(REG, "nine", timeout_ms=500) is None
    assert wait_for_log(srv, "instance_id must be an int")
    assert d.call(NOOP)[2] == msgpack.packb("OK")
    d.close()


def test_unregister_of_an_unknown_instance_is_answered(srv):
    d = srv.dealer()
    frames = d.call(UNREG, 77)
    assert frames is not None and len(frames) == 2    # void: [uid, op]
    assert wait_for_log(srv, "UNREGISTER_KV_CACHE: instance 77 is not registered")
    d.close()


def test_engine_driven_mode_leaves_the_ops_unanswered(start_server):
    s = start_server("--supported-transfer-mode", "engine_driven")
    d = s.dealer()
    assert d.call(UNREG, 77, timeout_ms=500) is None
    d.close()
