#!/usr/bin/env bash
# Sets up, builds, and runs the demo on the default backend (CUDA where a device is usable,
# else host): a synthetic training loop with incremental checkpoints is killed partway, then
# resumed from its checkpoints and checked bit for bit against a replay of the same training.
#   scripts/demo.sh [STEPS KILL_AT]   (defaults 300 and 237)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh
bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target embstore-demo embstore-ckpt
examples/kill_and_resume.sh build/embstore-demo build/embstore-ckpt "$@"
