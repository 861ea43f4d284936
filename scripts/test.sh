#!/usr/bin/env bash
# Sets up, builds and runs the test suite.
#   scripts/test.sh             default build (CUDA backend compiled where nvcc exists)
#   scripts/test.sh --sanitize  host-only build with AddressSanitizer + UBSan
# CUDA tests carry the ctest label "cuda" and report as skipped where no device is usable.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

sanitize=0
for arg in "$@"; do
  case "$arg" in
    --sanitize) sanitize=1 ;;
    *) echo "usage: scripts/test.sh [--sanitize]" >&2; exit 2 ;;
  esac
done

bash scripts/setup.sh
jobs=$(nproc)
if [ "$sanitize" -eq 1 ]; then
  build=build-sanitize
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBSTORE_CUDA=OFF \
    -DEMBSTORE_SANITIZE=ON -DEMBSTORE_BUILD_PERF=OFF
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  build=build
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build "$build" -j"$jobs"
ctest --test-dir "$build" --output-on-failure -j"$jobs"
