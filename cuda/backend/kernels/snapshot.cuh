// Kernels of snapshots: capture, drain and copy-on-write into staging records, the failed
// snapshot's dirty rows, and loading restored rows.
#pragma once

#include "cuda/backend/device.cuh"
#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"
#include "cuda/row/snapshot.h"

namespace embstore::cuda_backend {

// capture_word over every word of the bitmaps (freed rows left out; freed may be null);
// counts the captured rows.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    capture_kernel(bool full, uint64_t* dirty, uint64_t* captured, uint64_t n_words, uint64_t rows,
                   const uint64_t* freed, unsigned long long* total) {
  unsigned long long local = 0;
  for (uint64_t w = grid_thread<BlockSize>(); w < n_words; w += grid_threads<BlockSize>()) {
    const uint64_t gone = freed != nullptr ? freed[w] : 0;
    local += row::popcount64(row::capture_word(full, dirty, captured, w, rows, gone));
  }
  block_add<BlockSize>(local, total);
}

// dirty |= the rows a failed snapshot captured that are still live (evicted ones were written
// off with tombstones; freed may be null).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    restore_dirty_kernel(uint64_t* dirty, const uint64_t* snapshot_set, const uint64_t* freed,
                         uint64_t n_words) {
  for (uint64_t w = grid_thread<BlockSize>(); w < n_words; w += grid_threads<BlockSize>()) {
    row::restore_dirty_word(dirty, snapshot_set, w, freed != nullptr ? freed[w] : 0);
  }
}

// Captured rows per word of the window [first_word, first_word + n_words).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    captured_counts_kernel(const uint64_t* captured, uint64_t first_word, uint64_t n_words,
                           uint32_t* counts) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n_words; i += grid_threads<BlockSize>()) {
    counts[i] = static_cast<uint32_t>(row::popcount64(captured[first_word + i]));
  }
}

// Takes the first `want` captured rows of the window in row order: ends[i] is the inclusive
// prefix sum of the window's per-word counts, so word i's rows go to out[ends[i] - count ..].
// One thread owns a word. *total gets the captured rows of the window; *cut_word the word
// holding the want-th of them (meaningful where *total >= want): every word before it is
// empty afterwards.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    take_captured_kernel(uint64_t* captured, uint64_t first_word, uint64_t n_words,
                         const uint32_t* ends, uint64_t want, uint32_t* out,
                         unsigned long long* total, unsigned long long* cut_word) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n_words; i += grid_threads<BlockSize>()) {
    const uint64_t end = ends[i];
    if (i == n_words - 1) *total = end;
    const uint64_t word_index = first_word + i;
    uint64_t bits = captured[word_index];
    const uint64_t begin = end - static_cast<uint64_t>(row::popcount64(bits));
    if (bits == 0 || begin >= want) continue;
    if (want <= end) *cut_word = word_index;  // begin < want <= end: exactly one thread
    for (uint64_t j = begin; bits != 0 && j < want; ++j) {
      const uint64_t r =
          word_index * 64 + static_cast<uint64_t>(__ffsll(static_cast<long long>(bits)) - 1);
      bits &= bits - 1;
      (void)row::take_captured<false>(captured, r);  // the word is this thread's alone
      out[j] = static_cast<uint32_t>(r);
    }
  }
}

// Copy-on-write, first half: takes each captured row among the unique rows of a gradient batch
// and appends its id to out at *count (one atomic per warp). The loop bound is uniform within
// a block, so every warp is complete at the ballot.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    take_runs_kernel(uint64_t* captured, const uint32_t* run_rows, uint64_t n, uint32_t no_row,
                     uint32_t* out, unsigned long long* count) {
  static_assert(BlockSize % 32 == 0);
  const uint32_t lane = threadIdx.x % 32;
  for (uint64_t base = uint64_t{blockIdx.x} * BlockSize; base < n;
       base += grid_threads<BlockSize>()) {
    const uint64_t i = base + threadIdx.x;
    uint32_t r = 0;
    bool take = false;
    if (i < n) {
      r = run_rows[i];
      take = r != no_row && row::take_captured<true>(captured, r);
    }
    const uint32_t ballot = __ballot_sync(kFullMask, take);
    if (ballot == 0) continue;  // warp-uniform
    const int leader = __ffs(static_cast<int>(ballot)) - 1;
    unsigned long long first = 0;
    if (static_cast<int>(lane) == leader) {
      first = atomicAdd(count, static_cast<unsigned long long>(__popc(ballot)));
    }
    first = __shfl_sync(kFullMask, first, leader);
    if (take) out[first + static_cast<uint32_t>(__popc(ballot & ((1u << lane) - 1)))] = r;
  }
}

// One staging record per row id (row::write_record), padding zeroed; the first
// min(n, *count) ids where count is given (a count a kernel before it wrote).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    write_records_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n,
                         const unsigned long long* count, char* records, uint64_t record_size) {
  const uint64_t m = count != nullptr && *count < n ? *count : n;
  const uint64_t used = 8 + uint64_t{arena.stride} * 4;
  for (uint64_t i = grid_thread<BlockSize>(); i < m; i += grid_threads<BlockSize>()) {
    const uint32_t r = rows[i];
    char* record = records + i * record_size;
    row::write_record(record, arena.row_meta(r)->key, arena.row(r), arena.stride);
    if (record_size > used) memset(record + used, 0, record_size - used);
  }
}

// load_rows: row first_row + i for keys[i], keys distinct and absent from the index (checked
// before). Like rebuild_index_kernel, a claimed slot is final and nothing reads the index until
// the kernel ends.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    load_index_kernel(row::IndexRef index, row::ArenaRef arena, const int64_t* keys, uint64_t n,
                      uint64_t first_row, uint64_t step) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = keys[i];
    const uint32_t r = static_cast<uint32_t>(first_row + i);
    *arena.row_meta(r) = row::RowMeta{key, step};
    for (uint64_t s = index.home(key);; s = index.next(s)) {
      if (atomicCAS(&index.slots[s].row, row::kEmptyRow, r) == row::kEmptyRow) {
        index.slots[s].key = key;
        break;
      }
    }
  }
}

// load_rows: record of row first_row + i = [values[i]][state[i]], a tile per row as in
// init_rows_kernel.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    load_values_kernel(row::ArenaRef arena, const float* values, const float* state, uint64_t n,
                       uint64_t first_row, uint32_t tile_shift) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  const uint32_t stride = arena.stride;
  const uint32_t state_dim = stride - dim;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    float* record = arena.row(first_row + i);
    for (uint32_t c = t; c < stride; c += tile) {
      record[c] = c < dim ? values[i * dim + c] : state[i * state_dim + (c - dim)];
    }
  }
}

// load_rows: the rows a load added, in the counters (one thread).
static __global__ void add_loaded_rows_kernel(DeviceCounters* counters, unsigned long long rows) {
  counters->rows += rows;
  counters->inserted += rows;
}

}  // namespace embstore::cuda_backend
