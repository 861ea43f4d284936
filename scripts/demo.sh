#!/usr/bin/env bash
# Sets up, builds, and runs a small synthetic training loop on the default backend (CUDA where
# a device is usable, else host), then prints what it did.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target embstore-demo
./build/embstore-demo "$@"
