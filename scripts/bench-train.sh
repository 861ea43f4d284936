#!/usr/bin/env bash
# Training steps/s with checkpointing off and on, for incremental checkpoints every 10, 100 and
# 1000 steps (embstore-perf train with its other defaults: batch 65536, dim 64, Zipf 1.1 over
# 10M ids, Adagrad, one training thread, host backend), then a plot of steps/s against the
# interval:
#   scripts/bench-train.sh DIR [INTERVAL...]     (intervals default to 10 100 1000)
#   scripts/bench-train.sh --replot               (the plot again, from perf-results/)
# Checkpoints are written under DIR. Builds embstore-perf into build-rel (Release) and installs
# gnuplot (scripts/setup.sh --plot) when needed. Results: perf-results/bench-train-K.json for
# each interval K, perf-results/bench-train.dat, and docs/train-interval.png.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [INTERVAL...] | $0 --replot" >&2
  exit 1
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-rel
results=$root/perf-results
dat=$results/bench-train.dat
replot=0
if [[ $1 == --replot ]]; then
  replot=1
  [[ -f $dat ]] || { echo "$0: no $dat to plot" >&2; exit 1; }
  mapfile -t intervals < <(awk '!/^#/ {print $1}' "$dat")
else
  dir=$1
  shift
  intervals=("$@")
  [[ ${#intervals[@]} -eq 0 ]] && intervals=(10 100 1000)
  mkdir -p "$dir"
fi
mkdir -p "$results" "$root/docs"

source "$root/scripts/env.sh"
bash "$root/scripts/setup.sh" --plot >/dev/null
if [[ $replot -eq 0 ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DEMBSTORE_CUDA=OFF \
      -DEMBSTORE_BUILD_TESTS=OFF >/dev/null
  fi
  cmake --build "$build" -j"$(nproc)" --target embstore-perf >/dev/null
  echo "# interval steps_per_second_off steps_per_second_on stall_seconds_p99" >"$dat"
  for k in "${intervals[@]}"; do
    json=$results/bench-train-$k.json
    "$build/perf/embstore-perf" train --backend host --dir "$dir" --incremental-every "$k" \
      --json "$json"
    python3 - "$json" "$k" >>"$dat" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(sys.argv[2], r["steps_per_second_off"], r["steps_per_second_on"], r["stall_seconds_p99"])
PY
  done
fi

xtics=$(IFS=,; echo "${intervals[*]}")
gnuplot <<GP
set terminal pngcairo size 800,480 font ",11"
set output "$root/docs/train-interval.png"
set title "embstore-perf train: host backend, batch 65536, dim 64, Adagrad, 1 training thread"
set xlabel "incremental checkpoint every K steps"
set ylabel "training steps/s"
set logscale x
set xrange [7:1400]
set xtics ($xtics)
set yrange [0:*]
set key bottom right
set grid
plot "$dat" using 1:2 with linespoints lw 2 pt 7 title "checkpointing off", \
     "$dat" using 1:3 with linespoints lw 2 pt 5 title "checkpointing on"
GP
echo "wrote $dat and docs/train-interval.png"
