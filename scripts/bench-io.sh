#!/usr/bin/env bash
# Compares the checkpoint writer (embstore-perf io) with fio on the same directory:
#   scripts/bench-io.sh DIR [BYTES]     (BYTES defaults to 2 GiB)
# fio writes sequentially with 1 MiB O_DIRECT blocks through io_uring at depth 16, the same
# shape as FileWriter's defaults, so the ratio shows what the writer leaves on the table.
# Installs fio when missing and builds embstore-perf into build-rel (Release) when needed.
# Results: perf-results/bench-io-{fio,embstore}.json.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 DIR [BYTES]" >&2
  exit 1
fi
dir=$1
bytes=${2:-2147483648}
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-rel
results=$root/perf-results
mkdir -p "$dir" "$results"

if ! command -v fio >/dev/null; then
  sudo=""
  [[ $(id -u) -ne 0 ]] && sudo=sudo
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq fio
fi

# Always run the build: it is quick when nothing changed and picks up edits when something did.
if [[ ! -f $build/CMakeCache.txt ]]; then
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
fi
cmake --build "$build" --target embstore-perf -j"$(nproc)"

echo "== fio: sequential write, 1 MiB, O_DIRECT, io_uring, depth 16, $bytes bytes in $dir"
fio --name=embstore --directory="$dir" --rw=write --bs=1M --direct=1 --ioengine=io_uring \
  --iodepth=16 --size="$bytes" --output-format=json \
  --output="$results/bench-io-fio.json"
rm -f "$dir"/embstore.[0-9]*.[0-9]*

echo "== embstore-perf io"
"$build/perf/embstore-perf" io --dir "$dir" --bytes "$bytes" --queue-depth 16 \
  --json "$results/bench-io-embstore.json"

python3 - "$results/bench-io-fio.json" "$results/bench-io-embstore.json" <<'EOF'
import json, sys
fio = json.load(open(sys.argv[1]))
emb = json.load(open(sys.argv[2]))
fio_bw = fio["jobs"][0]["write"]["bw_bytes"]
w, r, b = (emb["writer_bytes_per_second"], emb["reader_bytes_per_second"],
           emb["buffered_bytes_per_second"])
print(f"fio write         {fio_bw / 1e9:8.3f} GB/s")
print(f"embstore writer   {w / 1e9:8.3f} GB/s  ({emb['writer_engine']}, fsync included)")
print(f"embstore reader   {r / 1e9:8.3f} GB/s  ({emb['reader_engine']})")
print(f"buffered baseline {b / 1e9:8.3f} GB/s  (write() 1 MiB + fsync)")
print(f"writer / fio      {w / fio_bw:8.3f}")
print(f"writer / buffered {w / b:8.3f}")
EOF
