#!/usr/bin/env bash
# HTTP frontend benchmark, and its effect on the ZMQ data path.
#
#   bench/http_bench.sh BUILD_DIR
#
# Starts BUILD_DIR/lmcached (HTTP frontend on a free loopback port) and:
#   1. runs wrk against /healthcheck and /metrics (requests/s);
#   2. measures ZMQ NOOP throughput with BUILD_DIR/rpc_bench
#        a. alone,
#        b. while a scraper GETs /metrics every 100 ms (10 scrapes/s, far
#           above a Prometheus scrape interval),
#        c. while wrk hammers /metrics flat out (1 thread, 2 connections),
#      and prints each loaded/alone ratio (goal for b: >= 0.9).
# Environment: HTTP_BENCH_SECONDS (wrk seconds per path, default 5),
# RPC_BENCH_SECONDS (rpc_bench --duration, default 2).  Needs wrk (Debian
# package wrk) and curl.
set -euo pipefail

BUILD_DIR=${1:?usage: bench/http_bench.sh BUILD_DIR}
SERVER=$BUILD_DIR/lmcached
BENCH=$BUILD_DIR/rpc_bench
WRK_S=${HTTP_BENCH_SECONDS:-5}
RPC_S=${RPC_BENCH_SECONDS:-2}
for bin in "$SERVER" "$BENCH"; do
  [ -x "$bin" ] || { echo "http_bench: $bin not found (build first)" >&2; exit 1; }
done
for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "http_bench: $tool missing (apt-get install $tool)" >&2; exit 1; }
done

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

PORT=$(free_port)
HTTP_PORT=$(free_port)
URL=tcp://127.0.0.1:$PORT
BASE=http://127.0.0.1:$HTTP_PORT
LOG=$(mktemp)
SERVER_PID=
LOAD_PID=
cleanup() {
  for pid in $LOAD_PID $SERVER_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -f "$LOG"
}
trap cleanup EXIT

"$SERVER" --host 127.0.0.1 --port "$PORT" --http-host 127.0.0.1 --http-port "$HTTP_PORT" \
  --l1-size-gb 0.25 --eviction-policy LRU --log-level WARNING >"$LOG" 2>&1 &
SERVER_PID=$!
for _ in $(seq 100); do
  kill -0 "$SERVER_PID" 2>/dev/null || break
  "$BENCH" --url "$URL" --probe --timeout-ms 200 && break
done
curl -sf "$BASE/healthcheck" >/dev/null || { echo "http_bench: server not up:" >&2; cat "$LOG" >&2; exit 1; }

echo "http_bench: machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "http_bench: /metrics is $(curl -s "$BASE/metrics" | wc -c) bytes"

wrk_rps() {  # PATH -> requests/s
  wrk -t2 -c16 -d"${WRK_S}s" "$BASE$1" | awk '/^Requests\/sec:/ {print $2}'
}
HC=$(wrk_rps /healthcheck)
MET=$(wrk_rps /metrics)
echo "http_bench: wrk -t2 -c16 -d${WRK_S}s /healthcheck: $HC req/s"
echo "http_bench: wrk -t2 -c16 -d${WRK_S}s /metrics:     $MET req/s"

# One rpc_bench run -> "seq_rps pipe_rps seq_vs_echo pipe_vs_echo" for the
# "NOOP 1c seq" and "NOOP 8c pipe32" rows (lmcached req/s, and lmcached
# req/s over the in-process echo server's req/s measured in the same run).
noop_run() {
  "$BENCH" --url "$URL" --duration "$RPC_S" --rounds 1 2>/dev/null |
    awk -F'|' '/\| NOOP 1c seq \|/ {s=$3; sr=$5} /\| NOOP 8c pipe/ {p=$3; pr=$5}
               END {sub(/ *(PASS|MISS) */, "", sr); sub(/ *(PASS|MISS) */, "", pr);
                    print s+0, p+0, sr+0, pr+0}'
}
scrape_loop() {
  while :; do curl -s "$BASE/metrics" >/dev/null; sleep 0.1; done
}
start_load() {  # none | scrape | wrk
  case $1 in
    scrape) scrape_loop & LOAD_PID=$! ;;
    wrk) wrk -t1 -c2 -d600s "$BASE/metrics" >/dev/null & LOAD_PID=$! ;;
    *) LOAD_PID= ;;
  esac
}
stop_load() {
  if [ -n "$LOAD_PID" ]; then kill "$LOAD_PID"; wait "$LOAD_PID" 2>/dev/null || true; fi
  LOAD_PID=
}

# REPS rounds, each running the three conditions in turn, so that drifting
# background load hits all of them alike; medians are reported.
REPS=${HTTP_BENCH_REPS:-3}
RESULTS=$(mktemp)
for rep in $(seq "$REPS"); do
  for load in none scrape wrk; do
    start_load "$load"
    echo "$load $(noop_run)" >>"$RESULTS"
    stop_load
    echo "http_bench: round $rep/$REPS, load $load done" >&2
  done
done

python3 - "$RESULTS" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    load, *vals = line.split()
    rows.setdefault(load, []).append([float(v) for v in vals])
med = {k: [statistics.median(col) for col in zip(*v)] for k, v in rows.items()}
a, s, w = med["none"], med["scrape"], med["wrk"]
r = lambda x, y: f"{x / y:.2f}" if y else "n/a"
print(f"\nZMQ NOOP throughput, median of {len(rows['none'])} rounds: req/s (lmcached/echo "
      "in the same run); ratio = loaded/alone, raw [echo-normalised]")
print("| scenario | alone | + /metrics every 100 ms | ratio | + wrk flat out on /metrics | ratio |")
print("|---|---:|---:|---:|---:|---:|")
for i, name in ((0, "NOOP 1 client, sequential"), (1, "NOOP 8 clients, pipelined 32")):
    print(f"| {name} | {a[i]:.0f} ({a[i+2]:.2f}) | {s[i]:.0f} ({s[i+2]:.2f}) "
          f"| {r(s[i], a[i])} [{r(s[i+2], a[i+2])}] | {w[i]:.0f} ({w[i+2]:.2f}) "
          f"| {r(w[i], a[i])} [{r(w[i+2], a[i+2])}] |")
PY
rm -f "$RESULTS"
