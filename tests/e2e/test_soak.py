"""Several worker processes store, look up and retrieve overlapping prompts
through the engine-driven path at once, while another process keeps
clearing the cache (forced) and the L1 is small enough that eviction runs:
every chunk a retrieve hands back must be exactly the bytes stored for its
key, and the server must stay healthy. This is where a slot given to two
owners at once (a freed buffer still being copied) shows up.

Healthy is read, not assumed: /status is polled during the load and once
after it. Every read runs the L1 books check (docs/storage.md,
"Invariants"); the test requires the check's count (`books_checks`) to
grow from read to read, no broken rule (`invariant_violations` 0,
`is_healthy` true) in any of them, and the lease ledger settled at the
end."""
import hashlib
import json
import mmap
import multiprocessing
import os
import threading
import time
import urllib.request

import msgpack

from lmc.client import Dealer
from lmc.keys import ipc_key
from lmc.ops import (CLEAR, COMMIT_RETRIEVE, COMMIT_STORE, END_SESSION, LOOKUP, NOOP,
                     PREPARE_RETRIEVE, PREPARE_STORE, QUERY_PREFETCH_STATUS,
                     REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT)

CS, LAYERS, HIDDEN = 16, 2, 1024
OBJ = 2 * LAYERS * CS * HIDDEN * 2              # 128 KiB float16 chunks
PROMPTS, CHUNKS = 12, 4
SECONDS = 12


def tokens(p):
    return [(p * 1009 + i * 7) % 50000 + 1 for i in range(CHUNKS * CS)]


def expected(p, c):
    seed = hashlib.sha256(f"soak {p} {c}".encode()).digest()
    return (seed * (OBJ // len(seed) + 1))[:OBJ]


def reply(frames):
    return msgpack.unpackb(frames[2]) if frames is not None and len(frames) > 2 else None


def worker(url, instance_id, seed, out):
    """One engine worker: store, look up, retrieve and check, in a loop."""
    import random

    import zmq
    rng = random.Random(seed)
    ctx = zmq.Context()
    d = Dealer(ctx, url)
    stats = {"stores": 0, "retrieved_chunks": 0, "mismatches": 0, "errors": 0}
    reg = {"instance_id": instance_id, "model_name": "soak", "world_size": 1,
           "block_size": CS, "num_layers": LAYERS, "hidden_dim_size": HIDDEN,
           "dtype_str": "float16", "use_mla": False}
    rep = reply(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, reg))
    assert rep, "REGISTER got no reply: is the server alive?"
    fd = os.open("/dev/shm/" + rep["shm_name"], os.O_RDWR)
    pool = mmap.mmap(fd, rep["pool_size"])
    os.close(fd)
    deadline = time.monotonic() + SECONDS
    i = 0
    while time.monotonic() < deadline:
        i += 1
        p = rng.randrange(PROMPTS)
        k = ipc_key(tokens(p), 0, CHUNKS * CS, "s", model="soak", worker_id=0, newest=False)
        ctx_ = (reply(d.call(PREPARE_STORE, k, instance_id)) or {}).get("context")
        if ctx_ is None:
            stats["errors"] += 1
            continue
        for slot, idx in zip(ctx_["slots"], ctx_["chunk_indices"]):
            pool[slot["offset"]:slot["offset"] + OBJ] = expected(p, idx)
        if ctx_["slots"]:
            d.call(COMMIT_STORE, k, instance_id, b"")
            stats["stores"] += 1
        rid = f"{instance_id}-{i}"
        q = rng.randrange(PROMPTS)
        d.call(LOOKUP, ipc_key(tokens(q), 0, CHUNKS * CS, rid, model="soak", newest=False), 1)
        hits = None
        while hits is None and time.monotonic() < deadline + 5:  # no frame while running
            hits = reply(d.call(QUERY_PREFETCH_STATUS, rid, timeout_ms=500))
        if hits:
            k = ipc_key(tokens(q), 0, hits * CS, rid, model="soak", worker_id=0, newest=False)
            r = reply(d.call(PREPARE_RETRIEVE, k, instance_id))
            if r and r["success"]:
                for c, slot in enumerate(r["context"]["slots"]):
                    got = bytes(pool[slot["offset"]:slot["offset"] + OBJ])
                    stats["mismatches"] += got != expected(q, c)
                    stats["retrieved_chunks"] += 1
                d.call(COMMIT_RETRIEVE, k, instance_id)
        d.call(END_SESSION, rid)
    pool.close()
    d.close()
    ctx.destroy(linger=0)
    out.put(stats)


def clearer(url, out):
    """An operator clearing the cache over and over (forced: no frame)."""
    import zmq
    ctx = zmq.Context()
    d = Dealer(ctx, url)
    clears = 0
    deadline = time.monotonic() + SECONDS
    while time.monotonic() < deadline:
        if d.call(CLEAR) is not None:
            clears += 1
        time.sleep(0.01)
    d.close()
    ctx.destroy(linger=0)
    out.put({"clears": clears})


def l1_status(srv):
    url = f"http://127.0.0.1:{srv.http_port}/status"
    with urllib.request.urlopen(url, timeout=10) as r:
        st = json.loads(r.read())
    return st, st["storage_manager"]["l1_manager"]


def poll_status(srv, stop, reads, failures):
    """Reads /status every 0.2 s until stop is set; keeps each read's L1
    health and check count, and what went wrong reading it."""
    while not stop.is_set():
        try:
            st, l1 = l1_status(srv)
            reads.append((st["is_healthy"], l1["is_healthy"], l1["invariant_violations"],
                          l1["books_checks"]))
        except Exception as e:  # noqa: BLE001 - a failed read is a finding too
            failures.append(repr(e))
        stop.wait(0.2)


def assert_books_checked(reads):
    """Every read healthy, no violation, and the check ran for each one."""
    assert reads, "no /status read succeeded"
    broken = [r for r in reads if not (r[0] and r[1]) or r[2] != 0]
    assert not broken, f"unhealthy or violated L1 books in {len(broken)} reads: {broken[:5]}"
    checks = [r[3] for r in reads]
    assert all(b > a for a, b in zip(checks, checks[1:])), f"books_checks did not grow: {checks}"


def test_workers_and_clears_never_see_foreign_bytes(start_server):
    srv = start_server("--chunk-size", str(CS), "--l1-size-gb", "0.005")  # ~40 chunks
    spawn = multiprocessing.get_context("spawn")
    out = spawn.Queue()
    procs = [spawn.Process(target=worker, args=(srv.url, 2000 + w, w, out)) for w in range(4)]
    procs.append(spawn.Process(target=clearer, args=(srv.url, out)))
    stop, reads, read_failures = threading.Event(), [], []
    poller = threading.Thread(target=poll_status, args=(srv, stop, reads, read_failures))
    for pr in procs:
        pr.start()
    poller.start()
    try:
        results = [out.get(timeout=SECONDS + 60) for _ in procs]
    finally:   # a process that died or hangs must not hang the test run too
        stop.set()
        poller.join(15)
        for pr in procs:
            pr.join(10)
            if pr.is_alive():
                pr.kill()
        assert srv.alive(), srv.output()
    for pr in procs:
        assert pr.exitcode == 0
    totals = {}
    for r in results:
        for name, value in r.items():
            totals[name] = totals.get(name, 0) + value
    print("soak totals:", totals)
    assert totals["mismatches"] == 0, totals
    assert totals["errors"] == 0, totals
    # The run did exercise what it is about.
    assert totals["clears"] > 100 and totals["stores"] > 100, totals
    assert totals["retrieved_chunks"] > 100, totals
    d = srv.dealer()
    assert d.call(NOOP)[2] == b"\xa2OK"
    d.close()
    # The books, as the server checked them during the load and after it.
    assert not read_failures, read_failures[:5]
    assert len(reads) >= SECONDS, f"only {len(reads)} /status reads during the load"
    st, l1 = l1_status(srv)
    reads.append((st["is_healthy"], l1["is_healthy"], l1["invariant_violations"],
                  l1["books_checks"]))
    print(f"/status reads: {len(reads)}, books_checks {reads[0][3]} -> {reads[-1][3]}")
    assert_books_checked(reads)
    # Every worker committed what it prepared and gave back what it
    # retrieved: no lease out, no staging or retired buffer left.
    leases = l1["leases"]
    assert leases["write"]["outstanding"] == 0 and leases["copy"]["outstanding"] == 0, leases
    assert l1["num_staging_objects"] == 0 and l1["num_retired_buffers"] == 0, l1
    assert leases["returned_twice"] == 0, leases
    assert "L1 invariant broken" not in srv.output()
