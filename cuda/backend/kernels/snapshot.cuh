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

// Drain, listing (docs/DESIGN.md, "Drain on the GPU"): one reading of the window
// [first_word, first_word + n_words) of the captured bitmap, which copy-on-write may clear bits
// of meanwhile, into words[], and each word's count; the listing works from this reading only.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    read_window_kernel(const uint64_t* captured, uint64_t first_word, uint64_t n_words,
                       uint64_t* words, uint32_t* counts) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n_words; i += grid_threads<BlockSize>()) {
    const uint64_t bits = row::atomic_load(&captured[first_word + i]);
    words[i] = bits;
    counts[i] = static_cast<uint32_t>(row::popcount64(bits));
  }
}

// Lists the first `want` rows of the window's reading in row order, without taking them: ends[i]
// is the inclusive prefix sum of the counts, so word i's rows go to out[ends[i] - count ..].
// One thread owns a word. *total gets the rows of the window; *cut_word (meaningful where
// *total > want) the word to resume at: the one holding the want-th row, or the next one when
// that row was the word's last.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    list_window_kernel(const uint64_t* words, uint64_t first_word, uint64_t n_words,
                       const uint32_t* ends, uint64_t want, uint32_t* out,
                       unsigned long long* total, unsigned long long* cut_word) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n_words; i += grid_threads<BlockSize>()) {
    const uint64_t end = ends[i];
    if (i == n_words - 1) *total = end;
    uint64_t bits = words[i];
    const uint64_t begin = end - static_cast<uint64_t>(row::popcount64(bits));
    if (bits == 0 || begin >= want) continue;
    const uint64_t word_index = first_word + i;
    if (want <= end) *cut_word = want == end ? word_index + 1 : word_index;  // one thread
    for (uint64_t j = begin; bits != 0 && j < want; ++j) {
      out[j] = static_cast<uint32_t>(
          word_index * 64 + static_cast<uint64_t>(__ffsll(static_cast<long long>(bits)) - 1));
      bits &= bits - 1;
    }
  }
}

// Drain, taking: after the listed rows' records are copied (the kernel before this one on the
// drain stream), takes each listed row's captured bit. flags[i] = 1 where the drain took it:
// no copy-on-write had, so the row has not changed since capture and its copied record is
// good. 0 where copy-on-write took it first: that call writes the row, and the copy (which
// may have read the row while it was being updated) is dropped.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    take_listed_kernel(uint64_t* captured, const uint32_t* rows, uint64_t n, uint32_t* flags) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    flags[i] = row::take_captured<true>(captured, rows[i]) ? 1u : 0u;
  }
}

// Drain, compacting: record i of `records` goes to out[at[i]] where flags[i] is set (at: the
// exclusive prefix sum of flags), a tile per record; *kept gets the records kept.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    keep_taken_kernel(const char* records, const uint32_t* flags, const uint32_t* at, uint64_t n,
                      uint64_t record_size, uint32_t tile_shift, char* out,
                      unsigned long long* kept) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t lane = threadIdx.x & (tile - 1);
  if (grid_thread<BlockSize>() == 0) *kept = uint64_t{at[n - 1]} + flags[n - 1];
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    if (flags[i] == 0) continue;  // uniform within the tile
    row::move_record_part(out + at[i] * record_size, records + i * record_size, record_size, lane,
                          tile);
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

// One staging record per row id (row::write_record_part, a tile of lanes per record, padding
// zeroed); the first min(n, *count) ids where count is given (a count a kernel before it wrote).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    write_records_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n,
                         const unsigned long long* count, char* records, uint64_t record_size,
                         uint32_t tile_shift) {
  const uint64_t m = count != nullptr && *count < n ? *count : n;
  const uint32_t tile = 1u << tile_shift;
  const uint32_t lane = threadIdx.x & (tile - 1);
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < m;
       i += grid_threads<BlockSize>() >> tile_shift) {
    const uint32_t r = rows[i];
    row::write_record_part(records + i * record_size, arena.row_meta(r)->key, arena.row(r),
                           arena.stride, lane, tile);
  }
}

// load_rows, skipping held keys: keep[i] = 1 for the first occurrence (in input order) of each
// key the index does not hold, else 0. sorted_keys and sorted_pos: the piece's keys sorted
// stably, with their positions in the input.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    mark_new_load_keys_kernel(row::IndexRef index, const int64_t* sorted_keys,
                              const uint32_t* sorted_pos, uint64_t n, uint32_t* keep) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = sorted_keys[i];
    const bool first = i == 0 || sorted_keys[i - 1] != key;
    keep[sorted_pos[i]] = first && index.find(key) == row::kNoRow ? 1u : 0u;
  }
}

// positions[i] = i: the values sorted beside the keys.
static __global__ void positions_kernel(uint32_t* positions, uint64_t n) {
  for (uint64_t i = blockIdx.x * uint64_t{blockDim.x} + threadIdx.x; i < n;
       i += uint64_t{gridDim.x} * blockDim.x) {
    positions[i] = static_cast<uint32_t>(i);
  }
}

// load_rows: row first_row + at[i] for keys[i] where kept (keep and at null: every key, at[i] =
// i), the kept keys distinct and absent from the index (checked or marked before). Like
// rebuild_index_kernel, a claimed slot is final and nothing reads the index until the kernel
// ends.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    load_index_kernel(row::IndexRef index, row::ArenaRef arena, const int64_t* keys,
                      const uint32_t* keep, const uint32_t* at, uint64_t n, uint64_t first_row,
                      uint64_t step) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    if (keep != nullptr && keep[i] == 0) continue;
    const int64_t key = keys[i];
    const uint32_t r = static_cast<uint32_t>(first_row + (at != nullptr ? at[i] : i));
    *arena.row_meta(r) = row::RowMeta{key, step};
    insert_absent_concurrent(index, key, r);
  }
}

// load_rows: record of row first_row + at[i] = [values[i]][state[i]] where kept (as in
// load_index_kernel), a tile per row as in init_rows_kernel.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    load_values_kernel(row::ArenaRef arena, const float* values, const float* state,
                       const uint32_t* keep, const uint32_t* at, uint64_t n, uint64_t first_row,
                       uint32_t tile_shift) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  const uint32_t stride = arena.stride;
  const uint32_t state_dim = stride - dim;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    if (keep != nullptr && keep[i] == 0) continue;
    float* record = arena.row(first_row + (at != nullptr ? at[i] : i));
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
