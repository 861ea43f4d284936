#!/usr/bin/env bash
# Builds what scripts/test-gpu.sh runs, for a GPU machine lent for a short while that has CUDA
# and PyTorch but none of Debian's libraries: a Release build for one architecture without MPI
# and NCCL (build-gpu/), its binaries stripped, and liburing, libxxhash, libre2, libzstd and libfmt
# beside them, packed as one tarball to carry there:
#   scripts/pack-gpu.sh [--arch SM] [--out DIR]     (default: 90, gpu-pack/)
# On the GPU machine, from the repository root:
#   tar xzf gpu-pack/embstore-gpu.tar.gz && LD_LIBRARY_PATH=$PWD/gpu-lib \
#     scripts/test-gpu.sh --build build-gpu --out "$OUT/gpu" --budget 420
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

arch=90
out=gpu-pack
while [ $# -gt 0 ]; do
  case "$1" in
    --arch) arch=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    *) echo "usage: scripts/pack-gpu.sh [--arch SM] [--out DIR]" >&2; exit 2 ;;
  esac
done
command -v nvcc >/dev/null || { echo "pack-gpu: nvcc not found" >&2; exit 1; }

bash scripts/setup.sh
build=build-gpu
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES="$arch" \
  -DEMBSTORE_MPI=OFF -DEMBSTORE_NCCL=OFF >/dev/null
# What test-gpu.sh runs: the behaviour tests, the tools and demos, embstore-perf, the library;
# only these are built.
source scripts/gpu-tests.sh
tests=("${gpu_behaviour_tests[@]}")
targets=(embstore embstore-ckpt embstore-demo embstore-follow embstore-perf)
files=()
for t in "${tests[@]}"; do
  targets+=("${t}_test")
  files+=("$build/tests/${t}_test")
done
cmake --build "$build" -j"$(nproc)" --target "${targets[@]}"
files+=("$build/embstore-ckpt" "$build/embstore-demo" "$build/embstore-follow"
        "$build/perf/embstore-perf")
for f in "${files[@]}"; do strip "$f"; done
lib=$(readlink -f "$build/libembstore.so")
strip "$lib"
files+=("$build"/libembstore.so*)

rm -rf gpu-lib
mkdir -p gpu-lib "$out"
for name in liburing.so.2 libxxhash.so.0 libre2.so.9 libzstd.so.1 libfmt.so.9; do
  path=$(ldconfig -p | awk -v n="$name" '$1 == n { print $NF; exit }')
  [ -n "$path" ] || { echo "pack-gpu: $name not found" >&2; exit 1; }
  cp -L "$path" gpu-lib/
done
tar czf "$out/embstore-gpu.tar.gz" "${files[@]}" gpu-lib
rm -rf gpu-lib
ls -l "$out/embstore-gpu.tar.gz"
