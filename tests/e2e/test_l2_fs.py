"""L2 tier over the engine-driven path (docs/l2.md): write-behind to the fs
adapter, LOOKUP hits served from L2 after L1 eviction, restart recovery,
upstream-format files, and corrupted/truncated file detection."""
import functools
import json
import os
import re
import subprocess
import time
import urllib.request

import pytest

from lmc.client import unpack
from lmc.keys import ipc_key
from lmc.ops import (CLEAR, END_SESSION, FREE_LOOKUP_LOCKS, LOOKUP, QUERY_PREFETCH_LOOKUP_HITS,
                     WAIT_PREFETCH_STATUS)
from lmc.server import Server, l2_args, l2_fs_args
from test_lookup_engine_driven import CS, Worker, chunk_bytes, lookup, prompt

SERVER_ARGS = ("--chunk-size", str(CS))


def status(srv):
    url = f"http://127.0.0.1:{srv.http_port}/status"
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())["storage_manager"]


def http_json(srv, method, path, body=None):
    """(status, decoded JSON body) of a request to srv's HTTP frontend."""
    req = urllib.request.Request(f"http://127.0.0.1:{srv.http_port}{path}",
                                 data=json.dumps(body).encode() if body is not None else None,
                                 method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def metric(srv, series):
    """The value of one /metrics series, or None while it has no sample."""
    with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/metrics", timeout=10) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
    return None


def wait_metric(srv, series, want, timeout=10):
    """Waits until the (event-driven, so asynchronous) series equals want."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if metric(srv, series) == want:
            return
        time.sleep(0.05)
    raise AssertionError(f"{series} = {metric(srv, series)}, want {want}")


def data_files(path):
    return sorted(f for f in os.listdir(path) if f.endswith(".data"))


def wait_stored(srv, path, n_files, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sc = status(srv)["store_controller"]
        if len(data_files(path)) >= n_files and sc["batches_in_flight"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"L2 store did not finish: {os.listdir(path)}")


def store_all(srv, toks):
    ws = [Worker(srv, 1001, 0), Worker(srv, 1002, 1)]
    for w in ws:
        w.store(toks, 0, len(toks))
    return ws


def file_of(path, rank, toks, c):
    """The .data file holding chunk c of rank (matched by content)."""
    want = chunk_bytes(rank, toks, c)
    for f in data_files(path):
        with open(os.path.join(path, f), "rb") as fh:
            if fh.read() == want:
                return os.path.join(path, f)
    raise AssertionError(f"no file for rank {rank} chunk {c}")


def close_all(ws, sched):
    for w in ws:
        w.close()
    sched.close()


def test_store_evict_then_hits_from_l2(tmp_path):
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))
    try:
        toks = prompt(101)
        ws = store_all(srv, toks)
        wait_stored(srv, tmp_path, 8)
        names = data_files(tmp_path)
        # Upstream's file name form: <model>@0x<kv_rank 8 hex>@<group hex>@<hash hex>.data
        assert all(re.fullmatch(r"m@0x020([01])020\1@0@[0-9a-f]{64}\.data", n) for n in names), names
        # The checksum travels in an xattr of the data file, not a sidecar
        # (docs/l2.md, "fs").
        assert all(len(os.getxattr(os.path.join(tmp_path, n), "user.lmcache.b3")) == 64
                   for n in names)
        assert not any(os.path.exists(os.path.join(tmp_path, n + ".b3")) for n in names)
        sched = srv.dealer()
        assert sched.call(CLEAR, False) is not None       # evict: L1 is empty now
        assert lookup(sched, toks, "r1", wait=True) == 4        # all four from L2
        assert unpack(sched.call(QUERY_PREFETCH_LOOKUP_HITS, "r1")) == 0  # consumed with the job
        for w in ws:
            assert w.retrieve(toks, 0, 64, "r1") == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        st = status(srv)
        assert st["num_l2_adapters"] == 1
        ad = st["l2_adapters"][0]
        assert ad["type_name"] == "fs" and ad["counters"]["stores_ok"] >= 1
        assert ad["counters"]["load_ok"] == 8 and ad["num_keys"] == 8
        assert st["prefetch_controller"]["hit_chunks"] == 4
        assert st["store_controller"]["stores_failed"] == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{srv.http_port}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        series = dict(line.rsplit(" ", 1) for line in metrics.splitlines()
                      if line.startswith("lmcache_mp_l2_"))
        assert float(series['lmcache_mp_l2_store_completed_total{l2_name="fs"}']) >= 1
        assert float(series['lmcache_mp_l2_load_completed_total{l2_name="fs"}']) >= 1
        assert float(series['lmcache_mp_l2_used_bytes{l2_name="fs"}']) > 0
        # The L2 families of docs/metrics.md, labelled by salt ("" here).
        salt = '{cache_salt=""}'
        wait_metric(srv, "lmcache_mp_l2_store_submitted_objects_total" + salt, 8)
        wait_metric(srv, "lmcache_mp_l2_store_completed_objects_total" + salt, 8)
        wait_metric(srv, "lmcache_mp_l2_prefetch_lookup_objects_total" + salt, 8)
        wait_metric(srv, "lmcache_mp_l2_prefetch_load_submitted_objects_total" + salt, 8)
        wait_metric(srv, "lmcache_mp_l2_prefetch_load_completed_total" + salt, 8)
        wait_metric(srv, "lmcache_mp_l2_prefetch_lookup_total", 1)
        wait_metric(srv, "lmcache_mp_l2_prefetch_load_submitted_total", 1)   # one adapter
        assert metric(srv, "lmcache_mp_l2_store_submitted_total") >= 1
        assert metric(srv, 'lmcache_mp_l2_store_throughput_gbs_count{l2_name="fs"}') >= 1
        assert metric(srv, 'lmcache_mp_l2_load_throughput_gbs_count{l2_name="fs"}') >= 1
        # Prefetched objects are temporary: retrieved, they are gone from L1,
        # and a new lookup loads them again.
        assert lookup(sched, toks, "r2", wait=True) == 4
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def stored_in_l2_only(srv, tmp_path, seed):
    """Stores a 4-chunk prompt from both ranks, waits for L2 to hold it and
    evicts L1; returns the prompt, the workers and a scheduler DEALER."""
    toks = prompt(seed)
    ws = store_all(srv, toks)
    wait_stored(srv, tmp_path, 8)
    sched = srv.dealer()
    assert sched.call(CLEAR, False) is not None
    return toks, ws, sched


def test_partial_l1_hits_extended_from_l2(tmp_path):
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))
    try:
        toks, ws, sched = stored_in_l2_only(srv, tmp_path, 102)
        # Chunks 0-1 back in L1 from the engine, 2-3 only in L2.
        for w in ws:
            w.store(toks, 0, 32)
        assert lookup(sched, toks, "p", wait=True) == 4
        for w in ws:
            assert w.retrieve(toks, 0, 64, "p") == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_free_lookup_locks_releases_what_l2_loaded(tmp_path):
    """The chunks an L2 prefetch loads join the lookup's lock record with the
    ids of the copies the tier locked: FREE_LOOKUP_LOCKS gives those shares
    back, and the loaded objects (temporary) leave L1 at once."""
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))
    try:
        toks, ws, sched = stored_in_l2_only(srv, tmp_path, 103)
        assert status(srv)["l1_manager"]["num_objects"] == 0
        assert lookup(sched, toks, "f", wait=True) == 4           # all four loaded from L2
        l1 = status(srv)["l1_manager"]
        assert l1["num_objects"] == 8 and l1["num_locked_objects"] == 8
        assert sched.call(FREE_LOOKUP_LOCKS, ipc_key(toks, 0, 64, "f", world_size=2), 1) is not None
        l1 = status(srv)["l1_manager"]
        assert l1["num_objects"] == 0 and l1["memory_used_bytes"] == 0, l1
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_restart_recovers_and_accepts_upstream_files(tmp_path):
    toks = prompt(103)
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))
    try:
        ws = store_all(srv, toks)
        wait_stored(srv, tmp_path, 8)
        for w in ws:
            w.close()
    finally:
        assert srv.stop() == 0, srv.output()
    # An upstream server writes raw bytes and no checksum: re-create chunk 0
    # of rank 0 that way, by hand (a new inode, without the xattr).
    f0 = file_of(tmp_path, 0, toks, 0)
    os.unlink(f0)
    with open(f0, "wb") as fh:
        fh.write(chunk_bytes(0, toks, 0))
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))
    try:
        assert status(srv)["l2_adapters"][0]["recovered_keys"] == 8
        sched = srv.dealer()
        ws = [Worker(srv, 1001, 0), Worker(srv, 1002, 1)]
        assert lookup(sched, toks, "again", wait=True) == 4
        for w in ws:
            assert w.retrieve(toks, 0, 64, "again") == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_corrupt_and_truncated_files_are_misses(tmp_path):
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))
    try:
        toks = prompt(104)
        ws = store_all(srv, toks)
        wait_stored(srv, tmp_path, 8)
        sched = srv.dealer()
        assert sched.call(CLEAR, False) is not None
        # Same size, different bytes: caught by the checksum at load.
        f3 = file_of(tmp_path, 0, toks, 3)
        with open(f3, "r+b") as fh:
            fh.seek(100)
            fh.write(b"\xff\xee")
        assert lookup(sched, toks, "c", wait=True) == 3
        for w in ws:
            assert w.retrieve(toks, 0, 48, "c") == [chunk_bytes(w.rank, toks, c) for c in range(3)]
        ad = status(srv)["l2_adapters"][0]
        assert ad["corrupt_files_detected"] == 1
        # The files were in the page cache: read and hashed piece by piece
        # on the loading thread (docs/l2.md, "Checksums").
        assert ad["cached_loads"] == 8     # every key of the prompt loads at once
        wait_metric(srv, 'lmcache_mp_l2_prefetch_failure_total{reason="not_found",'
                         'model_name="m"}', 1)
        # The same from the disk.
        f2 = file_of(tmp_path, 1, toks, 2)
        with open(f2, "r+b") as fh:
            fh.seek(200)
            fh.write(b"\x01\x02")
        for name in data_files(tmp_path):
            fd = os.open(os.path.join(tmp_path, name), os.O_RDONLY)
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            os.close(fd)
        assert sched.call(CLEAR, True) is not None
        assert lookup(sched, toks, "d", wait=True) == 2
        for w in ws:
            assert w.retrieve(toks, 0, 32, "d") == [chunk_bytes(w.rank, toks, c) for c in range(2)]
        # Dropped from the cache; how many are cached again by the time they
        # load varies (a RWF_NOWAIT read that finds nothing starts
        # readahead; seen: 0 to 8 of 8), so the pooled path is pinned down
        # with O_DIRECT in tests/unit/storage_l2/test_l2_adapters.c instead.
        # Caught either way:
        ad = status(srv)["l2_adapters"][0]
        assert ad["corrupt_files_detected"] == 3   # f3 again, and f2
        # Truncated: a miss from the lookup on.
        f1 = file_of(tmp_path, 1, toks, 1)
        with open(f1, "r+b") as fh:
            fh.truncate(100)
        assert lookup(sched, toks, "t", wait=True) == 1
        for w in ws:
            assert w.retrieve(toks, 0, 16, "t") == [chunk_bytes(w.rank, toks, 0)]
        assert status(srv)["l2_adapters"][0]["truncated_files_detected"] >= 1
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_bad_adapter_flags_exit_2(tmp_path):
    from lmc.server import run_lmcached
    r = run_lmcached("--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--l2-adapter",
                     '{"type":"fs","base_path":"/tmp/x","num_workers":0}')
    assert r.returncode == 2 and "num_workers" in r.stderr
    r = run_lmcached("--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--l2-adapter",
                     '{"type":"nope"}', "--port", "1")
    assert r.returncode == 2 and "unknown L2 adapter type 'nope'" in r.stderr
    r = run_lmcached("--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--l2-adapter",
                     json.dumps({"type": "fs", "base_path": str(tmp_path), "junk": 1}), "--port", "1")
    assert r.returncode == 2 and 'unknown field "junk"' in r.stderr
    for bad in ({"type": "fs"},                                       # missing base_path
                {"type": "s3", "s3_endpoint": "b.h", "s3_region": 5},   # wrong JSON type
                {"type": "resp", "host": "h", "port": 1,
                 "eviction": {"eviction_policy": "FIFO"}}):            # unknown policy
        r = run_lmcached("--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--l2-adapter",
                         json.dumps(bad), "--port", "1")
        assert r.returncode == 2 and "--l2-adapter[0]" in r.stderr, (bad, r.stderr)


def test_failing_adapter_degrades_to_misses(tmp_path):
    spec = {"type": "fault_inject", "fail_rate": 1.0, "seed": 7,
            "inner": {"type": "fs", "base_path": str(tmp_path)}}
    srv = Server(*SERVER_ARGS, *l2_args(spec),
                 "--l2-prefetch-load-timeout", "2")
    try:
        toks = prompt(105)
        ws = store_all(srv, toks)
        sched = srv.dealer()
        deadline = time.monotonic() + 10
        while status(srv)["store_controller"]["stores_failed"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert status(srv)["store_controller"]["stores_failed"] >= 1  # batches may merge
        assert data_files(tmp_path) == []
        assert lookup(sched, toks, "f", wait=True) == 4          # still in L1
        for w in ws:
            assert w.retrieve(toks, 0, 64, "f") is not None
        assert sched.call(CLEAR, False) is not None
        assert lookup(sched, toks, "g", wait=True) == 0          # no L2 copy: a miss, no hang
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_lookup_hits_before_load_and_retain_policy(tmp_path):
    spec = {"type": "fault_inject", "delay_rate": 1.0, "delay_ms": 300, "seed": 1,
            "inner": {"type": "fs", "base_path": str(tmp_path)}}
    srv = Server(*SERVER_ARGS, *l2_args(spec),
                 "--l2-prefetch-policy", "retain")
    try:
        toks = prompt(106)
        ws = store_all(srv, toks)
        wait_stored(srv, tmp_path, 8)
        sched = srv.dealer()
        assert sched.call(CLEAR, False) is not None
        assert sched.call(LOOKUP, ipc_key(toks, 0, 64, "h", world_size=2), 1) is not None
        assert unpack(sched.call(QUERY_PREFETCH_LOOKUP_HITS, "h")) is None   # lookup phase still running
        hits = None
        deadline = time.monotonic() + 10
        while hits is None and time.monotonic() < deadline:
            hits = unpack(sched.call(QUERY_PREFETCH_LOOKUP_HITS, "h"))
            time.sleep(0.01)
        assert hits == 4                                      # known before the loads end
        assert unpack(sched.call(WAIT_PREFETCH_STATUS, "h", 10.0, timeout_ms=15000)) == 4
        for w in ws:
            assert w.retrieve(toks, 0, 64, "h") == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        loaded = status(srv)["prefetch_controller"]["loaded_keys"]
        # retain: the prefetched chunks stayed resident, the next lookup is L1 only.
        assert lookup(sched, toks, "h2", wait=True) == 4
        assert status(srv)["prefetch_controller"]["loaded_keys"] == loaded
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_l2_eviction_keeps_the_fs_store_under_capacity(tmp_path):
    from test_lookup_engine_driven import OBJ
    spec = {"type": "fs", "base_path": str(tmp_path),
            "max_capacity_gb": 10 * OBJ / 2**30,
            "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.5,
                         "eviction_ratio": 0.5}}
    srv = Server(*SERVER_ARGS, *l2_args(spec))
    try:
        toks = prompt(111)
        ws = store_all(srv, toks)                  # 8 objects: 0.8 of capacity
        wait_stored(srv, tmp_path, 8)
        deadline = time.monotonic() + 10           # the controller ticks every second
        while len(data_files(tmp_path)) > 5:
            assert time.monotonic() < deadline, data_files(tmp_path)
            time.sleep(0.1)
        ev = status(srv)["l2_eviction_controller"]["adapters"][0]
        assert ev["eviction_policy"] == "LRU" and ev["evicted_keys"] >= 3
        assert ev["tracked_keys"] == len(data_files(tmp_path))
        wait_metric(srv, 'lmcache_mp_l2_evicted_objects_total{cache_salt=""}', ev["evicted_keys"])
        for w in ws:
            w.close()
    finally:
        assert srv.stop() == 0, srv.output()


def wait_files_at_most(path, n, timeout=10):
    deadline = time.monotonic() + timeout      # the controller ticks every second
    while len(data_files(path)) > n:
        assert time.monotonic() < deadline, data_files(path)
        time.sleep(0.1)


def test_l2_eviction_after_restart_evicts_recovered_files_first(tmp_path):
    from test_lookup_engine_driven import OBJ

    def spec(capacity_objects):
        return json.dumps({"type": "fs", "base_path": str(tmp_path),
                           "max_capacity_gb": capacity_objects * OBJ / 2**30,
                           "eviction": {"eviction_policy": "LRU", "trigger_watermark": 0.6,
                                        "eviction_ratio": 0.5}})

    srv = Server(*SERVER_ARGS, "--l2-adapter", spec(100))
    try:
        for w in store_all(srv, prompt(113)):  # 8 objects, far below the watermark
            w.close()
        wait_stored(srv, tmp_path, 8)
    finally:
        assert srv.stop() == 0, srv.output()
    # Restarted with less room: the 8 recovered files are 0.67 of it.
    srv = Server(*SERVER_ARGS, "--l2-adapter", spec(12))
    try:
        wait_files_at_most(tmp_path, 4)
        ev = status(srv)["l2_eviction_controller"]["adapters"][0]
        assert ev["recovered_keys"] == 8 and ev["evicted_keys"] == 4, ev
        assert ev["tracked_keys"] == 4 and ev["tracked_bytes"] == 4 * OBJ, ev
        old = set(data_files(tmp_path))
        toks = prompt(114)
        ws = store_all(srv, toks)             # 4 + 8 objects: the old ones go first
        deadline = time.monotonic() + 20
        while set(data_files(tmp_path)) & old or status(srv)["store_controller"]["batches_in_flight"]:
            assert time.monotonic() < deadline, data_files(tmp_path)
            time.sleep(0.1)
        # Had new files gone before the old ones, the old ones (4 of 12
        # objects' room) would sit under the watermark and never go.
        assert len(data_files(tmp_path)) >= 4
        for w in ws:
            w.close()
    finally:
        assert srv.stop() == 0, srv.output()


def test_isolated_lru_quota_usage_and_allowlist(tmp_path):
    from test_lookup_engine_driven import OBJ, Worker
    spec = {"type": "fs", "base_path": str(tmp_path),
            "eviction": {"eviction_policy": "IsolatedLRU", "trigger_watermark": 1.0,
                         "eviction_ratio": 0.5}}
    srv = Server(*SERVER_ARGS, *l2_args(spec))

    def http(method, path, body=None):  # the JSON body; these calls all succeed
        return http_json(srv, method, path, body)[1]

    try:
        assert http("PUT", "/quota/paid", {"limit_gb": 1.0})["enforced"] is True
        ws = [Worker(srv, 6001, 0), Worker(srv, 6002, 1)]
        toks = prompt(121)
        for w in ws:
            w.store(toks, 0, len(toks), salt="paid")
        wait_stored(srv, tmp_path, 8)
        got = http("GET", "/quota/paid")
        assert got["exists"] and abs(got["current_usage_gb"] * 2**30 - 8 * OBJ) < 1
        toks2 = prompt(122)                        # a tenant without a quota...
        for w in ws:
            w.store(toks2, 0, len(toks2), salt="free-rider")
        deadline = time.monotonic() + 10           # ...is wiped at the next cycle
        while http("GET", "/quota").get("users", {}).get("free-rider", {}).get(
                "current_usage_gb", 1) > 0 or len(data_files(tmp_path)) != 8:
            assert time.monotonic() < deadline, (http("GET", "/quota"), data_files(tmp_path))
            time.sleep(0.1)
        for w in ws:
            w.close()
    finally:
        assert srv.stop() == 0, srv.output()


def test_config_adapters_lists_l2_adapters(tmp_path):
    specs = [{"type": "fs", "base_path": str(tmp_path)}, {"type": "mock"}]
    srv = Server(*SERVER_ARGS, *sum((["--l2-adapter", json.dumps(s)] for s in specs), []))
    try:
        url = f"http://127.0.0.1:{srv.http_port}/config/adapters"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        assert body == {"adapters": [
            {"index": 0, "type_name": "fs", "tier": "l2", "primary": True, "reconfigurable": False},
            {"index": 1, "type_name": "mock", "tier": "l2", "primary": False,
             "reconfigurable": False}]}
    finally:
        assert srv.stop() == 0, srv.output()


def test_cache_objects_list_and_delete(tmp_path):
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))

    http = functools.partial(http_json, srv)

    try:
        toks = prompt(131)
        ws = store_all(srv, toks)
        wait_stored(srv, tmp_path, 8)
        st, page = http("GET", "/cache/objects?model_name=m")
        assert st == 200 and page["adapter"] == "fs" and page["next_page_token"] is None
        entries = page["entries"]
        assert len(entries) == 8 and all(e["size_bytes"] > 0 for e in entries)
        seen, token = [], ""
        while True:                                  # paging with page_size=3
            q = "/cache/objects?page_size=3" + (f"&page_token={token}" if token else "")
            st, p = http("GET", q)
            assert st == 200 and len(p["entries"]) <= 3
            seen += p["entries"]
            token = p["next_page_token"]
            if not token:
                break
        assert sorted(json.dumps(e["key"], sort_keys=True) for e in seen) == \
            sorted(json.dumps(e["key"], sort_keys=True) for e in entries)
        victims = [e["key"] for e in entries[:2]]
        st, res = http("DELETE", "/cache/objects", {"keys": victims})
        assert st == 200 and res == {"deleted": 2, "skipped": 0, "ok": True}
        assert len(data_files(tmp_path)) == 6
        st, res = http("DELETE", "/cache/objects", {"keys": victims})   # idempotent
        assert st == 200 and res["deleted"] == 0
        # L1 deletion respects locks unless forced; these keys are resident.
        st, res = http("DELETE", "/cache/objects", {"keys": [e["key"] for e in entries[2:4]],
                                                    "tier": "l1"})
        assert st == 200 and res["deleted"] == 2
        # Errors
        assert http("GET", "/cache/objects?tier=l1")[0] == 400
        assert http("GET", "/cache/objects?page_size=0")[0] == 422
        assert http("GET", "/cache/objects?adapter=nope")[0] == 404
        st, res = http("DELETE", "/cache/objects", {"keys": [{"chunk_hash_hex": "zz"}]})
        assert st == 400 and res["detail"].startswith("keys[0]:")
        assert http("DELETE", "/cache/objects", {"keys": [{}] * 10001})[0] == 400
        assert http("DELETE", "/cache/objects", {"keys": "x"})[0] == 422
        assert http("DELETE", "/cache/objects", {"keys": [], "tier": "l3"})[0] == 422
        for w in ws:
            w.close()
    finally:
        assert srv.stop() == 0, srv.output()


def test_warm_prefetch_from_l2(tmp_path):
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))

    http = functools.partial(http_json, srv)

    try:
        toks = prompt(141)
        ws = store_all(srv, toks)
        wait_stored(srv, tmp_path, 8)
        sched = srv.dealer()
        assert sched.call(CLEAR, False) is not None          # L1 empty, L2 has all 8
        req = {"model_name": "m", "world_size": 2, "token_ids": toks, "cache_salt": "",
               "source_tier": "l2", "target_tier": "l1"}
        st, sub = http("POST", "/cache/prefetches", req)
        assert st == 202 and sub["status"] == "submitted" and sub["chunks"] == 4
        deadline = time.monotonic() + 10
        while True:
            st, res = http("GET", "/cache/prefetches/" + sub["request_id"])
            assert st == 200
            if res["status"] == "completed":
                break
            assert res["status"] == "pending" and time.monotonic() < deadline
            time.sleep(0.05)
        assert res == {"request_id": sub["request_id"], "status": "completed",
                       "found_keys": 8, "total_keys": 8}
        assert http("GET", "/cache/prefetches/" + sub["request_id"])[0] == 404  # consumed
        loads = status(srv)["l2_adapters"][0]["counters"]["load_ok"]
        # Warm: resident in L1 and unlocked, so a LOOKUP hits without loading again...
        assert lookup(sched, toks, "w1", wait=True) == 4
        assert status(srv)["l2_adapters"][0]["counters"]["load_ok"] == loads
        for w in ws:
            assert w.retrieve(toks, 0, 64, "w1") == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        # ...and unlocked: a non-forced clear can drop them.
        assert sched.call(CLEAR, False) is not None
        assert status(srv)["l1_manager"]["num_objects"] == 0
        # Errors and the no-op.
        assert http("POST", "/cache/prefetches", {**req, "source_tier": "l1"})[0] == 400
        assert http("POST", "/cache/prefetches", {**req, "model_name": "other"})[0] == 503
        assert http("POST", "/cache/prefetches", {**req, "token_ids": "x"})[0] == 422
        assert http("POST", "/cache/prefetches", {**req, "cache_salt": "a/b"})[0] == 400
        st, res = http("POST", "/cache/prefetches", {**req, "token_ids": toks[:CS - 1]})
        assert st == 202 and res == {"chunks": 0, "status": "noop"}
        # A long prompt's JSON is past the 1 MiB of ordinary bodies but
        # within this route's limit (docs/http.md, "Request bodies").
        long_toks = [4_000_000_000 + i for i in range(300_000)]
        body = json.dumps({**req, "token_ids": long_toks})
        assert len(body) > 3 << 20
        st, res = http("POST", "/cache/prefetches", {**req, "token_ids": long_toks})
        assert st == 202 and res["status"] == "submitted", (st, res)
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_common_adapter_fields_do_what_docs_l2_says(tmp_path):
    """persist_enabled false is refused at start by name (lmcached always
    keeps L2 data); shared is reported by /status and /cache/objects
    (issue 17)."""
    from lmc.server import run_lmcached
    r = run_lmcached("--l1-size-gb", "0.0625", "--eviction-policy", "LRU", "--l2-adapter",
                     json.dumps({"type": "fs", "base_path": str(tmp_path),
                                 "persist_enabled": False}), "--port", "1")
    assert r.returncode == 2 and '--l2-adapter[0]: "persist_enabled": false' in r.stderr, r.stderr
    specs = [{"type": "fs", "base_path": str(tmp_path), "persist_enabled": True, "shared": True},
             {"type": "mock"}]
    srv = Server(*SERVER_ARGS, *sum((["--l2-adapter", json.dumps(s)] for s in specs), []))
    try:
        assert [a["shared"] for a in status(srv)["l2_adapters"]] == [True, False]
        assert http_json(srv, "GET", "/cache/objects?tier=l2&adapter=fs")[1]["shared"] is True
        assert http_json(srv, "GET", "/cache/objects?tier=l2&adapter=mock")[1]["shared"] is False
    finally:
        assert srv.stop() == 0, srv.output()


@pytest.mark.parametrize("how", ["free", "free_head", "end_session"])
def test_cancel_a_parallel_load(tmp_path, how):
    """Issue 18: FREE_LOOKUP_LOCKS or END_SESSION while the chunks of one
    prompt load in parallel (each part held 300 ms): the late load's staging
    and L2 locks are all given back, and the prompt loads again in full.  A
    free also covers the chunks that arrive after it: those of its range go
    back as they arrive (no END_SESSION needed), the others stay locked for
    the retrieve (docs/l2.md, "Prefetch (LOOKUP)")."""
    spec = {"type": "fault_inject", "delay_rate": 1.0, "delay_ms": 300, "seed": 3,
            "inner": {"type": "fs", "base_path": str(tmp_path), "num_workers": 4}}
    srv = Server(*SERVER_ARGS, *l2_args(spec))
    try:
        toks, ws, sched = stored_in_l2_only(srv, tmp_path, 111)
        done = status(srv)["prefetch_controller"]["completed"]
        assert sched.call(LOOKUP, ipc_key(toks, 0, 64, "c", world_size=2), 1) is not None
        deadline = time.monotonic() + 10
        while unpack(sched.call(QUERY_PREFETCH_LOOKUP_HITS, "c")) is None and time.monotonic() < deadline:
            time.sleep(0.01)                                # lookup done: loads running
        if how == "free":
            assert sched.call(FREE_LOOKUP_LOCKS, ipc_key(toks, 0, 64, "c", world_size=2), 1) is not None
        elif how == "free_head":
            assert sched.call(FREE_LOOKUP_LOCKS, ipc_key(toks, 0, 32, "c", world_size=2), 1) is not None
        else:
            assert sched.call(END_SESSION, "c") is not None
        assert status(srv)["prefetch_controller"]["completed"] == done   # the free was early
        while status(srv)["prefetch_controller"]["completed"] == done:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        if how == "free_head":
            # Chunks 2-3 of both ranks stay read-locked for the retrieve:
            # a non-forced CLEAR keeps them, and they come out of L1.
            assert sched.call(CLEAR, False) is not None
            assert status(srv)["l1_manager"]["num_objects"] == 4
            for w in ws:
                assert w.retrieve(toks, 32, 64, "c") == [chunk_bytes(w.rank, toks, c)
                                                         for c in (2, 3)]
            assert sched.call(END_SESSION, "c") is not None
            assert sched.call(CLEAR, False) is not None
        st = status(srv)
        assert st["l2_adapters"][0]["max_parts_in_flight"] >= 2, st["l2_adapters"][0]
        assert st["l1_manager"]["num_objects"] == 0, st["l1_manager"]
        assert st["l1_manager"]["memory_used_bytes"] == 0, st["l1_manager"]
        assert lookup(sched, toks, "c2", wait=True) == 4          # no lock or staging leaked
        for w in ws:
            assert w.retrieve(toks, 0, 64, "c2") == [chunk_bytes(w.rank, toks, c) for c in range(4)]
        close_all(ws, sched)
    finally:
        assert srv.stop() == 0, srv.output()


def test_crash_leftovers_removed_at_start(tmp_path):
    """A write cut by a crash leaves a temp file (and, on filesystems
    without xattrs, a sidecar without its data file); a restart removes the
    ones that are certainly dead and keeps everything else (docs/l2.md)."""
    dead = subprocess.Popen(["true"])
    dead.wait()                                  # a pid that runs nothing now
    old = time.time() - 120
    files = {
        "gone_old": f"k1.data.{dead.pid}.1.tmp",            # removed
        "gone_young": f"k2.data.{dead.pid}.2.tmp",          # too fresh: kept
        "alive_old": f"k3.data.{os.getpid()}.3.tmp",        # writer runs: kept
        "orphan_old": "k4.data.b3",                         # no data file: removed
        "paired_old": "k5.data.b3",                         # data file beside it: kept
        "paired_data": "k5.data",
        "foreign_old": "notes.txt",                         # not ours: kept
    }
    for role, name in files.items():
        p = tmp_path / name
        p.write_bytes(b"x")
        if role != "gone_young":
            os.utime(p, (old, old))
    srv = Server(*SERVER_ARGS, *l2_fs_args(tmp_path))
    try:
        fs = status(srv)["l2_adapters"][0]
        assert fs["leftovers_removed"] == 2, fs
        left = {p.name for p in tmp_path.iterdir()}
        assert files["gone_old"] not in left and files["orphan_old"] not in left
        for role in ("gone_young", "alive_old", "paired_old", "paired_data", "foreign_old"):
            assert files[role] in left, role
    finally:
        assert srv.stop() == 0, srv.output()
