#!/usr/bin/env python3
"""lmcached beside upstream LMCache's own MP server, one workload, one run
(issue 28; BENCHMARKS.md, "Beside upstream's server").

    make bench-upstream          # sets up build-tools/upstream-venv, runs this
    build-tools/upstream-venv/bin/python bench/upstream_bench.py [--rounds N]

Both servers run on this machine with the same flags that matter (chunk
size 256, a 2 GiB L1 in shared memory, LRU, engine-driven transfers, one
worker thread per pool), and one client drives both: upstream's own
(ZmqMultiprocessClient and its EngineDrivenContextShm), so the client's
cost is the same on both sides.  Each round, in turn on each server:

  noop       NOOP round trips, one at a time, through upstream's client and
             through a bare DEALER (the server's own cost);
  lookup     LOOKUP of a 32k-token prompt no server holds (128 chunks hashed,
             nothing found) and of one it holds (128 chunks hashed and found,
             read-locked), each until its prefetch job answers, then
             END_SESSION;
  store      engine-driven store of 128 chunks (2 MiB each, 256 MiB):
             PREPARE_STORE, the client fills the slots, COMMIT_STORE;
  retrieve   LOOKUP, PREPARE_RETRIEVE, the client copies the chunks out,
             COMMIT_RETRIEVE.

Ratio = lmcached's speed / upstream's speed (above 1: lmcached is faster).
Round 1 runs on fresh servers; the steady state is the median of the later
rounds.  The machine's own copy speed (torch copy of 256 MiB) is printed
first: the store and retrieve rows include the client's copies at that
speed."""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CS, CHUNKS = 256, 128
LAYERS, HIDDEN = 2, 1024          # one chunk object: 2 x 2 x 256 x 1024 x fp16 = 2 MiB


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(argv, env, log):
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


# Upstream's server as `lmcache server` starts it, with two things first:
# torch imported before lmcache (as in an engine's process; lmcache's native
# module, loaded first, pulls torch's libraries in before torch has set
# itself up), and GCC 13's one std::string helper that module needs and
# Debian 12's libstdc++ lacks (tests/upstream/cxx_compat.c).
LAUNCH = ("import sys, ctypes, runpy, torch; "
          "ctypes.CDLL(sys.argv[1], mode=ctypes.RTLD_GLOBAL); "
          "sys.argv = ['lmcache-server'] + sys.argv[2:]; "
          "runpy.run_module('lmcache.v1.multiprocess.server', run_name='__main__', "
          "alter_sys=True)")


def servers(build, workdir):
    """(name, url, process) for lmcached and upstream's server."""
    env = dict(os.environ)
    compat = os.path.join(build, "libupstream_cxx_compat.so")
    p1, p2 = free_port(), free_port()
    common = ["--chunk-size", str(CS), "--eviction-policy", "LRU", "--max-workers", "1",
              "--supported-transfer-mode", "engine_driven"]
    lm = start([os.path.join(build, "lmcached"), "--host", "127.0.0.1", "--port", str(p1),
                "--http-host", "127.0.0.1", "--http-port", str(free_port()),
                "--l1-size-gb", "2", "--no-l1-use-lazy", "--log-level", "WARNING"] + common,
               env, open(os.path.join(workdir, "lmcached.log"), "w"))
    up = start([sys.executable, "-c", LAUNCH, compat, "--host", "127.0.0.1",
                "--port", str(p2), "--prometheus-port", str(free_port()),
                "--l1-size-gb", "2", "--no-l1-use-lazy",
                "--shm-name", f"lmcache_l1_pool_bench{os.getpid()}"] + common,
               env, open(os.path.join(workdir, "upstream.log"), "w"))
    return [("lmcached", f"tcp://127.0.0.1:{p1}", lm), ("upstream", f"tcp://127.0.0.1:{p2}", up)]


class Bench:
    def __init__(self, up, url, instance):
        import zmq
        self.up = up
        self.c = up.RequestClientFactory.create(url, context=zmq.Context.instance())
        deadline = time.monotonic() + 120      # upstream's server imports for a while
        while True:
            try:
                self.c.noop().result(timeout=2)
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{url} never answered NOOP")
        payload = up.RegisterEngineDrivenContextPayload(
            instance_id=instance, model_name="bench", world_size=1, block_size=16,
            num_layers=LAYERS, hidden_dim_size=HIDDEN, dtype_str="float16", use_mla=False)
        reg = self.c.register_kv_cache_engine_driven_context(payload).result(timeout=30)
        self.ed = up.create_engine_driven_context(
            up.EngineDrivenContextMetadata(None, 16, False), self.c, 60, reg.shm_name,
            reg.pool_size)
        assert isinstance(self.ed, up.EngineDrivenContextShm), "no shared-memory pool"
        self.id = instance
        self.n = 0

    def key(self, tokens, rid, worker_id=0):
        return self.up.IPCCacheServerKey(model_name="bench", world_size=1, worker_id=worker_id,
                                         token_ids=tuple(tokens), start=0, end=len(tokens),
                                         request_id=rid, num_kv_readers=1)

    def rid(self):
        self.n += 1
        return f"r{self.n}"

    def noop(self, n):
        t = time.perf_counter()
        for _ in range(n):
            self.c.noop().result(timeout=10)
        return (time.perf_counter() - t) / n

    def noop_raw(self, url, n):
        """NOOP over a bare DEALER, one at a time: the server's own cost
        without the client's future and polling-thread hand-offs."""
        import msgspec
        import zmq
        packb = msgspec.msgpack.encode
        sock = zmq.Context.instance().socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(url)
        op = packb(24)
        try:
            for i in range(50):
                sock.send_multipart([packb(i), op])
                sock.recv_multipart()
            t = time.perf_counter()
            for i in range(n):
                sock.send_multipart([packb(i), op])
                sock.recv_multipart()
            return (time.perf_counter() - t) / n
        finally:
            sock.close()

    def lookup(self, tokens):
        """Seconds for one LOOKUP to be answered and its job to complete;
        the chunks found."""
        rid = self.rid()
        t = time.perf_counter()
        self.c.lookup(self.key(tokens, rid, worker_id=None), 1).result(timeout=30)
        found = self.c.wait_prefetch_status(rid, 30.0).result(timeout=60)
        dt = time.perf_counter() - t
        self.c.end_session(rid).result(timeout=10)
        return dt, found

    def store(self, tokens, src, phases):
        rid = self.rid()
        k = self.key(tokens, rid)
        t0 = time.perf_counter()
        slots, idx = self.ed.prepare_store(k, self.id)
        t1 = time.perf_counter()
        for s, i in zip(slots, idx):
            s.copy_(src[i])
        t2 = time.perf_counter()
        ok = self.ed.commit_store(k, self.id, slots)
        t3 = time.perf_counter()
        self.c.end_session(rid).result(timeout=10)
        assert ok and len(idx) == CHUNKS, (ok, len(idx))
        phases.append((t1 - t0, t2 - t1, t3 - t2))
        return t3 - t0

    def retrieve(self, tokens, dst, phases):
        rid = self.rid()
        k = self.key(tokens, rid)
        t0 = time.perf_counter()
        self.c.lookup(self.key(tokens, rid, worker_id=None), 1).result(timeout=30)
        found = self.c.wait_prefetch_status(rid, 30.0).result(timeout=60)
        t1 = time.perf_counter()
        chunks = self.ed.prepare_retrieve(k, self.id)
        t2 = time.perf_counter()
        for d, s in zip(dst, chunks or []):
            d.copy_(s)
        t3 = time.perf_counter()
        ok = self.ed.commit_retrieve(k, self.id)
        t4 = time.perf_counter()
        self.c.end_session(rid).result(timeout=10)
        assert found == CHUNKS and chunks is not None and ok, (found, ok)
        phases.append((t1 - t0, t2 - t1, t3 - t2, t4 - t3))
        return t4 - t0

    def clear(self):
        self.c.clear(True).result(timeout=30)


def cpu_seconds(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def settle(procs, quiet=0.01, window=0.25, limit=10.0):
    """Waits until no server uses more than `quiet` of a CPU over `window`
    seconds: work one server does after answering (write-behind, its
    timers) must not land in the other's measurement on a small machine.
    Returns the seconds waited."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < limit:
        before = [cpu_seconds(p.pid) for _, _, p in procs]
        time.sleep(window)
        after = [cpu_seconds(p.pid) for _, _, p in procs]
        if all(a - b <= quiet * window for a, b in zip(after, before)):
            break
    return time.monotonic() - t0


def prompt(seed):
    return [(seed * 1000003 + i * 7919) % 100000 + 1 for i in range(CS * CHUNKS)]


def copy_speed(torch):
    a = torch.empty(CHUNKS * 2 * LAYERS * CS * HIDDEN, dtype=torch.float16)
    b = torch.empty_like(a)
    a.fill_(1)
    b.copy_(a)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        b.copy_(a)
        best = min(best, time.perf_counter() - t)
    return a.numel() * 2 / best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--noops", type=int, default=2000)
    args = ap.parse_args()

    import ctypes
    import torch
    ctypes.CDLL(os.path.join(args.build, "libupstream_cxx_compat.so"), mode=ctypes.RTLD_GLOBAL)
    from lmcache.v1.multiprocess.custom_types import (IPCCacheServerKey,
                                                      RegisterEngineDrivenContextPayload)
    from lmcache.v1.multiprocess.transfer_context import (
        EngineDrivenContextMetadata, EngineDrivenContextShm, create_engine_driven_context)
    from lmcache.v1.multiprocess.transport.factory import RequestClientFactory
    import lmcache
    import types
    up = types.SimpleNamespace(
        IPCCacheServerKey=IPCCacheServerKey,
        RegisterEngineDrivenContextPayload=RegisterEngineDrivenContextPayload,
        EngineDrivenContextMetadata=EngineDrivenContextMetadata,
        EngineDrivenContextShm=EngineDrivenContextShm,
        create_engine_driven_context=create_engine_driven_context,
        RequestClientFactory=RequestClientFactory)

    speed = copy_speed(torch)
    print(f"upstream_bench: lmcache {lmcache.__version__}, torch {torch.__version__}, "
          f"{os.cpu_count()} CPUs; this machine copies {speed / 2**30:.2f} GiB/s (torch)")
    obj = 2 * LAYERS * CS * HIDDEN
    src = [torch.randn(2, LAYERS, CS, HIDDEN).to(torch.float16) for _ in range(CHUNKS)]
    dst = [torch.empty(2, LAYERS, CS, HIDDEN, dtype=torch.float16) for _ in range(CHUNKS)]
    work = tempfile.mkdtemp(prefix="upstream_bench.")
    procs = servers(args.build, work)
    try:
        benches = [(name, Bench(up, url, 100 + i)) for i, (name, url, _) in enumerate(procs)]
        urls = {name: url for name, url, _ in procs}
        rows = {}   # (what, name) -> [seconds per round]
        phases = {name: {"store": [], "retrieve": []} for name, _ in benches}
        for r in range(args.rounds):
            # Each server goes first in every other round, so neither gets
            # a machine the other has warmed (or tired) more often.
            for name, b in (benches if r % 2 == 0 else benches[::-1]):
                def add(what, secs):
                    rows.setdefault((what, name), []).append(secs)
                    settle(procs)
                settle(procs)
                add("noop", b.noop(args.noops if r else 200))
                add("noop, bare DEALER", b.noop_raw(urls[name], args.noops if r else 200))
                miss, found = b.lookup(prompt(10_000 + r))
                assert found == 0, found
                add("lookup, 32k tokens, miss", miss)
                tokens = prompt(r)
                add("store, 128 chunks", b.store(tokens, src, phases[name]["store"]))
                hit, found = b.lookup(tokens)
                assert found == CHUNKS, found
                add("lookup, 32k tokens, hit", hit)
                for d in dst:
                    d.zero_()
                add("retrieve, 128 chunks", b.retrieve(tokens, dst, phases[name]["retrieve"]))
                assert all(torch.equal(a, c) for a, c in zip(src, dst))
                b.clear()
        print(f"{'':28} {'round 1 (fresh servers)':>36}   {'steady (median of rounds 2..)':>36}")
        print(f"{'':28} {'lmcached':>11} {'upstream':>11} {'ratio':>12}   "
              f"{'lmcached':>11} {'upstream':>11} {'ratio':>12}")
        for what in ("noop", "noop, bare DEALER", "lookup, 32k tokens, miss", "lookup, 32k tokens, hit",
                     "store, 128 chunks", "retrieve, 128 chunks"):
            a, u = rows[(what, "lmcached")], rows[(what, "upstream")]
            cells = []
            for pick in (lambda v: v[0], lambda v: statistics.median(v[1:])):
                la, lu = pick(a), pick(u)
                unit = (lambda s: f"{s * 1e6:8.1f} us") if what.startswith("noop") else \
                    (lambda s: f"{s * 1e3:8.2f} ms")
                cells.append(f"{unit(la):>11} {unit(lu):>11} {lu / la:11.2f}x")
            extra = ""
            if what.startswith(("store", "retrieve")):
                gbps = CHUNKS * obj * 2 / statistics.median(a[1:]) / 2**30
                extra = f"   lmcached {gbps:.2f} GiB/s"
            print(f"{what:28} {cells[0]}   {cells[1]}{extra}")
        print("where the time goes, steady state (ms): store = prepare / client copy / commit; "
              "retrieve = lookup+wait / prepare / client copy / commit")
        for name, _ in benches:
            for what in ("store", "retrieve"):
                later = phases[name][what][1:]
                med = [statistics.median(p[i] for p in later) * 1e3 for i in range(len(later[0]))]
                print(f"  {name:9} {what:9} " + " / ".join(f"{m:7.2f}" for m in med))
    finally:
        for _, _, p in procs:
            p.terminate()
        for _, _, p in procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
        print(f"upstream_bench: server logs in {work}")


if __name__ == "__main__":
    main()
