#!/usr/bin/python3
"""`make soak`: the real lmcached with an fs L2 under a mixed workload for a
bounded time (SOAK_SECONDS, default 600), on loopback only. Issue 17.

Workload, all at once:
  * engine workers (2 processes): PREPARE/COMMIT_STORE, LOOKUP, WAIT_PREFETCH_STATUS,
    PREPARE/COMMIT_RETRIEVE over the shared-memory pool, every chunk read
    back compared with the bytes stored for its key;
  * an HTTP client: /status, /metrics, /healthcheck, /api/kv/lookup and
    /api/kv/retrieve, and a POST /cache/clear every 5 s (so lookups go to
    the fs L2 through the prefetch);
  * garbage: random and malformed ZMQ messages, raw TCP junk on the ZMQ
    port, garbage bodies to the HTTP POST routes;
  * clients that go away mid-transfer: a store left between PREPARE and
    COMMIT, a retrieve between PREPARE and COMMIT (the reaper reclaims
    both), a LOOKUP whose DEALER closes before the answer, an HTTP upload
    cut short.

Every SOAK_SAMPLE_SECONDS (default 3) the server's VmRSS, RssAnon, open
fds (/proc/<pid>/fd) and threads are sampled and /status is read (each
read runs the L1 books check). Pass criteria (docs/RELIABILITY.md):
  * no chunk read back with foreign bytes, no request left unanswered;
  * every /status read healthy, invariant_violations 0, books_checks
    growing from read to read;
  * RSS: the peak of the last third of the run is at most the peak of the
    first third (the warm-up) + SOAK_RSS_SLACK_MIB (default 8);
  * fds: the peak of the last third is at most the peak of the first
    third + 16, and once the clients are gone and the reaper has run, the
    count is back to the idle count before the load (+ 2);
  * threads: back to the idle count at the end;
  * the lease ledger settles (no WRITE or COPY lease out, no staging or
    retired buffer) within 60 s of the load's end;
  * lmcached exits 0 on SIGTERM."""
import argparse
import hashlib
import json
import mmap
import multiprocessing
import os
import random
import shutil
import socket
import sys
import tempfile
import time

import msgpack

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from rel_common import (COMMIT_RETRIEVE, CS, COMMIT_STORE, END_SESSION, LOOKUP,  # noqa: E402
                        PING, PREPARE_RETRIEVE, PREPARE_STORE,
                        REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, WAIT_PREFETCH_STATUS, BooksWatch, Dealer, Server, alive, fd_count, git_commit, http, l1,
                        metrics, rss_kib, status, thread_count)
from run import HTTP_ROUTES, garbage, http_bodies, http_send  # noqa: E402

LAYERS, HIDDEN = 2, 128
OBJ = 2 * LAYERS * CS * HIDDEN * 2            # 16 KiB float16 chunks
PROMPTS, CHUNKS = 200, 4                     # 12.5 MiB of chunks, L1 ~10 MiB: eviction runs
MODEL = "soak"
REPLY_MS = 10000
WORKER_IDS = (5_000_001, 5_000_002)          # far from the ids garbage may name


def tokens(p):
    return [(p * 7919 + i * 31) % 50000 + 1 for i in range(CHUNKS * CS)]


def expected(p, c):
    seed = hashlib.sha256(f"soak {p} {c}".encode()).digest()
    return (seed * (OBJ // len(seed) + 1))[:OBJ]


def skey(toks, end, rid, worker_id):
    return {"model_name": MODEL, "world_size": 1, "worker_id": worker_id, "token_ids": toks,
            "start": 0, "end": end, "request_id": rid, "cache_salt": "", "num_kv_readers": 1}


def reg_payload(iid):
    return {"instance_id": iid, "model_name": MODEL, "world_size": 1, "block_size": CS,
            "num_layers": LAYERS, "hidden_dim_size": HIDDEN, "dtype_str": "float16",
            "use_mla": False}


def reply(frames):
    return msgpack.unpackb(frames[2]) if frames is not None and len(frames) > 2 else None


def map_pool(rep):
    fd = os.open("/dev/shm/" + rep["shm_name"], os.O_RDWR)
    try:
        return mmap.mmap(fd, rep["pool_size"])
    finally:
        os.close(fd)


# ---- workload processes -------------------------------------------------------------

def engine_worker(url, iid, seed, deadline, out):
    import zmq
    rng = random.Random(seed)
    ctx = zmq.Context()
    d = Dealer(ctx, url)
    st = {"requests": 0, "stores": 0, "lookups": 0, "hit_chunks": 0, "retrieved_chunks": 0,
          "mismatches": 0, "errors": 0, "wait_timeouts": 0}
    cache = {}

    def exp(p, c):
        if (p, c) not in cache:
            cache[(p, c)] = expected(p, c)
        return cache[(p, c)]

    def call(*a, **kw):
        st["requests"] += 1
        r = d.call(*a, timeout_ms=REPLY_MS, **kw)
        st["errors"] += r is None
        return r

    rep = reply(call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, reg_payload(iid)))
    pool = map_pool(rep)
    i = 0
    while time.time() < deadline:
        i += 1
        p = rng.randrange(PROMPTS)
        k = skey(tokens(p), CHUNKS * CS, "s", 0)
        r = reply(call(PREPARE_STORE, k, iid))
        if r is not None:
            c = r["context"]
            for slot, idx in zip(c["slots"], c["chunk_indices"]):
                pool[slot["offset"]:slot["offset"] + OBJ] = exp(p, idx)
            if c["slots"]:
                call(COMMIT_STORE, k, iid, b"")
                st["stores"] += 1
        q = rng.randrange(PROMPTS)
        rid = f"{iid}-{i}"
        call(LOOKUP, skey(tokens(q), CHUNKS * CS, rid, None), 1)
        st["lookups"] += 1
        st["requests"] += 1
        hits = reply(d.call(WAIT_PREFETCH_STATUS, rid, 5.0, timeout_ms=REPLY_MS))
        st["wait_timeouts"] += hits is None
        if hits:
            st["hit_chunks"] += hits
            k = skey(tokens(q), hits * CS, rid, 0)
            r = reply(call(PREPARE_RETRIEVE, k, iid))
            if r and r["success"]:
                for c, slot in enumerate(r["context"]["slots"]):
                    st["mismatches"] += bytes(pool[slot["offset"]:slot["offset"] + OBJ]) != exp(q, c)
                    st["retrieved_chunks"] += 1
                call(COMMIT_RETRIEVE, k, iid)
        call(END_SESSION, rid)
        if i % 50 == 0:
            call(PING, iid)
        time.sleep(0.002)
    pool.close()
    d.close()
    ctx.destroy(linger=0)
    out.put(("engine", st))


def http_client(http_port, deadline, out):
    class Srv:
        pass
    srv = Srv()
    srv.http_port = http_port
    rng = random.Random(3)
    st = {"requests": 0, "errors": 0, "clears": 0, "kv_retrieve_200": 0, "kv_retrieve_404": 0}
    last_clear = time.time()
    while time.time() < deadline:
        p = rng.randrange(PROMPTS)
        body = {"model_name": MODEL, "tokens": tokens(p), "cache_salt": ""}
        for method, path, b in (("GET", "/status", None), ("GET", "/metrics", None),
                                ("GET", "/healthcheck", None), ("POST", "/api/kv/lookup", body),
                                ("POST", "/api/kv/retrieve", body)):
            st["requests"] += 1
            try:
                code, _ = http(srv, method, path, b, timeout=REPLY_MS / 1000)
            except OSError:
                code = None
            if path == "/api/kv/retrieve" and code in (200, 404):
                st[f"kv_retrieve_{code}"] += 1
            elif code != 200:
                st["errors"] += 1
        if time.time() - last_clear > 5:
            st["requests"] += 1
            code, _ = http(srv, "POST", "/cache/clear", {"tier": "l1"}, timeout=REPLY_MS / 1000)
            st["errors"] += code != 200
            st["clears"] += 1
            last_clear = time.time()
        time.sleep(0.05)
    out.put(("http", st))


def garbage_sender(url, port, http_port, deadline, out):
    import zmq
    rng = random.Random(5)
    ctx = zmq.Context()
    d = Dealer(ctx, url)
    valid_key = msgpack.packb(skey(tokens(0), CHUNKS * CS, "g", 0), use_bin_type=True)
    from run import GARBAGE_KINDS
    st = {"zmq_garbage": 0, "raw_tcp": 0, "http_garbage": 0, "http_5xx": 0, "http_no_answer": 0}
    i = 0
    while time.time() < deadline:
        i += 1
        d.sock.send_multipart(garbage(GARBAGE_KINDS[i % len(GARBAGE_KINDS)], rng, i, valid_key))
        st["zmq_garbage"] += 1
        while d.sock.poll(0):                 # drop what garbage got back
            d.sock.recv_multipart()
        if i % 500 == 0:
            d.close()
            d = Dealer(ctx, url)
        if i % 100 == 0:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(rng.randbytes(rng.randrange(1, 2048)))
                st["raw_tcp"] += 1
            except OSError:
                pass
        if i % 20 == 0:
            method, path, valid, allowed = rng.choice(HTTP_ROUTES)
            name, body = rng.choice([b for b in http_bodies(rng, valid) if b[0] != "over_limit"])
            code = http_send(http_port, method, path, body, {}, timeout=REPLY_MS / 1000)
            st["http_garbage"] += 1
            if isinstance(code, str):
                st["http_no_answer"] += 1
            elif code >= 500 and code not in allowed:
                st["http_5xx"] += 1
        time.sleep(0.01)
    d.close()
    ctx.destroy(linger=0)
    out.put(("garbage", st))


def quitter(url, http_port, deadline, out):
    """Clients that go away in the middle of a transfer."""
    import zmq
    ctx = zmq.Context()
    rng = random.Random(7)
    st = {"abandoned_stores": 0, "abandoned_retrieves": 0, "abandoned_lookups": 0,
          "cut_uploads": 0, "errors": 0}
    i = 0
    while time.time() < deadline:
        i += 1
        iid = 6_000_000 + i
        kind = i % 4
        if kind in (0, 1):
            d = Dealer(ctx, url)
            rep = reply(d.call(REGISTER_KV_CACHE_ENGINE_DRIVEN_CONTEXT, reg_payload(iid), timeout_ms=REPLY_MS))
            if rep is None:
                st["errors"] += 1
                d.close()
                continue
            pool = map_pool(rep)
            if kind == 0:            # a store never committed, on a prompt no one else stores
                p = 1_000_000 + i
                r = reply(d.call(PREPARE_STORE, skey(tokens(p), CHUNKS * CS, "q", 0), iid,
                                 timeout_ms=REPLY_MS))
                st["errors"] += r is None
                for slot in (r or {"context": {"slots": []}})["context"]["slots"][:2]:
                    pool[slot["offset"]:slot["offset"] + OBJ] = b"\xee" * OBJ
                st["abandoned_stores"] += 1
            else:                    # a retrieve never committed
                q = rng.randrange(PROMPTS)
                rid = f"q-{i}"
                d.call(LOOKUP, skey(tokens(q), CHUNKS * CS, rid, None), 1, timeout_ms=REPLY_MS)
                hits = reply(d.call(WAIT_PREFETCH_STATUS, rid, 5.0, timeout_ms=REPLY_MS))
                if hits:
                    d.call(PREPARE_RETRIEVE, skey(tokens(q), hits * CS, rid, 0), iid, timeout_ms=REPLY_MS)
                    st["abandoned_retrieves"] += 1
            pool.close()
            d.close()                # gone: no COMMIT, no UNREGISTER, no PING
        elif kind == 2:              # a LOOKUP whose DEALER is gone before the answer
            d = Dealer(ctx, url)
            q = rng.randrange(PROMPTS)
            d.send(LOOKUP, skey(tokens(q), CHUNKS * CS, f"gone-{i}", None), 1)
            d.send(WAIT_PREFETCH_STATUS, f"gone-{i}", 30.0)
            time.sleep(0.01)
            d.close()
            st["abandoned_lookups"] += 1
        else:                        # an HTTP upload cut short
            try:
                with socket.create_connection(("127.0.0.1", http_port), timeout=2) as s:
                    s.sendall(b"POST /api/kv/store HTTP/1.1\r\nHost: x\r\n"
                              b"X-LMCache-Model-Name: soak\r\nX-LMCache-Tokens: 1,2,3\r\n"
                              b"Content-Length: 65536\r\n\r\n" + b"\x00" * 1000)
                st["cut_uploads"] += 1
            except OSError:
                st["errors"] += 1
        time.sleep(0.5)
    ctx.destroy(linger=0)
    out.put(("quitter", st))


# ---- the run ---------------------------------------------------------------------------

def sample(srv, books, t0):
    pid = srv.proc.pid
    s = {"t": round(time.monotonic() - t0, 1), "rss_kib": rss_kib(pid),
         "anon_kib": rss_kib(pid, "RssAnon"), "fds": fd_count(pid), "threads": thread_count(pid)}
    try:
        st = books.read(srv)
        m = l1(st)
        s.update(objects=m["num_objects"], staging=m["num_staging_objects"],
                 write_out=m["leases"]["write"]["outstanding"],
                 copy_out=m["leases"]["copy"]["outstanding"],
                 contexts=st["modules"]["engine_driven_transfer"]["registered_contexts"])
    except Exception as e:  # noqa: BLE001 - an unreadable status is a finding
        s["status_error"] = repr(e)
    return s


def peak(samples, key_, lo, hi):
    xs = [s[key_] for s in samples if lo <= s["t"] < hi]
    return max(xs) if xs else 0


def main():
    ap = argparse.ArgumentParser(description="bounded soak of lmcached (issue 17)")
    ap.add_argument("--seconds", type=float, default=float(os.environ.get("SOAK_SECONDS", 600)))
    ap.add_argument("--sample-seconds", type=float,
                    default=float(os.environ.get("SOAK_SAMPLE_SECONDS", 3)))
    ap.add_argument("--rss-slack-mib", type=float,
                    default=float(os.environ.get("SOAK_RSS_SLACK_MIB", 8)))
    ap.add_argument("--json", help="write the samples and the summary to this file")
    a = ap.parse_args()
    commit = git_commit()
    tmp = tempfile.mkdtemp(prefix="lmc-soak-")
    srv = Server("--chunk-size", str(CS), "--l1-size-gb", "0.01",
                 "--worker-reap-timeout-seconds", "30", "--worker-registration-grace-seconds", "30",
                 "--l2-adapter", json.dumps({"type": "fs", "base_path": tmp}))
    pid = srv.proc.pid
    print(f"soak: lmcached {pid} at {commit}, {a.seconds:.0f} s, fs L2 in {tmp}, "
          f"ZMQ {srv.port}, HTTP {srv.http_port}", flush=True)
    books = BooksWatch()
    failures = []
    samples = []
    summary = {}
    rc = None
    try:
        time.sleep(0.5)
        idle = {"fds": fd_count(pid), "threads": thread_count(pid), "rss_kib": rss_kib(pid)}
        m0 = metrics(srv)
        t0 = time.monotonic()
        deadline = time.time() + a.seconds
        spawn = multiprocessing.get_context("spawn")
        out = spawn.Queue()
        procs = [spawn.Process(target=engine_worker, args=(srv.url, iid, n, deadline, out))
                 for n, iid in enumerate(WORKER_IDS)]
        procs.append(spawn.Process(target=http_client, args=(srv.http_port, deadline, out)))
        procs.append(spawn.Process(target=garbage_sender,
                                   args=(srv.url, srv.port, srv.http_port, deadline, out)))
        procs.append(spawn.Process(target=quitter, args=(srv.url, srv.http_port, deadline, out)))
        for p in procs:
            p.start()
        next_print = 0
        while time.time() < deadline:
            s = sample(srv, books, t0)
            samples.append(s)
            if s["t"] >= next_print:
                print(f"  t={s['t']:6.0f}s rss={s['rss_kib'] / 1024:6.1f}MiB "
                      f"anon={s['anon_kib'] / 1024:6.1f}MiB fds={s['fds']} "
                      f"threads={s['threads']} objects={s.get('objects')} "
                      f"contexts={s.get('contexts')}", flush=True)
                next_print = s["t"] + max(30, a.seconds / 20)
            if not srv.alive():
                failures.append("lmcached died during the load")
                break
            time.sleep(max(0.0, min(a.sample_seconds, deadline - time.time())))
        load_end = time.monotonic() - t0
        results = {}
        for _ in procs:
            try:
                kind, st = out.get(timeout=60)
            except Exception:  # noqa: BLE001
                failures.append("a workload process did not report")
                break
            tot = results.setdefault(kind, {})
            for k, v in st.items():
                tot[k] = tot.get(k, 0) + v
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
                failures.append(f"{p.name} hung")
        # The abandoned instances are reaped within 1.25 x 30 s; then the
        # ledger settles and the fds are back to idle.
        t_settle = time.monotonic()
        settled = None
        while time.monotonic() - t_settle < 60:
            s = sample(srv, books, t0)
            samples.append(s)
            if (s.get("write_out") == 0 and s.get("copy_out") == 0 and s.get("staging") == 0
                    and l1(status(srv))["num_retired_buffers"] == 0
                    and s["fds"] <= idle["fds"] + 2):
                settled = time.monotonic() - t_settle
                break
            time.sleep(1)
        end = sample(srv, books, t0)
        samples.append(end)
        m1 = metrics(srv)
        server_alive = alive(srv)
        third = load_end / 3
        rss_warm = peak(samples, "rss_kib", 0, third)
        rss_late = peak(samples, "rss_kib", 2 * third, load_end)
        fds_warm = peak(samples, "fds", 0, third)
        fds_late = peak(samples, "fds", 2 * third, load_end)
        rss_peak = max(s["rss_kib"] for s in samples)
        fds_peak = max(s["fds"] for s in samples)
        thr_peak = max(s["threads"] for s in samples)
        eng = results.get("engine", {})
        htc = results.get("http", {})
        gar = results.get("garbage", {})
        qui = results.get("quitter", {})
        requests = (eng.get("requests", 0) + htc.get("requests", 0) + gar.get("zmq_garbage", 0)
                    + gar.get("http_garbage", 0))
        rpc = m1.get("lmcache_mp_rpc_received_total", 0) - m0.get("lmcache_mp_rpc_received_total", 0)
        status_errors = [s["status_error"] for s in samples if "status_error" in s]
        mib = 1024.0
        summary = {
            "commit": commit, "seconds": round(load_end), "samples": len(samples),
            "rss_mib start/peak/end": f"{idle['rss_kib'] / mib:.1f}/{rss_peak / mib:.1f}/"
                                      f"{end['rss_kib'] / mib:.1f}",
            "rss_mib peak first third/last third": f"{rss_warm / mib:.1f}/{rss_late / mib:.1f}",
            "rss_anon_mib end": f"{end['anon_kib'] / mib:.1f}",
            "fds start/peak/end": f"{idle['fds']}/{fds_peak}/{end['fds']}",
            "fds peak first third/last third": f"{fds_warm}/{fds_late}",
            "threads start/peak/end": f"{idle['threads']}/{thr_peak}/{end['threads']}",
            "requests done (clients)": requests,
            "rpc messages received (server)": int(rpc),
            "engine": eng, "http": htc, "garbage": gar, "quitters": qui,
            "errors": eng.get("errors", 0) + htc.get("errors", 0) + qui.get("errors", 0)
                      + gar.get("http_5xx", 0) + gar.get("http_no_answer", 0),
            "data mismatches": eng.get("mismatches", 0),
            "invariant violations": books.violations,
            "L1 books": books.summary(),
            "ledger settled after load (s)": None if settled is None else round(settled, 1),
            "fs L2 files": len([f for f in os.listdir(tmp) if f.endswith(".data")]),
        }
        # The criteria (module docstring).
        if summary["data mismatches"]:
            failures.append(f"{summary['data mismatches']} chunks read back with foreign bytes")
        if summary["errors"]:
            failures.append(f"{summary['errors']} requests unanswered or failed")
        if eng.get("retrieved_chunks", 0) == 0 or eng.get("stores", 0) == 0:
            failures.append("the engine workers did not store and retrieve")
        if status_errors:
            failures.append(f"{len(status_errors)} /status reads failed: {status_errors[:3]}")
        try:
            books.assert_ok()
        except AssertionError as e:
            failures.append(f"L1 books: {e}")
        if rss_late > rss_warm + a.rss_slack_mib * 1024:
            failures.append(f"RSS grew after the warm-up: last third peak {rss_late / mib:.1f} MiB"
                            f" > first third peak {rss_warm / mib:.1f} + {a.rss_slack_mib} MiB")
        if fds_late > fds_warm + 16:
            failures.append(f"fds grew after the warm-up: {fds_late} > {fds_warm} + 16")
        if end["fds"] > idle["fds"] + 2:
            failures.append(f"fds at the end {end['fds']} > idle {idle['fds']} + 2")
        if end["threads"] > idle["threads"]:
            failures.append(f"threads at the end {end['threads']} > idle {idle['threads']}")
        if settled is None:
            failures.append(f"the lease ledger did not settle within 60 s: {end}")
        if not server_alive:
            failures.append("lmcached did not answer after the load")
    finally:
        rc = srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    if rc != 0:
        failures.append(f"lmcached exited {rc} on SIGTERM")
    summary["exit status"] = rc
    print("\nsoak summary")
    for k, v in summary.items():
        print(f"  {k}: {v}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "samples": samples, "failures": failures}, f, indent=1)
    if failures:
        print("\nSOAK FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("\nsoak passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
