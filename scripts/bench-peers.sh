#!/usr/bin/env bash
# embstore against the checkpointing of its peers (numpy, safetensors, torch.save, torch DCP,
# DCP async_save, Orbax on JAX's CPU backend), all saving the same state (int64 keys, float32
# values and Adagrad accumulators of R rows x dim 64) until durable: full checkpoint, 1% delta,
# the training thread's stall, restore from a cold page cache (posix_fadvise(DONTNEED) on the
# files), peak memory; and a DLRM-like training step with embstore.torch.EmbeddingBag tables
# against nn.EmbeddingBag(sparse=True) + torch.optim.Adagrad on the CPU.
#   scripts/bench-peers.sh [--quick] [--rows N] [--repeat N] [--settle S] [--dir DATA_DIR]
#                          [--out OUT_DIR]
#     --quick: 1,000,000 rows, 3 repeats (several minutes); default: 10,000,000 rows, 1 repeat
#     --settle: seconds idle before each "settled" restore (default 30, --quick 10, on a VM
#              whose balloon reports free pages to the host, else 0); every restore also runs
#              "backed", on memory the host backs (perf/peers/bench_peers.py says why)
#     --dir:   where checkpoints are written (default /var/tmp/embstore-bench-peers; what this
#              run writes there is removed at the end, and the directory too if left empty)
#     --out:   where the results go (default perf-results/peers): bench-peers-rR.json (every
#              figure, the machine, the goal ratios), bench-peers-rR.png, bench-peers-rR.log
# Sets up (or reuses) the virtual environment .venv-bench at the repository root with numpy,
# safetensors, torch, jax, orbax-checkpoint and matplotlib from PyPI, and reinstalls the
# embstore package from the working tree (host backend only) on every run. The measurements
# are done by perf/peers/bench_peers.py, each in a fresh process.
set -euo pipefail

usage() {
  echo "usage: $0 [--quick] [--rows N] [--repeat N] [--settle S] [--dir DATA_DIR]" \
    "[--out OUT_DIR]" >&2
  exit 2
}
need_value() { [[ $# -ge 2 && -n $2 ]] || { echo "$0: $1 needs a value" >&2; usage; }; }
positive() {
  [[ $2 =~ ^[0-9]+$ && $2 -ge 1 ]] || { echo "$0: $1 must be a positive integer" >&2; usage; }
}

root=$(cd "$(dirname "$0")/.." && pwd)
caller=$PWD

quick=0
rows=""
repeat=""
settle=""
data_dir=/var/tmp/embstore-bench-peers
out_dir=$root/perf-results/peers
while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) quick=1; shift ;;
    --rows) need_value "$@"; positive "$1" "$2"; rows=$2; shift 2 ;;
    --repeat) need_value "$@"; positive "$1" "$2"; repeat=$2; shift 2 ;;
    --settle) need_value "$@"
      [[ $2 =~ ^[0-9]+$ ]] || { echo "$0: --settle must be a whole number of seconds" >&2; usage; }
      settle=$2; shift 2 ;;
    --dir) need_value "$@"; data_dir=$2; shift 2 ;;
    --out) need_value "$@"; out_dir=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$0: unknown argument $1" >&2; usage ;;
  esac
done

# --dir and --out given relative are relative to the caller's directory; the defaults are not.
[[ $data_dir == /* ]] || data_dir=$caller/$data_dir
[[ $out_dir == /* ]] || out_dir=$caller/$out_dir
cd "$root"

start=$(date +%s)
source "$root/scripts/env.sh"
bash "$root/scripts/setup.sh" >/dev/null

venv=$root/.venv-bench
if [[ ! -x $venv/bin/python ]]; then
  echo "bench-peers: creating $venv"
  python3 -m venv "$venv"
fi
py=$venv/bin/python
echo "bench-peers: installing the peers into $venv (PyPI)"
"$py" -m pip install -q numpy safetensors torch jax orbax-checkpoint matplotlib \
  "scikit-build-core>=0.10"
echo "bench-peers: installing embstore from the working tree (host backend)"
# --force-reinstall: it is the working tree that is measured. A build directory kept between
# runs (build-bench-peers, ignored by git as /build*/) makes that an incremental build; without
# build isolation, since scikit-build-core clears a build directory's CMake files whenever its
# own path changes, which a fresh isolated build environment does on every run.
"$py" -m pip install -q --force-reinstall --no-deps --no-build-isolation \
  -C cmake.define.EMBSTORE_CUDA=OFF -C build-dir=build-bench-peers .
setup_done=$(date +%s)
echo "bench-peers: environment ready in $((setup_done - start)) s"

# This run's checkpoints go into a directory of their own under DATA_DIR, removed at the end
# (DATA_DIR too when nothing else is left in it).
mkdir -p "$data_dir"
run_dir=$(mktemp -d "$data_dir/run.XXXXXX")
cleanup() {
  rm -rf "$run_dir"
  rmdir "$data_dir" 2>/dev/null || true
}
trap cleanup EXIT

args=(--dir "$run_dir" --out "$out_dir")
[[ $quick -eq 1 ]] && args+=(--quick)
[[ -n $rows ]] && args+=(--rows "$rows")
[[ -n $repeat ]] && args+=(--repeat "$repeat")
[[ -n $settle ]] && args+=(--settle "$settle")
# The driver keeps the machine's page cache and the other savers' files out of each
# measurement; it prints the table and the paths of the JSON and the PNG.
"$py" "$root/perf/peers/bench_peers.py" "${args[@]}"
echo "bench-peers: done in $(($(date +%s) - start)) s ($((setup_done - start)) s of setup)"
