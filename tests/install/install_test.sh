#!/usr/bin/env bash
# Installs the build into a scratch prefix, then builds and runs a consumer through
# find_package(embstore) and through pkg-config.
set -euo pipefail
build_dir=$1
source_dir=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cmake --install "$build_dir" --prefix "$work/prefix" >/dev/null
for f in include/embstore/embstore.h lib/libembstore.so lib/cmake/embstore/embstoreConfig.cmake \
         lib/pkgconfig/embstore.pc bin/embstore-perf bin/embstore-ckpt; do
  [ -e "$work/prefix/$f" ] || { echo "not installed: $f"; exit 1; }
done

cmake -S "$source_dir/consumer" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$work/prefix" >/dev/null
cmake --build "$work/consumer" >/dev/null
LD_LIBRARY_PATH="$work/prefix/lib" "$work/consumer/consumer"

export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
cc -std=c99 -Wall -Werror "$source_dir/consumer/main.c" -o "$work/pc_consumer" \
  $(pkg-config --cflags --libs embstore)
LD_LIBRARY_PATH="$work/prefix/lib" "$work/pc_consumer"
echo "install test passed"
