#!/usr/bin/python3
"""Two transfer_bench binaries in one run, "before" (an older build) and
"after", N pairs, alternating which goes first (the second of a pair runs
on a warmer machine), then the medians and after/before.  On the 2-vCPU VM one run
moves by ±30 %, so only same-run pairs compare (BENCHMARKS.md).

    python3 bench/transfer_ab.py OLD/transfer_bench build/transfer_bench 16 [transfer_bench args]
"""
import re
import statistics
import subprocess
import sys

if len(sys.argv) < 3:
    sys.exit(__doc__)
BIN = {"before": sys.argv[1], "after": sys.argv[2]}
N = int(sys.argv[3]) if len(sys.argv) > 3 else 10
pat = {
    "store": r"^store  \(prep\+copy\+commit\):.*?= ([0-9.]+)x",
    "retrieve": r"^retrieve \(prep\+copy\+commit\):.*?= ([0-9.]+)x",
    "pipe_store": r"^pipelined store\s*:.*?= ([0-9.]+)x",
    "pipe_retrieve": r"^pipelined retrieve\s*:.*?= ([0-9.]+)x",
    "lookup_paired": r"^paired:.*?= ([0-9.]+)x",
    "cpu_store_us": r"^server CPU per chunk: store ([0-9.]+) us",
    "cpu_retrieve_us": r"^server CPU per chunk: store [0-9.]+ us, retrieve ([0-9.]+) us",
    "cpu_lookup_us": r"^server CPU per lookup cycle[^:]*: ([0-9.]+) us",
    "store_rpc_us": r"^per request of \d+ chunks: store rpc ([0-9.]+) us",
    "retrieve_rpc_us": r"^per request of \d+ chunks: .*retrieve rpc ([0-9.]+) us",
    "store_copy_us": r"^per request of \d+ chunks: store rpc [0-9.]+ us \+ copy ([0-9.]+) us",
    "lookup_query_p50_us": r"^LOOKUP\+QUERY.*?p50 ([0-9.]+) us",
    "noop_p50_us": r"^NOOP round trip\s*: p50 ([0-9.]+) us",
    "memcpy_gibs": r"^memcpy \(1 thread\)\s*:\s*([0-9.]+) GiB/s",
}
EXTRA = sys.argv[4:]
res = {"before": {k: [] for k in pat}, "after": {k: [] for k in pat}}
for i in range(N):
    for b in (("before", "after") if i % 2 == 0 else ("after", "before")):
        out = subprocess.run([BIN[b], "--chunks", "128", "--iters", "500", *EXTRA],
                             capture_output=True, text=True).stdout
        row = []
        for k, p in pat.items():
            m = re.search(p, out, re.M)
            v = float(m.group(1)) if m else float("nan")
            res[b][k].append(v)
            row.append(f"{k}={v}")
        print(i + 1, b, " ".join(row), flush=True)
print(f"medians over {N} runs each (before = {BIN['before']}, after = {BIN['after']}):")
for k in pat:
    mb, ma = statistics.median(res["before"][k]), statistics.median(res["after"][k])
    print(f"  {k:16s} before {mb:8.2f}  after {ma:8.2f}  after/before {ma / mb:5.2f}")
