#!/usr/bin/env bash
# Build llama.cpp's libllama and the client probe (scripts/llama_probe) once per machine, into a cache
# folder outside the repository: the client tests (tests/clients/test_clients_llamacpp.py) and
# benchmarks/clients.py run real llama.cpp loads through ckptfs mounts with it.
#
# The sources are the llama.cpp tree vendored in llama-cpp-python's sdist (PyPI is the one registry the
# project's machines reach). Only libllama, the CPU backend and the probe are compiled (about 10 minutes on
# 2 cores); a second run finds the binary and its stamp and returns at once.
#   bash scripts/build_llama_cpp.sh            prints the probe's path on its last line
#   bash scripts/build_llama_cpp.sh --path     prints where the probe is (or would be); builds nothing
# Environment: CKPTFS_LLAMA_CACHE (default /var/cache/ckptfs-test), PYTHON (a python with pip),
#              CKPTFS_LLAMA_JOBS (default 2).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
VERSION=0.3.36                                   # llama-cpp-python; its vendor/llama.cpp is what we build
CACHE=${CKPTFS_LLAMA_CACHE:-/var/cache/ckptfs-test}
PYTHON=${PYTHON:-python3}
JOBS=${CKPTFS_LLAMA_JOBS:-2}

# CPU flags: a portable x86-64-v3 build where the CPU has AVX2 (GGML_NATIVE off, so a cache copied to a
# machine of the same kind still runs), a baseline build otherwise.
if grep -qw avx2 /proc/cpuinfo 2>/dev/null && grep -qw fma /proc/cpuinfo; then
    FLAVOUR=avx2
    CPU_FLAGS=(-DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON)
else
    FLAVOUR=base
    CPU_FLAGS=()
fi
DIR=$CACHE/llama.cpp-$VERSION-$FLAVOUR
PROBE=$DIR/bin/ckptfs-llama-probe
# What the binary depends on: the probe's sources, the llama.cpp version, the CPU flags.
STAMP=$( { cat "$HERE/llama_probe/CMakeLists.txt" "$HERE/llama_probe/probe.cpp"; echo "$VERSION ${CPU_FLAGS[*]}"; } \
        | sha256sum | cut -c1-16)

if [ "${1:-}" = "--path" ] || { [ -x "$PROBE" ] && [ "$(cat "$DIR/stamp" 2>/dev/null)" = "$STAMP" ]; }; then
    echo "$PROBE"
    exit 0
fi

mkdir -p "$DIR"
exec 9>"$DIR/.lock"
flock 9                                           # two concurrent callers build once
if [ -x "$PROBE" ] && [ "$(cat "$DIR/stamp" 2>/dev/null)" = "$STAMP" ]; then
    echo "$PROBE"
    exit 0
fi

SRC=$DIR/src/llama.cpp
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    echo "build_llama_cpp: fetching llama-cpp-python $VERSION sources" >&2
    rm -rf "$DIR/src" "$DIR/sdist"
    mkdir -p "$DIR/sdist" "$DIR/src"
    "$PYTHON" -m pip download -q --no-deps --no-binary :all: \
        "llama-cpp-python==$VERSION" -d "$DIR/sdist" >&2
    tar -xzf "$DIR"/sdist/llama_cpp_python-"$VERSION".tar.gz -C "$DIR/src" \
        --strip-components=2 "llama_cpp_python-$VERSION/vendor/llama.cpp"
    rm -rf "$DIR/sdist"
fi

echo "build_llama_cpp: building libllama + ckptfs-llama-probe ($FLAVOUR, -j$JOBS) in $DIR/build" >&2
cmake -S "$HERE/llama_probe" -B "$DIR/build" -DLLAMA_SRC="$SRC" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DGGML_NATIVE=OFF "${CPU_FLAGS[@]}" -DGGML_OPENMP=ON >"$DIR/cmake.log" 2>&1 \
    || { tail -30 "$DIR/cmake.log" >&2; exit 1; }
cmake --build "$DIR/build" --target ckptfs-llama-probe -j"$JOBS" >"$DIR/build.log" 2>&1 \
    || { tail -30 "$DIR/build.log" >&2; exit 1; }
mkdir -p "$DIR/bin"
install -m 0755 "$DIR/build/ckptfs-llama-probe" "$PROBE"
echo "$STAMP" >"$DIR/stamp"
echo "$PROBE"
