#!/usr/bin/env bash
# Runs the RPC round-trip benchmark against a freshly started lmcached.
#
#   bench/run.sh BUILD_DIR [rpc_bench options...]
#
# Starts BUILD_DIR/lmcached on a free loopback port, waits until it answers
# NOOP, runs BUILD_DIR/rpc_bench against it, and stops it with SIGTERM.
# Exits non-zero if the server cannot start or the benchmark fails.
# BENCH_PERF=FILE also records a `perf record -g` profile of the server
# while the benchmark runs.
set -euo pipefail

BUILD_DIR=${1:?usage: bench/run.sh BUILD_DIR [rpc_bench options...]}
shift
SERVER=$BUILD_DIR/lmcached
BENCH=$BUILD_DIR/rpc_bench
for bin in "$SERVER" "$BENCH"; do
  [ -x "$bin" ] || { echo "run.sh: $bin not found (build first)" >&2; exit 1; }
done

# A port the kernel just handed out on the loopback interface.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

HELP=$("$SERVER" --help 2>&1 || true)
has_flag() { grep -q -- "$1\b" <<<"$HELP"; }

PORT=$(free_port)
ARGS=(--port "$PORT" --l1-size-gb 0.25 --eviction-policy LRU --log-level WARNING)
if has_flag --host; then ARGS+=(--host 127.0.0.1); fi
if has_flag --no-http; then
  ARGS+=(--no-http)
elif has_flag --http-port; then
  ARGS+=(--http-port "$(free_port)")
fi
URL=tcp://127.0.0.1:$PORT

LOG=$(mktemp)
SERVER_PID=
PERF_PID=
cleanup() {
  if [ -n "$PERF_PID" ] && kill -0 "$PERF_PID" 2>/dev/null; then
    kill -INT "$PERF_PID"; wait "$PERF_PID" || true
  fi
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID"
    for _ in $(seq 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$SERVER_PID" 2>/dev/null && { echo "run.sh: lmcached ignored SIGTERM" >&2; kill -KILL "$SERVER_PID"; }
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  rm -f "$LOG"
}
trap cleanup EXIT

echo "run.sh: $SERVER ${ARGS[*]}"
"$SERVER" "${ARGS[@]}" >"$LOG" 2>&1 &
SERVER_PID=$!

ready=0
for _ in $(seq 100); do  # up to ~20 s
  if ! kill -0 "$SERVER_PID" 2>/dev/null; then break; fi
  if "$BENCH" --url "$URL" --probe --timeout-ms 200; then ready=1; break; fi
done
if [ "$ready" != 1 ]; then
  echo "run.sh: lmcached did not answer NOOP on $URL; its output:" >&2
  cat "$LOG" >&2
  exit 1
fi

if [ -n "${BENCH_PERF:-}" ]; then
  perf record -g -o "$BENCH_PERF" -p "$SERVER_PID" >/dev/null 2>&1 &
  PERF_PID=$!
  sleep 0.5
fi

echo "run.sh: machine: $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
"$BENCH" --url "$URL" "$@"
