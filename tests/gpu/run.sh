#!/usr/bin/env bash
# The CUDA IPC end-to-end test on a machine with a GPU, torch (CUDA) and
# msgpack, from the bundle tests/gpu/bundle.sh made on the build machine
# (tests/gpu/README.md):
#
#   tests/gpu/run.sh [BUNDLE_DIR] [test_cuda_ipc.py options...]
#
# BUNDLE_DIR defaults to tests/gpu/bundle.  First blend_check (CacheBlend's
# CUDA kernels against the CPU executor), then by default: the plugin and
# server correctness phases, then, once they passed, the bandwidth phase
# (STORE/RETRIEVE beside cudaMemcpyAsync; its SUMMARY line says MET or NOT
# MET, which never changes the exit status).  --no-bench skips it, --bench
# runs it alone.  Prints PASS or FAIL; exits 0 only on PASS (wrong bytes,
# a failed request or a timeout are FAIL).  --zmq-selftest runs the no-GPU
# checks instead.  GPU_TEST_TIMEOUT (seconds, default 480) bounds the run:
# the stacks are printed 20 s before, then everything is killed.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
BUNDLE=$HERE/bundle
if [ $# -gt 0 ] && [ -d "$1" ]; then
    BUNDLE=$(cd "$1" && pwd)
    shift
fi
PY=${PYTHON:-python3}

fail() { echo "FAIL: $*"; exit 1; }
[ -x "$BUNDLE/lmcached" ] || fail "no $BUNDLE/lmcached (make it with tests/gpu/bundle.sh)"
[ -f "$BUNDLE/liblmcached_cuda.so" ] || fail "no $BUNDLE/liblmcached_cuda.so"
[ -f "$BUNDLE/MANIFEST" ] && sed -n 1,3p "$BUNDLE/MANIFEST"

# What the carried binaries still miss on this machine.
missing=$(LD_LIBRARY_PATH="$BUNDLE/lib" ldd "$BUNDLE/lmcached" "$BUNDLE/liblmcached_cuda.so" 2>&1 |
          grep -E 'not found|version .* not found' || true)
[ -z "$missing" ] || fail "the bundle does not resolve here: $missing"

command -v nvidia-smi >/dev/null && nvidia-smi -L
# torch's expandable segments export handles cudaIpcOpenMemHandle cannot
# open (docs/protocol.md): the test needs plain cudaMalloc blocks.
unset PYTORCH_CUDA_ALLOC_CONF
export PYTHONUNBUFFERED=1

export GPU_TEST_TIMEOUT=${GPU_TEST_TIMEOUT:-480}
start=$(date +%s)
# CacheBlend's device executor against the CPU one (blend_check.c), first:
# a small C program that needs no torch (not with --zmq-selftest or --bench).
case " $* " in
    *" --zmq-selftest "*|*" --bench "*) ;;
    *)
        [ -x "$BUNDLE/blend_check" ] ||
            fail "no $BUNDLE/blend_check (build with nvcc present, then tests/gpu/bundle.sh)"
        bc_timeout=""
        command -v timeout >/dev/null && bc_timeout="timeout --kill-after=10 120"
        LD_LIBRARY_PATH="$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
            $bc_timeout "$BUNDLE/blend_check" "$BUNDLE/liblmcached_cuda.so" ||
            fail "blend_check (CacheBlend's CUDA kernels against the CPU executor)"
        ;;
esac
if command -v timeout >/dev/null; then
    # its own process group: lmcached goes too
    timeout --kill-after=10 "$GPU_TEST_TIMEOUT" "$PY" "$HERE/test_cuda_ipc.py" --bundle "$BUNDLE" "$@"
else
    "$PY" "$HERE/test_cuda_ipc.py" --bundle "$BUNDLE" "$@"
fi
rc=$?
case $rc in
    0) ;;
    124|137) echo "FAIL: timed out after ${GPU_TEST_TIMEOUT} s (GPU_TEST_TIMEOUT)" ;;
    *) echo "test_cuda_ipc.py exited $rc" ;;
esac
echo "run.sh: $(( $(date +%s) - start )) s"
exit $rc
