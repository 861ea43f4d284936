#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz (clang, ASan + UBSan) into build-fuzz and runs each
# for a short while, seeded with its committed corpus (tests/fuzz/corpus/manifest/ for
# manifest_fuzz, and so on). New inputs go to build-fuzz/corpus/<target>/, crash inputs to
# build-fuzz/crashes/<target>/: the tree is never written to. Exits non-zero when a target
# finds a crash, and names the saved input.
#   scripts/fuzz.sh [--seconds N] [--target NAME]
#     --seconds N    run each target for N seconds (default 20)
#     --target NAME  run only NAME: manifest_fuzz, row_file_fuzz, admission_file_fuzz or
#                    codec_fuzz (default: all four)
# JOBS=N sets the build's parallelism (default: nproc).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh

usage() {
  echo "usage: scripts/fuzz.sh [--seconds N] [--target manifest_fuzz|row_file_fuzz|admission_file_fuzz|codec_fuzz]" >&2
  exit 2
}

all_targets=(manifest_fuzz row_file_fuzz admission_file_fuzz codec_fuzz)
seconds=20
targets=("${all_targets[@]}")
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds)
      if [ $# -lt 2 ] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then usage; fi
      seconds=$2
      shift 2 ;;
    --target)
      [ $# -ge 2 ] || usage
      case " ${all_targets[*]} " in *" $2 "*) ;; *) usage ;; esac
      targets=("$2")
      shift 2 ;;
    *) usage ;;
  esac
done

# The project's build dependencies, clang and its libFuzzer and sanitizer runtimes.
bash scripts/setup.sh --fuzz

build="build-fuzz"
cmake -S tests/fuzz -B "$build" -DCMAKE_CXX_COMPILER=clang++
cmake --build "$build" -j"${JOBS:-$(nproc)}" --target "${targets[@]}"

export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
failed=()
summary=()
for t in "${targets[@]}"; do
  corpus="$build/corpus/$t"      # scratch: the seeds plus what this and earlier runs found
  crashes="$build/crashes/$t"
  log="$build/logs/$t.log"
  mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
  cp tests/fuzz/corpus/"${t%_fuzz}"/* "$corpus"/
  args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048
        -artifact_prefix="$crashes/" -print_final_stats=1)
  if [ "$t" = manifest_fuzz ]; then args+=(-dict=tests/fuzz/manifest.dict); fi
  marker="$build/logs/$t.start"
  touch "$marker"
  echo "fuzz: $t for ${seconds}s"
  status=0
  "$build/$t" "${args[@]}" "$corpus" >"$log" 2>&1 || status=$?
  if [ "$status" -ne 0 ]; then
    tail -n 80 "$log"
    failed+=("$t")
    summary+=("$t: FAILED (exit $status), log $log")
    for f in $(find "$crashes" -type f -newer "$marker" | sort); do
      summary+=("  crash input saved at $f (reproduce: $build/$t $f)")
    done
  else
    tail -n 3 "$log"
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log")
    cov=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | grep -oE 'cov: [0-9]+ ft: [0-9]+' || true)
    summary+=("$t: ok, ${runs:-?} runs, ${rate:-?} exec/s, ${cov:-cov: ?}")
  fi
done

echo
echo "fuzz summary (${seconds}s per target):"
printf '  %s\n' "${summary[@]}"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: crashes found in ${failed[*]}" >&2
  exit 1
fi
