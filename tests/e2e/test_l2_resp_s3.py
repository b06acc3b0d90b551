"""L2 over Redis (resp) and an S3 endpoint (moto_server), end to end through
the engine-driven path: write-behind, hits from L2 after L1 eviction, a
restart of lmcached over the same store, and a Redis outage that degrades
to L1-only and recovers without restarting lmcached."""
import json
import shutil
import signal
import socket
import subprocess
import time

import pytest

from conftest import Server, free_port
from test_l2_fs import close_all, lookup_wait, status, store_all
from test_lookup_engine_driven import CLEAR, CS, Worker, chunk_bytes, prompt


def wait_port(port, proc, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"port {port} never opened")


def start_redis(port):
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1",
                             "--save", "", "--appendonly", "no"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    return proc


def stop(proc):
    proc.send_signal(signal.SIGKILL)
    proc.wait()


@pytest.fixture
def redis_port():
    if not shutil.which("redis-server"):
        pytest.fail("redis-server is missing (the Makefile installs it)")
    port = free_port()
    proc = start_redis(port)
    yield port
    if proc.poll() is None:
        stop(proc)


@pytest.fixture
def moto_endpoint():
    if not shutil.which("moto_server"):
        pytest.skip("moto_server (Python moto) is not installed on this machine")
    port = free_port()
    proc = subprocess.Popen(["moto_server", "-H", "127.0.0.1", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_port(port, proc)
    yield f"lmcache.127.0.0.1:{port}"
    proc.terminate()
    proc.wait()


def start(spec):
    return Server("--chunk-size", str(CS), "--l2-adapter", json.dumps(spec))


def wait_l2(srv, n_keys, timeout=20):
    """Waits until n_keys keys in all went to the adapter and none is still
    in flight.  The store controller picks each worker's commit up on its own,
    so an idle controller alone does not mean every rank's keys were seen."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = status(srv)
        sc = st["store_controller"]
        if sc["batches_in_flight"] == 0 and sc["keys_submitted"] >= n_keys:
            return st
        time.sleep(0.05)
    raise AssertionError(f"L2 store did not finish: {status(srv)}")


def round_trip(spec, rid_prefix):
    """Store, evict, hit from L2; then restart lmcached: still hits."""
    srv = start(spec)
    toks = prompt(201)
    try:
        ws = store_all(srv, toks)
        wait_l2(srv, 8)
        sched = srv.dealer()
        assert sched.call(CLEAR, False) is not None
        assert lookup_wait(sched, toks, rid_prefix + "a") == 4
        for w in ws:
            got = w.retrieve(toks, 0, 4 * CS, rid_prefix + "a")
            assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()
    srv = start(spec)  # a fresh server: only the L2 store remembers
    try:
        sched = srv.dealer()
        ws = [Worker(srv, 2001, 0), Worker(srv, 2002, 1)]  # registers the layout
        assert lookup_wait(sched, toks, rid_prefix + "b") == 4
        for w in ws:
            got = w.retrieve(toks, 0, 4 * CS, rid_prefix + "b")
            assert got == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_resp_round_trip_and_restart(redis_port):
    round_trip({"type": "resp", "host": "127.0.0.1", "port": redis_port, "num_workers": 2}, "r")


def test_s3_round_trip_and_restart(moto_endpoint):
    round_trip({"type": "s3", "s3_endpoint": moto_endpoint, "disable_tls": True,
                "aws_access_key_id": "test", "aws_secret_access_key": "test",
                "s3_create_bucket": True}, "s")


def test_redis_outage_degrades_then_recovers():
    port = free_port()
    redis = start_redis(port)
    srv = start({"type": "resp", "host": "127.0.0.1", "port": port, "num_workers": 2,
                 "timeout_ms": 500})
    try:
        ws = [Worker(srv, 3001, 0), Worker(srv, 3002, 1)]
        sched = srv.dealer()
        stop(redis)                                   # Redis goes away mid-run
        toks = prompt(202)
        for w in ws:
            w.store(toks, 0, len(toks))
        assert lookup_wait(sched, toks, "o1") == 4    # still served from L1
        st = wait_l2(srv, 8)                          # all 8 keys tried, and failed
        assert st["store_controller"]["stores_failed"] >= 1, st
        assert st["l2_adapters"][0]["counters"]["stores_ok"] == 0, st
        assert srv.alive()
        redis = start_redis(port)                     # back, same port
        toks2 = prompt(203)
        for w in ws:
            w.store(toks2, 0, len(toks2))
        st = wait_l2(srv, 16)                         # new chunks reach Redis again
        assert st["l2_adapters"][0]["counters"]["stores_ok"] >= 1, st
        assert sched.call(CLEAR, False) is not None
        assert lookup_wait(sched, toks2, "o2") == 4   # from Redis
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()
        if redis.poll() is None:
            stop(redis)
