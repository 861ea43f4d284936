#!/usr/bin/env bash
# The checks that need a GPU, in one run within a time budget, for a machine lent for a short
# while: binaries built elsewhere (a build tree with the CUDA backend: scripts/pack-gpu.sh) run
# here.
#   scripts/test-gpu.sh [--build DIR] [--out DIR] [--budget SECONDS] [--no-perf]
#                       [--no-sanitize] [--host-perf] [--python PYTHON] [--bundle FILE]
#                       [--only REGEX] [--profile]
# Phases, in order, each given what is left of the budget:
#   cuda      the behaviour tests with --backend cuda (in parallel), the Python package's tests
#             against DIR's library (tests/python, test_cuda.py's CUDA paths among them), the
#             kill-and-resume demo and the train-and-serve demo on the default backend (CUDA)
#   perf      on CUDA, most wanted first: the training step's breakdown (embstore-perf step);
#             the embedding step against nn.Embedding(sparse=True) + Adagrad (and FBGEMM's
#             TBE where installed) with the Python door's cost per call
#             (perf/peers/embedding_step.py); the device tier (tiers, 10% of the rows on the
#             device), and the SSD tier below it (20% in host memory, the rest on disk); training at max_capacity (every insert evicts); the fused update
#             (optimizer); train with incremental checkpoints every
#             100 steps, with admission (--admit-after 3), every 10 and 1000 steps, and with a
#             policy set but no checkpoint due; restore. With --host-perf also the host
#             backend's training with 1, 4 and all cores, checkpoints on and off, and
#             checkpoints per codec (10M rows)
#   sanitize  compute-sanitizer: memcheck over every behaviour test, racecheck and synccheck
#             over some, until the budget runs out (a check cut off is reported as such)
#   profile   with --profile, where nsys is installed: the device tier's tiers cell (10% of the
#             rows on the device, Zipf 1.1) under nsys, its kernel and API summaries in the log
# --only REGEX runs only the checks whose names match (grep -E), the rest reported as skipped:
# a short lent machine spent on what a change needs.
# Writes OUT/summary.txt (a line per check: name, exit status, seconds), a log per check, and
# OUT/*.json of the perf runs; prints the summary; with --bundle, packs OUT into FILE (a
# .tar.gz: one file to bring back). Exits 1 when a check failed.
set -uo pipefail
cd "$(dirname "$0")/.."
build=build
out=gpu-results
budget=480
perf=1
sanitize=1
host_perf=0
bundle=""
only=""
profile=0
python=${PYTHON:-python3}
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --no-perf) perf=0; shift ;;
    --no-sanitize) sanitize=0; shift ;;
    --host-perf) host_perf=1; shift ;;
    --bundle) bundle=$2; shift 2 ;;
    --python) python=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    --profile) profile=1; shift ;;
    *) echo "usage: scripts/test-gpu.sh [--build DIR] [--out DIR] [--budget SECONDS]" \
         "[--no-perf] [--no-sanitize] [--host-perf] [--python PYTHON] [--bundle FILE]" \
         "[--only REGEX] [--profile]" >&2
       exit 2 ;;
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
source scripts/gpu-tests.sh
behaviour=("${gpu_behaviour_tests[@]}")

left() { echo $((deadline - SECONDS)); }

# check NAME SECONDS COMMAND...: runs COMMAND under a timeout, its output in OUT/NAME.log.
# Status 124 in the summary: cut off by the timeout.
check() {
  local name=$1 limit=$2
  shift 2
  if [ -n "$only" ] && ! grep -Eq -- "$only" <<<"$name"; then
    echo "$name skipped (not selected)" >>"$summary"
    return
  fi
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
  # In the order of what a lent GPU is most wanted for, each given a share of what is left:
  # the training step's breakdown, the embedding step against PyTorch's, the device tier (10%
  # of the rows on the device against all of them; the rows created scattered, the fair case,
  # then in rank order, the hottest first: its best case), the fused update alone, training
  # with checkpoints, restore.
  check perf-step-cuda "$(( $(left) / 6 ))" "$p" step --backend cuda --steps 50 \
    --json "$out/perf-step-cuda.json"
  check peers-embedding-step "$(( $(left) / 6 ))" env PYTHONPATH="$PWD/python" \
    EMBSTORE_LIBRARY="$build/libembstore.so" "$python" perf/peers/embedding_step.py \
    --device cuda --steps 100 --warmup 10 --repeat 3 --calls 1000 \
    --out "$out/peers-embedding-step.json"
  check perf-tiers-cuda-scattered "$(( $(left) / 7 ))" "$p" tiers --backend cuda \
    --shares 1,0.1 --dists 1.1,uniform --batch 65536 --steps 50 --fill-order scattered \
    --json "$out/perf-tiers-cuda-scattered.json"
  # The SSD tier below a CUDA table (a stack over a host table): 10% on the device, 20% in host
  # memory, the rest on the disk of --dir.
  check perf-tiers-cuda-ssd "$(( $(left) / 7 ))" "$p" tiers --backend cuda \
    --shares 1,0.1 --memory-share 0.2 --dists 1.1 --batch 65536 --steps 50 --dir "$PWD" \
    --json "$out/perf-tiers-cuda-ssd.json"
  # Eviction at max_capacity: every insert past 1M rows makes room (make_room's histogram). Two
  # pairs, off then on and on then off: on 2026-12-04 the one run without checkpoints (first)
  # was 6x slower than the one with them.
  check perf-train-cuda-maxcap "$(( $(left) / 7 ))" "$p" train --backend cuda \
    --dir "$tmp/train" --max-capacity 1000000 --evict-idle-steps 500 --incremental-every 100 \
    --steps 1000 --repeat 2 --json "$out/perf-train-cuda-maxcap.json"
  check perf-optimizer-cuda "$(( $(left) / 8 ))" "$p" optimizer --backend cuda \
    --json "$out/perf-optimizer-cuda.json"
  check perf-tiers-cuda-rank "$(( $(left) / 8 ))" "$p" tiers --backend cuda \
    --shares 1,0.1 --dists 1.1 --batch 65536 --steps 50 --fill-order rank \
    --json "$out/perf-tiers-cuda-rank.json"
  check perf-train-cuda-k100 "$(( $(left) / 7 ))" "$p" train --backend cuda \
    --dir "$tmp/train" --incremental-every 100 --steps 1000 --repeat 2 \
    --json "$out/perf-train-cuda-k100.json"
  check perf-train-cuda-admit3 "$(( $(left) / 6 ))" "$p" train --backend cuda \
    --dir "$tmp/train" --admit-after 3 --incremental-every 100 --steps 1000 --repeat 2 \
    --json "$out/perf-train-cuda-admit3.json"
  for k in 10 1000; do
    check "perf-train-cuda-k$k" "$(( $(left) / 6 ))" "$p" train --backend cuda \
      --dir "$tmp/train" --incremental-every "$k" --steps "$(( k >= 1000 ? 4000 : 1000 ))" \
      --repeat 2 --json "$out/perf-train-cuda-k$k.json"
  done
  # A policy set, no checkpoint due: what merely setting one costs a short run.
  check perf-train-cuda-policy "$(( $(left) / 6 ))" "$p" train --backend cuda \
    --dir "$tmp/train" --zipf 0.8 --incremental-every 1000000 --steps 600 --repeat 3 \
    --json "$out/perf-train-cuda-policy.json"
  check perf-restore-cuda "$(( $(left) / 5 ))" "$p" restore --backend cuda --dir "$tmp/restore" \
    --rows 4000000 --deltas 0,4 --repeat 2 --json "$out/perf-restore-cuda.json"
  if [ "$host_perf" = 1 ]; then
    for threads in 1 4 0; do
      check "perf-train-host-t$threads" "$(( $(left) / 4 ))" "$p" train --backend host \
        --threads "$threads" --dir "$tmp/train-host" --incremental-every 100 --steps 400 \
        --repeat 1 --json "$out/perf-train-host-t$threads.json"
    done
    # The codecs on a machine with more cores than the development VM's 2 (issue 35's goal:
    # lossless at most 1.3x none's checkpoint time; encoder threads: one per core, at most 4).
    check perf-checkpoint-codecs-host "$(( $(left) / 3 ))" "$p" checkpoint --backend host \
      --dir "$tmp/ckpt-codecs" --rows 10000000 --dim 64 --dirty-fraction 0.01 \
      --codecs none,lossless/lossless,int8/bf16 --json "$out/perf-checkpoint-codecs-host.json"
  fi
fi

# -- profile: where a tiered step's time goes, on the device --
if [ "$profile" = 1 ] && command -v nsys >/dev/null; then
  check profile-tiers-cuda "$(( $(left) / 3 ))" nsys profile --stats=true --force-overwrite=true \
    -o "$tmp/tiers-profile" "$build/perf/embstore-perf" tiers --backend cuda --shares 0.1 \
    --dists 1.1 --batch 65536 --steps 20 --fill-order scattered
elif [ "$profile" = 1 ]; then
  echo "profile-tiers-cuda skipped (no nsys)" >>"$summary"
fi

# -- sanitize: what the budget leaves --
if [ "$sanitize" = 1 ] && command -v compute-sanitizer >/dev/null; then
  phase=$(( $(left) - 10 ))
  for t in "${behaviour[@]}"; do
    check "memcheck-$t" "$phase" compute-sanitizer --tool memcheck --error-exitcode 99 \
      --print-limit 20 "$build/tests/${t}_test" --backend cuda &
  done
  for t in tier eviction serving_backend admission; do
    check "racecheck-$t" "$phase" compute-sanitizer --tool racecheck --error-exitcode 99 \
      --print-limit 20 "$build/tests/${t}_test" --backend cuda &
  done
  check synccheck-eviction "$phase" compute-sanitizer --tool synccheck --error-exitcode 99 \
    --print-limit 20 "$build/tests/eviction_test" --backend cuda &
  wait
fi

echo "== summary"
cat "$summary"
if [ -n "$bundle" ]; then
  mkdir -p "$(dirname "$bundle")"
  tar czf "$bundle" -C "$(dirname "$out")" "$(basename "$out")"
fi
! grep -v " rc=0 \| skipped " "$summary" >/dev/null
