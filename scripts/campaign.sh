#!/usr/bin/env bash
# The fault campaigns at a larger scale than the test suite runs them (tests/campaign/):
# corruption of every file type of a chain, SIGKILL of trainers (at random moments, at commit
# steps, at row writes) and of compact, and a real full disk. Prints each campaign's tally.
#   scripts/campaign.sh [--kills N] [--seed S]
#     --kills N  at least N kills in all (default 500; the test suite's run makes 52), with
#                the corruption trials scaled alike
#     --seed S   another draw of offsets, kill times and kill points (default: the suite's)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

usage() {
  echo "usage: scripts/campaign.sh [--kills N] [--seed S]" >&2
  exit 2
}

kills=500
seed=""
while [ $# -gt 0 ]; do
  case "$1" in
    --kills)
      [ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage
      kills=$2
      shift 2 ;;
    --seed)
      [ $# -ge 2 ] && [[ "$2" =~ ^[0-9]+$ ]] || usage
      seed=$2
      shift 2 ;;
    *) usage ;;
  esac
done

bash scripts/setup.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$(nproc)" --target campaign_test disk_full_test embstore-ckpt
# The suite's run kills 52 (40 trainers, 12 compactions) at scale 1.
export EMBSTORE_CAMPAIGN_SCALE=$(( (kills + 51) / 52 ))
if [ -n "$seed" ]; then export EMBSTORE_CAMPAIGN_SEED=$seed; fi
echo "campaign: scale $EMBSTORE_CAMPAIGN_SCALE${seed:+, seed $seed}"
status=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT
build/tests/campaign_test >"$log" 2>&1 || status=1
grep -v '^embstore: ' "$log" || true
code=0
build/tests/disk_full_test >"$log" 2>&1 || code=$?
grep -v '^embstore: ' "$log" || true
if [ "$code" -ne 0 ] && [ "$code" -ne 77 ]; then status=1; fi
exit $status
