#!/usr/bin/env bash
# The checks that need a GPU, in one run within a time budget, for a machine lent for a short
# while: binaries built elsewhere (a build tree with the CUDA backend) run here.
#   scripts/test-gpu.sh [--build DIR] [--out DIR] [--budget SECONDS] [--no-perf]
#                       [--no-sanitize] [--python PYTHON]
# Phases, in order, each given what is left of the budget:
#   cuda      the behaviour tests with --backend cuda (in parallel), the Python package's tests
#             against DIR's library (tests/python, test_cuda.py's CUDA paths among them), the
#             kill-and-resume demo and the train-and-serve demo on the default backend (CUDA)
#   perf      embstore-perf train and restore on CUDA; the host backend's training with 1, 4
#             and all cores, checkpoints on and off (thread scaling, overlap on spare cores)
#   sanitize  compute-sanitizer: memcheck over every behaviour test, racecheck and synccheck
#             over some, until the budget runs out (a check cut off is reported as such)
# Writes OUT/summary.txt (a line per check: name, exit status, seconds), a log per check, and
# OUT/*.json of the perf runs; prints the summary. Exits 1 when a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
out=gpu-results
budget=480
perf=1
sanitize=1
python=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --no-perf) perf=0; shift ;;
    --no-sanitize) sanitize=0; shift ;;
    --python) python=$2; shift 2 ;;
    *) echo "usage: scripts/test-gpu.sh [--build DIR] [--out DIR] [--budget SECONDS]" \
         "[--no-perf] [--no-sanitize] [--python PYTHON]" >&2; exit 2 ;;
  esac
done
build=$(cd "$build" && pwd)
mkdir -p "$out"
out=$(cd "$out" && pwd)
summary=$out/summary.txt
: >"$summary"
deadline=$((SECONDS + budget))
tmp=$(mktemp -d "${TMPDIR:-/tmp}/embstore-gpu-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
behaviour=(api optimizer table checkpoint eviction admission serving_backend)

left() { echo $((deadline - SECONDS)); }

# check NAME SECONDS COMMAND...: runs COMMAND under a timeout, its output in OUT/NAME.log.
# Status 124 in the summary: cut off by the timeout.
check() {
  local name=$1 limit=$2
  shift 2
  if [ "$limit" -le 5 ]; then
    echo "$name skipped (no time left)" >>"$summary"
    return
  fi
  local start=$SECONDS
  timeout -k 5 "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $((SECONDS - start))s" >>"$summary"
}

{
  echo "date: $(date -u +%F' '%T) UTC"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1
  echo "cores: $(nproc); kernel: $(uname -r)"
  "$python" -c 'import sys, torch; print("python", sys.version.split()[0], "torch",
    torch.__version__, "cuda", torch.cuda.is_available())' 2>&1
} >"$out/machine.txt"
cat "$out/machine.txt"

# -- cuda: behaviour tests, the Python package, the demos (in parallel: one GPU, many cores) --
phase=$(( $(left) * 2 / 5 ))
for t in "${behaviour[@]}"; do
  check "cuda-$t" "$phase" "$build/tests/${t}_test" --backend cuda &
done
check python "$phase" env PYTHONPATH="$PWD/python" EMBSTORE_LIBRARY="$build/libembstore.so" \
  EMBSTORE_CKPT="$build/embstore-ckpt" PYTHONUNBUFFERED=1 \
  "$python" -m unittest discover -s tests/python -t tests/python -v &
check demo-kill-and-resume "$phase" examples/kill_and_resume.sh "$build/embstore-demo" \
  "$build/embstore-ckpt" &
check demo-train-and-serve "$phase" examples/train_and_serve.sh "$build/embstore-demo" \
  "$build/embstore-follow" &
wait

# -- perf: alone on the machine --
if [ "$perf" = 1 ]; then
  p="$build/perf/embstore-perf"
  phase=$(( $(left) / 2 ))
  check perf-train-cuda "$phase" "$p" train --backend cuda --dir "$tmp/train" \
    --incremental-every 100 --steps 1500 --repeat 1 --json "$out/perf-train-cuda.json"
  check perf-restore-cuda "$(( $(left) / 3 ))" "$p" restore --backend cuda --dir "$tmp/restore" \
    --rows 4000000 --deltas 0,4 --repeat 2 --json "$out/perf-restore-cuda.json"
  for threads in 1 4 0; do
    check "perf-train-host-t$threads" "$(( $(left) / 4 ))" "$p" train --backend host \
      --threads "$threads" --dir "$tmp/train-host" --incremental-every 100 --steps 400 \
      --repeat 1 --json "$out/perf-train-host-t$threads.json"
  done
fi

# -- sanitize: what the budget leaves --
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  phase=$(( $(left) - 10 ))
  for t in "${behaviour[@]}"; do
    check "memcheck-$t" "$phase" compute-sanitizer --tool memcheck --error-exitcode 99 \
      --print-limit 20 "$build/tests/${t}_test" --backend cuda &
  done
  for t in eviction serving_backend admission; do
    check "racecheck-$t" "$phase" compute-sanitizer --tool racecheck --error-exitcode 99 \
      --print-limit 20 "$build/tests/${t}_test" --backend cuda &
  done
  check synccheck-eviction "$phase" compute-sanitizer --tool synccheck --error-exitcode 99 \
    --print-limit 20 "$build/tests/eviction_test" --backend cuda &
  wait
fi

echo "== summary"
cat "$summary"
! grep -v " rc=0 \| skipped " "$summary" >/dev/null
