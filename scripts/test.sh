#!/usr/bin/env bash
# Sets up, builds and runs the test suite.
#   scripts/test.sh                    default build (CUDA backend compiled where nvcc exists)
#   scripts/test.sh --sanitize         host-only build with AddressSanitizer + UBSan
#   scripts/test.sh --sanitize thread  host-only build with ThreadSanitizer
# The default also runs the Python package's tests (scripts/test-python.sh: a clean virtual
# environment, `pip install .[torch]`, tests/python).
# CUDA tests carry the ctest label "cuda" and report as skipped where no device is usable;
# multi-process tests (label "mpi") run under mpirun where MPI was found.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

usage() {
  echo "usage: scripts/test.sh [--sanitize [address|thread]]" >&2
  exit 2
}
sanitize=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize)
      sanitize=address
      if [ $# -ge 2 ] && [[ "$2" != --* ]]; then
        case "$2" in address|thread) sanitize=$2 ;; *) usage ;; esac
        shift
      fi
      shift ;;
    *) usage ;;
  esac
done

bash scripts/setup.sh
jobs=$(nproc)
case "$sanitize" in
  address)
    build=build-sanitize
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBSTORE_CUDA=OFF \
      -DEMBSTORE_SANITIZE=address -DEMBSTORE_BUILD_PERF=OFF -DEMBSTORE_MPI=OFF
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
    export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ;;
  thread)
    build=build-tsan
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBSTORE_CUDA=OFF \
      -DEMBSTORE_SANITIZE=thread -DEMBSTORE_BUILD_PERF=OFF -DEMBSTORE_MPI=OFF
    # A report fails the test; io_uring's kernel-side accesses are invisible to it.
    export TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 report_signal_unsafe=0" ;;
  *)
    build=build
    # EMBSTORE_CUDA_ARCHITECTURES (e.g. 90): device code for those architectures only, in place
    # of the project's default (80;90); CI compiles one, which checks the CUDA code as well and
    # costs half the device compilation.
    archs=()
    if [ -n "${EMBSTORE_CUDA_ARCHITECTURES:-}" ]; then
      archs=(-DCMAKE_CUDA_ARCHITECTURES="$EMBSTORE_CUDA_ARCHITECTURES")
    fi
    cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "${archs[@]}" ;;
esac
cmake --build "$build" -j"$jobs"
# Under the sanitizers, no MPI (the build leaves it out, and with it the multi-process tests):
# Open MPI's own libraries are not instrumented, and LeakSanitizer reports what they keep at
# exit. The routing code they run is covered there by shard_test. Under ThreadSanitizer, not
# the fault campaigns and demos either (labels campaign, demo): processes killed and files
# corrupted one at a time, whose threads are the suite's own (run under it in the host tests),
# at several times their cost.
exclude=()
case "$sanitize" in
  thread) exclude=(-LE 'campaign|demo') ;;
esac
ctest --test-dir "$build" --output-on-failure -j"$jobs" "${exclude[@]}"
if [ -z "$sanitize" ]; then
  bash scripts/test-python.sh
fi
