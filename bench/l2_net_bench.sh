#!/usr/bin/env bash
# L2 resp and s3 tiers against redis-benchmark and curl (issue 18).
#
#   bench/l2_net_bench.sh [REPS] [L2_BENCH ...]
#
# Starts redis-server and moto_server (build-tools/venv, `make deps-test`) on
# free ports, then runs each l2_bench binary given (default build/l2_bench;
# give a build of another commit too to compare) REPS times (default 3),
# the binaries in turn, once against Redis and once against moto_server.  Each
# run stores and loads one 32k-token prompt (128 chunks of 2 MiB) right
# after its baseline moves the same bytes to the same server:
#   resp: redis-benchmark SET / GET, 2 MiB values, 128 requests on 8
#         connections = the adapter's 8 workers.  The SETs write 128 new
#         keys (-r 10^9, in database 1), as lmcached's store does; before
#         each store, untimed, database 1 and lmcached's keys are deleted
#         and Redis's allocator gives its free memory back (MEMORY PURGE),
#         so both stores make Redis allocate fresh memory: SETs over
#         existing keys would reuse the memory the old values free, which
#         lmcached's new keys never can.  The GETs read 128 keys the script
#         stored first (-r 128, database 0);
#   s3:   curl --parallel PUT / GET of 128 objects of 2 MiB, 4 at a time =
#         the adapter's 4 workers, SigV4-signed by curl (objects of the
#         same size as lmcached's, named curl-<i>).
# Ratio = lmcached speed / baseline speed.  Both talk to moto_server directly
# (no signature-checking proxy, tests/s3server/README.md).
set -euo pipefail

reps=${1:-3}
shift || true
benches=("$@")
[ ${#benches[@]} -gt 0 ] || benches=(build/l2_bench)
root=$(cd "$(dirname "$0")/.." && pwd)
chunks=128
size=$((2 << 20))
work=$(mktemp -d /tmp/l2_net_bench.XXXXXX)
redis_pid=
s3_pid=

cleanup() {
    for pid in $redis_pid $s3_pid; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

head -c "$size" /dev/urandom >"$work/chunk"

# Redis, with the keys redis-benchmark's GETs read (-r 128: key:%012d).
rport=$(free_port)
redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no --loglevel warning \
    --dir "$work" >/dev/null &
redis_pid=$!
until redis-cli -p "$rport" ping >/dev/null 2>&1; do sleep 0.1; done
for i in $(seq 0 $((chunks - 1))); do
    redis-cli -p "$rport" -x SET "key:$(printf %012d "$i")" <"$work/chunk" >/dev/null
done
rb="redis-benchmark -h 127.0.0.1 -p $rport -c 8 -n $chunks -d $size -q"
rb_set="$rb -t set --dbnum 1 -r 1000000000"
rb_get="$rb -t get -r $chunks"
rcli="redis-cli -p $rport"
prepare="$rcli -n 1 flushdb >/dev/null && $rcli --scan --pattern 'bench@*' | xargs -r -n 64 $rcli del >/dev/null && $rcli memory purge >/dev/null"
resp_json="{\"type\":\"resp\",\"host\":\"127.0.0.1\",\"port\":$rport,\"num_workers\":8}"

# moto_server (S3 in memory), with the bucket and curl's objects.
sport=$(free_port)
"$root/build-tools/venv/bin/moto_server" -H 127.0.0.1 -p "$sport" >/dev/null 2>&1 &
s3_pid=$!
url="http://127.0.0.1:$sport/lmcache"
# lmcached sends UNSIGNED-PAYLOAD and no "Expect: 100-continue"; curl the same.
sig=(--aws-sigv4 aws:amz:us-east-1:s3 -u bench:bench -H "x-amz-content-sha256: UNSIGNED-PAYLOAD"
    -H "Expect:")
until curl -s -o /dev/null "http://127.0.0.1:$sport/"; do sleep 0.2; done
curl -sf -o /dev/null "${sig[@]}" -X PUT "$url"
for i in $(seq 0 $((chunks - 1))); do
    printf 'upload-file = "%s"\nurl = "%s/curl-%d"\noutput = "/dev/null"\n' "$work/chunk" "$url" "$i"
done >"$work/put.cfg"
for i in $(seq 0 $((chunks - 1))); do
    printf 'url = "%s/curl-%d"\noutput = "/dev/null"\n' "$url" "$i"
done >"$work/get.cfg"
curl_cmd="curl -sf --no-progress-meter -Z --parallel-max 4 --aws-sigv4 aws:amz:us-east-1:s3 -u bench:bench"
curl_cmd+=" -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -H 'Expect:'"
s3_json="{\"type\":\"s3\",\"s3_endpoint\":\"lmcache.127.0.0.1:$sport\",\"disable_tls\":true,"
s3_json+="\"aws_access_key_id\":\"bench\",\"aws_secret_access_key\":\"bench\",\"num_workers\":4}"

for r in $(seq 1 "$reps"); do
    for b in "${benches[@]}"; do
        echo "== round $r: $b, resp"
        "$b" --chunks "$chunks" --reps 1 --adapter "$resp_json" --prepare "$prepare" \
            --store-baseline "$rb_set >/dev/null" --load-baseline "$rb_get >/dev/null" |
            grep -v '^l2_bench:\|^\['
        # lmcached's keys ("bench@..."): gone, so Redis holds one prompt at a time.
        redis-cli -p "$rport" --scan --pattern 'bench@*' |
            xargs -r -n 64 redis-cli -p "$rport" del >/dev/null
        echo "== round $r: $b, s3"
        "$b" --chunks "$chunks" --reps 1 --adapter "$s3_json" \
            --store-baseline "$curl_cmd -K $work/put.cfg" \
            --load-baseline "$curl_cmd -K $work/get.cfg" | grep -v '^l2_bench:\|^\['
    done
done
