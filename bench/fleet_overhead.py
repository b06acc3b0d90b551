#!/usr/bin/env python3
"""fleet_overhead: what the cache-event stream (docs/fleet.md) costs the
request path.  Two real lmcached processes run side by side in one run:
"off" without a coordinator, "on" registered with an in-process stand-in
coordinator and streaming cache events every 0.2 s.  Rounds alternate
between them (off, on, on, off, ...) so the machine's drift hits both;
each round stores fresh prompts through the engine-driven path
(PREPARE_STORE, copy, COMMIT_STORE: one L1 store event per chunk) and
looks them up (LOOKUP + QUERY_PREFETCH_STATUS).  Reported: p50 and p99 of
each operation per server, and on/off ratios (goal p50 <= 1.05x).

    bench/fleet_overhead.py [--rounds R] [--iters N]
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests", "e2e"))

from conftest import Server  # noqa: E402
from test_fleet_registrar import FakeCoordinator  # noqa: E402
from test_lookup_engine_driven import CS, LOOKUP, QUERY, Worker, key, unpack  # noqa: E402

GOAL = 1.05


def prompt(seed, n_chunks):
    return [(seed * 7919 + i * 31 + seed // 7) % 50000 for i in range(n_chunks * CS)]


def cpu_s(pid):
    """User + system CPU seconds of a process, all its threads."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def one_round(srv, workers, sched, seed0, iters, chunks):
    stores, lookups = [], []
    for i in range(iters):
        toks = prompt(seed0 + i, chunks)
        t0 = time.perf_counter()
        for w in workers:
            w.store(toks, 0, chunks * CS, rid=f"s{seed0 + i}")
        stores.append(time.perf_counter() - t0)
    for i in range(iters):
        toks = prompt(seed0 + i, chunks)
        rid = f"l{seed0 + i}"
        t0 = time.perf_counter()
        sched.call(LOOKUP, key(toks, 0, chunks * CS, rid), 1)
        hits = unpack(sched.call(QUERY, rid))
        lookups.append(time.perf_counter() - t0)
        assert hits == chunks, (hits, chunks)
    return stores, lookups


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--iters", type=int, default=300)
    ap.add_argument("--chunks", type=int, default=8)
    a = ap.parse_args()
    coord = FakeCoordinator()
    common = ["--chunk-size", str(CS), "--l1-size-gb", "0.5", "--log-level", "WARNING"]
    servers = {
        "off": Server(*common),
        "on": Server(*common, "--coordinator-url", coord.url, "--coordinator-event-reporting",
                     "--coordinator-event-flush-interval", "0.2"),
    }
    sides = {}
    try:
        for name, srv in servers.items():
            ws = [Worker(srv, 9001, 0), Worker(srv, 9002, 1)]
            sides[name] = (srv, ws, srv.dealer())
        res = {n: {"store": [], "lookup": [], "round_p50": [], "cpu": 0.0} for n in servers}
        order = ["off", "on"]
        for r in range(a.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                srv, ws, sched = sides[name]
                c0 = cpu_s(srv.proc.pid)
                s, lk = one_round(srv, ws, sched, 100000 * (r + 1), a.iters, a.chunks)
                time.sleep(0.3)   # the reporter's flush of this round lands in its CPU
                res[name]["cpu"] += cpu_s(srv.proc.pid) - c0
                res[name]["store"] += s
                res[name]["lookup"] += lk
                res[name]["round_p50"].append((statistics.median(s), statistics.median(lk)))
        entries = sum(len(b["entries"]) for req in coord.of("events")
                      for b in req["body"]["batches"])
        print(f"fleet_overhead: {a.rounds} rounds x {a.iters} requests, {a.chunks} chunks x 2 "
              f"ranks per store; the 'on' server streamed {entries} entries in "
              f"{len(coord.of('events'))} posts")
        print(f"{'op':8} {'off p50 us':>11} {'on p50 us':>10} {'ratio':>6} "
              f"{'off p99 us':>11} {'on p99 us':>10}")
        worst = 0.0
        for op in ("store", "lookup"):
            off, on = res["off"][op], res["on"][op]
            ratio = statistics.median(on) / statistics.median(off)
            worst = max(worst, ratio)
            print(f"{op:8} {statistics.median(off) * 1e6:11.1f} {statistics.median(on) * 1e6:10.1f} "
                  f"{ratio:6.3f} {pct(off, 0.99) * 1e6:11.1f} {pct(on, 0.99) * 1e6:10.1f}")
        per_round = [(b[0] / a_[0], b[1] / a_[1])
                     for a_, b in zip(res["off"]["round_p50"], res["on"]["round_p50"])]
        print("per-round on/off p50 ratios (store, lookup): " +
              ", ".join(f"({s:.3f}, {lk:.3f})" for s, lk in per_round))
        per_chunk = a.rounds * a.iters * a.chunks * 2
        print("server CPU per stored chunk (all threads, store + lookup + reporting): " +
              ", ".join(f"{n} {res[n]['cpu'] / per_chunk * 1e6:.1f} us" for n in servers) +
              " (clock ticks: 10 ms resolution)")
        print(f"goal p50 on/off <= {GOAL}: {'met' if worst <= GOAL else 'MISSED'} "
              f"(worst {worst:.3f})")
    finally:
        for srv, ws, sched in sides.values():
            sched.close()
            for w in ws:
                w.close()
        for srv in servers.values():
            srv.stop()
        coord.close()


if __name__ == "__main__":
    main()
