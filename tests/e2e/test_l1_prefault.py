"""The L1 pre-fault (docs/storage.md, "Pre-fault"): the server answers
before its pool is committed and faulted in; a request that arrives while
the pre-fault runs is served at once, a STORE included; /status follows the
pre-fault to its end, every byte of the pool committed and faulted in."""
import json
import time
import urllib.request

from lmc.ops import NOOP
from test_lookup_engine_driven import CS, Worker, prompt

GIB = 1 << 30


def prefault(srv):
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/status", timeout=10) as r:
        arena = json.load(r)["storage_manager"]["l1_arena"]
    return arena, arena["prefault"]


def test_requests_are_served_while_the_pool_is_faulted_in(start_server):
    srv = start_server("--l1-size-gb", "2", "--chunk-size", str(CS))   # seconds of pre-fault on a small VM
    d = srv.dealer()
    w = Worker(srv, 3201, 0, world_size=1)
    try:
        # Served during the pre-fault: the answer came, and /status still
        # says "running" after it.
        served_during = []
        for i in range(50):
            t0 = time.monotonic()
            assert d.call(NOOP, timeout_ms=2000) is not None
            noop_s = time.monotonic() - t0
            stored = w.store(prompt(100 + i), 0, 4 * CS)["chunk_indices"]
            _, pf = prefault(srv)
            if pf["state"] != "running":
                break
            served_during.append((noop_s, stored))
        assert served_during, "the pre-fault was over before the first request"
        for noop_s, stored in served_during:
            assert noop_s < 0.5, served_during   # not queued behind the pre-fault
            assert stored == [0, 1, 2, 3], served_during
        deadline = time.monotonic() + 120
        while prefault(srv)[1]["state"] == "running":
            assert time.monotonic() < deadline, "the pre-fault did not end"
            time.sleep(0.05)
        arena, pf = prefault(srv)
        assert pf["state"] == "done", pf
        assert pf["target_bytes"] == pf["populated_bytes"] == 2 * GIB, pf
        assert arena["committed_bytes"] == arena["size_bytes"] == 2 * GIB, arena
        assert pf["method"] in ("madv_populate_write", "touch") and pf["seconds"] > 0, pf
        assert isinstance(pf["transparent_hugepages"], str), pf
    finally:
        w.close()
        d.close()
