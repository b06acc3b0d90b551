#!/usr/bin/env bash
# HTTP frontend benchmark, and its effect on the ZMQ data path.
#
#   bench/http_bench.sh BUILD_DIR
#
# Starts BUILD_DIR/lmcached (HTTP frontend on a free loopback port) and:
#   1. runs wrk against /healthcheck and /metrics (requests/s);
#   1b. measures the bearer-token check (docs/http.md, "Authentication"):
#      the same guarded route on this server (no token) and on a second one
#      started with --http-auth-token, both asked with the right token over
#      one connection, rounds alternating; prints the difference in us per
#      request of wall time and of the server's CPU time (goal: <= 2 us),
#      then BUILD_DIR/http_auth_bench, the check alone in process;
#   2. measures ZMQ NOOP throughput with BUILD_DIR/rpc_bench
#        a. alone,
#        b. while a scraper GETs /metrics every 100 ms (10 scrapes/s, far
#           above a Prometheus scrape interval),
#        c. while wrk hammers /metrics flat out (1 thread, 2 connections),
#      and prints each loaded/alone ratio (goal for b: >= 0.9).
# Environment: HTTP_BENCH_SECONDS (wrk seconds per path, default 5),
# RPC_BENCH_SECONDS (rpc_bench --duration, default 2), AUTH_BENCH_ROUNDS
# (rounds of step 1b, default 15; each runs both servers for
# AUTH_BENCH_SECONDS, default 2), AUTH_BENCH_CONTROL=1 (step 1b with the
# second server started without a token too: the noise floor of the
# comparison), HTTP_BENCH_AUTH_ONLY=1 (step 1b alone).
# Needs wrk (Debian package wrk) and curl.
set -euo pipefail

BUILD_DIR=${1:?usage: bench/http_bench.sh BUILD_DIR}
SERVER=$BUILD_DIR/lmcached
BENCH=$BUILD_DIR/rpc_bench
WRK_S=${HTTP_BENCH_SECONDS:-5}
RPC_S=${RPC_BENCH_SECONDS:-2}
for bin in "$SERVER" "$BENCH" "$BUILD_DIR/http_auth_bench"; do
  [ -x "$bin" ] || { echo "http_bench: $bin not found (build first)" >&2; exit 1; }
done
for tool in wrk curl python3; do
  command -v "$tool" >/dev/null || { echo "http_bench: $tool missing (apt-get install $tool)" >&2; exit 1; }
done

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

unset LMCACHE_HTTP_AUTH_TOKEN  # the first server runs without a token
PORT=$(free_port)
HTTP_PORT=$(free_port)
URL=tcp://127.0.0.1:$PORT
BASE=http://127.0.0.1:$HTTP_PORT
LOG=$(mktemp)
AUTH_LOG=$(mktemp)
SERVER_PID=
AUTH_PID=
LOAD_PID=
cleanup() {
  for pid in $LOAD_PID $AUTH_PID $SERVER_PID; do
    if kill -0 "$pid" 2>/dev/null; then
      kill -TERM "$pid"
      wait "$pid" 2>/dev/null || true
    fi
  done
  rm -f "$LOG" "$AUTH_LOG"
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

# 1b. The token check alone: GET /config/policies is guarded and answers a
# constant 501, so the two servers differ only by the check.  Both get the
# same Authorization header.  One connection, so one request's wall time is
# 1/rps; the server's own CPU time per request (the sum over its threads of
# /proc/PID/task/*/schedstat, ns) is counted too, being far less disturbed
# by whatever else the machine runs.
cpu_ns() {  # PID -> ns on CPU, all threads
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{s += $1} END {printf "%.0f\n", s}'
}
auth_round() {  # BASE PID -> "req/s requests cpu_ns"
  local before after out
  before=$(cpu_ns "$2")
  out=$(wrk -t1 -c1 -d"${AUTH_S}s" -H "Authorization: Bearer $AUTH_TOKEN" "$1/config/policies")
  after=$(cpu_ns "$2")
  echo "$out" | awk -v cpu=$((after - before)) \
    '/^Requests\/sec:/ {rps = $2} / requests in / {n = $1} END {print rps, n, cpu}'
}
auth_bench() {
  local aport ahttp abase results rounds
  AUTH_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
  AUTH_S=${AUTH_BENCH_SECONDS:-2}
  rounds=${AUTH_BENCH_ROUNDS:-15}
  aport=$(free_port)
  ahttp=$(free_port)
  abase=http://127.0.0.1:$ahttp
  local token_env=(LMCACHE_HTTP_AUTH_TOKEN="$AUTH_TOKEN") want=401
  if [ "${AUTH_BENCH_CONTROL:-0}" = 1 ]; then token_env=() want=501; fi
  env "${token_env[@]}" "$SERVER" --host 127.0.0.1 --port "$aport" \
    --http-host 127.0.0.1 --http-port "$ahttp" --l1-size-gb 0.25 --eviction-policy LRU \
    --log-level WARNING >"$AUTH_LOG" 2>&1 &
  AUTH_PID=$!
  for _ in $(seq 100); do
    curl -sf "$abase/healthcheck" >/dev/null && break
    sleep 0.1
  done
  [ "$(curl -s -o /dev/null -w '%{http_code}' "$abase/config/policies")" = "$want" ] ||
    { echo "http_bench: second server does not answer $want:" >&2; cat "$AUTH_LOG" >&2; exit 1; }
  [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $AUTH_TOKEN" \
       "$abase/config/policies")" = 501 ] || { echo "http_bench: token refused" >&2; exit 1; }
  results=$(mktemp)
  for r in $(seq "$rounds"); do  # alternate which server goes first
    if [ $((r % 2)) = 1 ]; then
      off=$(auth_round "$BASE" "$SERVER_PID"); on=$(auth_round "$abase" "$AUTH_PID")
    else
      on=$(auth_round "$abase" "$AUTH_PID"); off=$(auth_round "$BASE" "$SERVER_PID")
    fi
    echo "$off $on" >>"$results"
  done
  python3 - "$results" "$rounds" "$AUTH_S" "${AUTH_BENCH_CONTROL:-0}" <<'PY'
import statistics, sys
rows = [list(map(float, l.split())) for l in open(sys.argv[1])]
med = statistics.median
wall = [(1e6 / r[0], 1e6 / r[3]) for r in rows]             # us per request
cpu = [(r[2] / r[1] / 1e3, r[5] / r[4] / 1e3) for r in rows]  # server CPU us per request
control = sys.argv[4] == "1"
print(f"http_bench: token check, GET /config/policies, wrk -t1 -c1, {sys.argv[2]} alternating "
      f"rounds of {sys.argv[3]} s per server (medians; us per request)"
      + (" CONTROL: neither server has a token" if control else "") + ":")
print(f"| | no token | {'no token either' if control else 'token set'} | difference "
      "| rounds' differences |")
print("|---|---:|---:|---:|---|")
for name, v in (("wall time (1/rps)", wall), ("server CPU time", cpu)):
    d = [on - off for off, on in v]
    print(f"| {name} | {med(x[0] for x in v):.2f} | {med(x[1] for x in v):.2f} "
          f"| {med(d):+.2f} | {min(d):+.2f} .. {max(d):+.2f} |")
d = med(on - off for off, on in cpu)
print(f"http_bench: {'noise floor' if control else 'token check costs'} {d:+.2f} us of server "
      f"CPU per request" + ("" if control else f" (goal <= 2 us: {'PASS' if d <= 2 else 'MISS'})"))
PY
  rm -f "$results"
  kill -TERM "$AUTH_PID"
  wait "$AUTH_PID" 2>/dev/null || true
  AUTH_PID=
  # The check alone, in process, where no network or scheduler noise hides it.
  "$BUILD_DIR/http_auth_bench" 1000000
}
auth_bench
[ "${HTTP_BENCH_AUTH_ONLY:-0}" = 1 ] && exit 0

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
