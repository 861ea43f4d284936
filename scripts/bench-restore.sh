#!/usr/bin/env bash
# Restore seconds against chain length (embstore-perf restore: a full checkpoint and K deltas of
# 1% of the rows, K = 0, 1, 4, 16, each restored from a cold page cache into an empty store,
# against fio's sequential read of the full's row file and, alternating with the restores of the
# full alone, numpy's cold np.load of the same arrays), then a plot:
#   scripts/bench-restore.sh DIR [--rows N] [--repeat R]   (defaults: 10,000,000 rows, 3)
#   scripts/bench-restore.sh --replot                      (the plot again, from perf-results/)
# Checkpoints and numpy's files are written under DIR (about 11 GB for 10M rows, removed
# afterwards). Builds embstore-perf into build-rel (Release), installs fio and gnuplot
# (scripts/setup.sh --bench --plot) when needed, and numpy from PyPI into build-rel/.venv-bench.
# Results: perf-results/bench-restore.json, perf-results/bench-restore.dat and
# docs/restore-chain.png.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [--rows N] [--repeat R] | $0 --replot" >&2
  exit 1
fi
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-rel
results=$root/perf-results
json=$results/bench-restore.json
dat=$results/bench-restore.dat
rows=10000000
repeat=3
replot=0
if [[ $1 == --replot ]]; then
  replot=1
  [[ -f $dat ]] || { echo "$0: no $dat to plot" >&2; exit 1; }
else
  dir=$1
  shift
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --rows) rows=$2; shift 2 ;;
      --repeat) repeat=$2; shift 2 ;;
      *) echo "$0: unknown option $1" >&2; exit 1 ;;
    esac
  done
  mkdir -p "$dir"
fi
mkdir -p "$results" "$root/docs"

source "$root/scripts/env.sh"
bash "$root/scripts/setup.sh" --bench --plot >/dev/null
if [[ $replot -eq 0 ]]; then
  if [[ ! -f $build/CMakeCache.txt ]]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DEMBSTORE_CUDA=OFF \
      -DEMBSTORE_BUILD_TESTS=OFF >/dev/null
  fi
  cmake --build "$build" -j"$(nproc)" --target embstore-perf >/dev/null
  venv=$build/.venv-bench
  [[ -x $venv/bin/python ]] || python3 -m venv "$venv"
  "$venv/bin/python" -c "import numpy" 2>/dev/null || "$venv/bin/pip" install -q numpy
  "$build/perf/embstore-perf" restore --backend host --dir "$dir" --rows "$rows" \
    --deltas 0,1,4,16 --repeat "$repeat" --numpy "$venv/bin/python" --json "$json"
  python3 - "$json" >"$dat" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
fio = r["fio_bytes_per_second"]
print("# deltas seconds fio_seconds_for_the_same_bytes numpy_load_seconds rows=%d" % r["rows"])
for k in (0, 1, 4, 16):
    s = r["deltas_%d_seconds" % k]
    b = r["deltas_%d_row_file_bytes" % k]
    numpy = r.get("numpy_load_seconds", "NaN") if k == 0 else "NaN"
    print(k, s, b / fio if fio > 0 else "NaN", numpy)
PY
fi

gnuplot <<GP
set terminal pngcairo size 800,480 font ",11"
set output "$root/docs/restore-chain.png"
set title "embstore-perf restore: host backend, dim 64, Adagrad, cold page cache"
set xlabel "deltas after the full checkpoint (each 1% of the rows)"
set ylabel "seconds"
set xrange [-1:17]
set xtics (0, 1, 4, 16)
set yrange [0:*]
set key bottom right
set grid
plot "$dat" using 1:2 with linespoints lw 2 pt 7 title "embstore restore", \
     "$dat" using 1:3 with linespoints lw 2 pt 5 dt 2 title "fio sequential read of the same bytes", \
     "$dat" using 1:4 with points pt 9 ps 2 title "numpy np.load of the same arrays (full only)"
GP
echo "wrote $dat and docs/restore-chain.png"
