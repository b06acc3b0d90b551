#!/usr/bin/env bash
# Packs what tests/gpu/run.sh needs on a GPU machine that has neither this
# build's libraries nor pyzmq: lmcached and liblmcached_cuda.so from a build
# dir, and in lib/ the shared libraries they and libzmq.so.5 need (as ldd
# finds them here), minus glibc's own (the target's libc must be used).
#
#   tests/gpu/bundle.sh [BUILD_DIR]     (default: build; or $BUILD_DIR)
#   BUNDLE_DIR=... overrides the output (default: tests/gpu/bundle, which
#   .gitignore keeps out of git; carry it to the GPU machine explicitly).
#
# Layout:  BUNDLE/lmcached  BUNDLE/liblmcached_cuda.so  BUNDLE/lmcache-cli
#          BUNDLE/blend_check (CacheBlend's device executor check, if built)
#          BUNDLE/lib/*.so*  BUNDLE/zmq-libs.txt (libzmq's closure, in
#          ldd order, for the test's ctypes preloading)  BUNDLE/MANIFEST
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-${BUILD_DIR:-$ROOT/build}}
OUT=${BUNDLE_DIR:-$ROOT/tests/gpu/bundle}

die() { echo "bundle.sh: $*" >&2; exit 1; }
[ -x "$BUILD/lmcached" ] || die "no $BUILD/lmcached: build it first (cmake --build $BUILD)"
[ -f "$BUILD/liblmcached_cuda.so" ] ||
    die "no $BUILD/liblmcached_cuda.so: configure with nvcc present (-DLMC_CUDA=ON) and build"

# (no early exit in these pipes: with pipefail a SIGPIPE upstream would fail them)
ZMQ=$(ldconfig -p | awk '/libzmq\.so\.5 .*x86-64/ && !f {print $NF; f = 1}')
[ -n "$ZMQ" ] && [ -f "$ZMQ" ] || die "libzmq.so.5 not found by ldconfig -p"

# glibc's libraries and the loader stay the target's.
is_system() {
    case "$1" in
        linux-vdso.so.*|ld-linux*|libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|\
        libresolv.so.*|libutil.so.*|libanl.so.*|libnsl.so.*|libnss_*|libBrokenLocale.so.*|\
        libcuda.so.*|libnvidia-*) return 0 ;;
    esac
    return 1
}

# "soname path" lines of a binary's resolved dependencies, in ldd order.
deps() { ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'; }

rm -rf "$OUT"
mkdir -p "$OUT/lib"
cp -L "$BUILD/lmcached" "$BUILD/liblmcached_cuda.so" "$OUT/"
[ -x "$BUILD/lmcache-cli" ] && cp -L "$BUILD/lmcache-cli" "$OUT/"
[ -x "$BUILD/blend_check" ] && cp -L "$BUILD/blend_check" "$OUT/"

copy_deps() {
    local name path
    while read -r name path; do
        is_system "$name" && continue
        [ -e "$OUT/lib/$name" ] || cp -L "$path" "$OUT/lib/$name"
    done
}
deps "$OUT/lmcached" | copy_deps
deps "$OUT/liblmcached_cuda.so" | copy_deps
[ -e "$OUT/lmcache-cli" ] && deps "$OUT/lmcache-cli" | copy_deps
[ -e "$OUT/blend_check" ] && deps "$OUT/blend_check" | copy_deps
deps "$ZMQ" | copy_deps
cp -L "$ZMQ" "$OUT/lib/libzmq.so.5"

# libzmq's closure, leaves last as ldd lists them; the test retries in passes.
{ deps "$ZMQ" | awk '{print $1}' | while read -r n; do is_system "$n" || echo "$n"; done
  echo libzmq.so.5; } > "$OUT/zmq-libs.txt"

{
    echo "built on: $(uname -srm), $(ldd --version | awk 'NR == 1')"
    echo "from: $BUILD ($(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo '?'))"
    echo "nvcc: $( (nvcc --version 2>/dev/null || /usr/local/cuda/bin/nvcc --version 2>/dev/null) |
                 awk 'END {print}')"
    (cd "$OUT" && find . -type f ! -name MANIFEST | sort | xargs ls -l | awk '{print $5, $9}')
} > "$OUT/MANIFEST"

# Whatever the binaries still need from the system, on this machine.
missing=$(LD_LIBRARY_PATH="$OUT/lib" ldd "$OUT/lmcached" "$OUT/liblmcached_cuda.so" |
          grep 'not found' || true)
[ -z "$missing" ] || die "unresolved after bundling: $missing"
echo "bundle: $OUT ($(du -sh "$OUT" | cut -f1)); carry it, then run tests/gpu/run.sh"
