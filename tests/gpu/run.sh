#!/usr/bin/env bash
# The CUDA IPC end-to-end test on a machine with a GPU, torch (CUDA) and
# msgpack, from the bundle tests/gpu/bundle.sh made on the build machine:
#
#   tests/gpu/run.sh [BUNDLE_DIR] [test_cuda_ipc.py options...]
#
# BUNDLE_DIR defaults to tests/gpu/bundle.  Prints PASS or FAIL; exits 0
# only on PASS.  --zmq-selftest runs the no-GPU checks instead.
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

"$PY" "$HERE/test_cuda_ipc.py" --bundle "$BUNDLE" "$@"
rc=$?
[ $rc -eq 0 ] || echo "test_cuda_ipc.py exited $rc"
exit $rc
