#!/usr/bin/env bash
# Installs embstore's build dependencies from Debian's packages (Open MPI included: sharded
# stores' host exchange and the multi-process tests; Doxygen: the C API reference,
# scripts/docs.sh). Idempotent: does nothing when everything is present. The CUDA toolkit
# (nvcc, CUB, NCCL) is expected at /usr/local/cuda where a CUDA build is wanted; without it
# the build is host-only.
#   scripts/setup.sh [--plot] [--fuzz] [--bench]
#     --plot: also gnuplot, for the benchmark plots (scripts/bench-*.sh)
#     --fuzz: also clang and its libFuzzer and sanitizer runtimes (scripts/fuzz.sh)
#     --bench: also fio, the disk baseline of `embstore-perf restore`
set -euo pipefail

packages=(build-essential cmake pkg-config liburing-dev libfmt-dev catch2 nlohmann-json3-dev
          libxxhash-dev libre2-dev libzstd-dev libcli11-dev python3 openmpi-bin libopenmpi-dev
          doxygen)
for arg in "$@"; do
  case "$arg" in
    --plot) packages+=(gnuplot-nox) ;;
    --fuzz) packages+=(clang libclang-rt-14-dev) ;;
    --bench) packages+=(fio) ;;
    *) echo "usage: scripts/setup.sh [--plot] [--fuzz] [--bench]" >&2; exit 2 ;;
  esac
done

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all dependencies present"
  exit 0
fi

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
