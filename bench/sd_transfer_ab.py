#!/usr/bin/python3
"""Two sd_transfer_bench binaries in one run, "before" (an older build) and
"after", N pairs, alternating which goes first, then the medians of the
ratios each prints and after/before (the server-driven twin of
transfer_ab.py; BENCHMARKS.md).

    python3 bench/sd_transfer_ab.py OLD/sd_transfer_bench build/sd_transfer_bench 6
"""
import re
import statistics
import subprocess
import sys

if len(sys.argv) < 3:
    sys.exit(__doc__)
BIN = {"before": sys.argv[1], "after": sys.argv[2]}
N = int(sys.argv[3]) if len(sys.argv) > 3 else 6
ONE = r"1 worker\(s\), 128 chunks"
pat = {
    "nhd_store_x": r"NHD, " + ONE + r".*?STORE [0-9.]+ GB/s \(([0-9.]+)x",
    "nhd_retrieve_x": r"NHD, " + ONE + r".*?RETRIEVE [0-9.]+ GB/s \(([0-9.]+)x",
    "hnd_store_x": r"HND, " + ONE + r".*?STORE [0-9.]+ GB/s \(([0-9.]+)x",
    "hnd_retrieve_x": r"HND, " + ONE + r".*?RETRIEVE [0-9.]+ GB/s \(([0-9.]+)x",
    "store_vs_noop": r"one 16 KiB chunk.*?STORE p50 [0-9.]+ us \(([0-9.]+)x",
    "retrieve_vs_noop": r"one 16 KiB chunk.*?RETRIEVE p50 [0-9.]+ us \(([0-9.]+)x",
    "store_p50_us": r"one 16 KiB chunk.*?STORE p50 ([0-9.]+) us",
    "noop_p50_us": r"one 16 KiB chunk.*?NOOP p50 ([0-9.]+) us",
}
res = {b: {k: [] for k in pat} for b in BIN}
for i in range(N):
    for b in (("before", "after") if i % 2 == 0 else ("after", "before")):
        out = subprocess.run([BIN[b], "--chunks", "128", "--iters", "300"],
                             capture_output=True, text=True).stdout
        for k, p in pat.items():
            m = re.search(p, out)
            if m:
                res[b][k].append(float(m.group(1)))
print(f"medians over {N} runs each (before = {BIN['before']}, after = {BIN['after']}):")
for k in pat:
    if not res["before"][k] or not res["after"][k]:
        print(f"  {k:17} not found in the output")
        continue
    a, b = statistics.median(res["before"][k]), statistics.median(res["after"][k])
    print(f"  {k:17} before {a:8.2f}  after {b:8.2f}  after/before {b / a:5.2f}")
