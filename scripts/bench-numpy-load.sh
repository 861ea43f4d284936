#!/usr/bin/env bash
# The baseline of issue 15's goal "a restore at least as fast as numpy's cold load of the same
# arrays": writes the arrays a table of N rows x dim 64 with Adagrad state holds (int64 keys,
# float32 values, float32 accumulators) as .npy files under DIR, drops them from the page cache
# (fsync, then posix_fadvise DONTNEED) and times np.load of the three, REPEAT times:
#   scripts/bench-numpy-load.sh DIR [ROWS] [REPEAT]      (defaults: 10,000,000 rows, 3)
# numpy comes from PyPI into build-rel/.venv-bench (created when missing). The files are removed
# afterwards. Prints one line per load and the median; compare with embstore-perf restore's
# "full + 0 deltas" on the same DIR.
set -euo pipefail

if [[ $# -lt 1 ]]; then
  echo "usage: $0 DIR [ROWS] [REPEAT]" >&2
  exit 1
fi
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$1
rows=${2:-10000000}
repeat=${3:-3}
venv=$root/build-rel/.venv-bench
if [[ ! -x $venv/bin/python ]]; then
  mkdir -p "$root/build-rel"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -c "import numpy" 2>/dev/null || "$venv/bin/pip" install -q numpy
mkdir -p "$dir"
work=$(mktemp -d "$dir/numpy-load-XXXXXX")
trap 'rm -rf "$work"' EXIT

"$venv/bin/python" - "$work" "$rows" "$repeat" <<'PY'
import os, statistics, sys, time
import numpy as np

work, rows, repeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dim = 64
names = ["keys", "values", "accumulators"]
rng = np.random.default_rng(42)
np.save(os.path.join(work, "keys.npy"), rng.integers(-2**62, 2**62, size=rows, dtype=np.int64))
for name in names[1:]:
    a = rng.standard_normal((rows, dim), dtype=np.float32)
    np.save(os.path.join(work, name + ".npy"), a)
    del a
paths = [os.path.join(work, n + ".npy") for n in names]
total = sum(os.path.getsize(p) for p in paths)

def drop_cache():
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)

times = []
for _ in range(repeat):
    drop_cache()
    start = time.perf_counter()
    arrays = [np.load(p) for p in paths]
    seconds = time.perf_counter() - start
    assert arrays[1].shape == (rows, dim)
    del arrays
    times.append(seconds)
    print(f"np.load of {total / 1e9:.2f} GB: {seconds:.3f} s, {total / seconds / 1e9:.2f} GB/s")
print(f"median {statistics.median(times):.3f} s over {repeat} loads ({rows} rows x dim {dim}, "
      f"keys, values and accumulators)")
PY
