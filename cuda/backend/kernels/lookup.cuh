// Kernels of lookup and insert: resolving keys to rows, the concurrent find-or-insert, filling
// new rows from the initializer, gathering rows, the max_capacity count, index rebuilds, and
// the dirty-row count of counters().
#pragma once

#include <cuda/atomic>

#include "cuda/backend/device.cuh"
#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"
#include "cuda/row/snapshot.h"

namespace embstore::cuda_backend {

// Row id per key (no_row where absent); positions and missing are optional.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    resolve_rows_kernel(row::IndexRef index, const int64_t* keys, uint64_t n, uint32_t no_row,
                        uint32_t* rows, uint32_t* positions, unsigned long long* missing) {
  unsigned long long local = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const uint32_t r = index.find(keys[i]);
    const bool found = r != row::kNoRow;
    rows[i] = found ? r : no_row;
    if (positions != nullptr) positions[i] = static_cast<uint32_t>(i);
    local += found ? 0 : 1;
  }
  if (missing != nullptr) block_add<BlockSize>(local, missing);
}

// Where find_or_insert_kernel takes row ids from, and what it does beside inserting.
struct InsertParams {
  // Evicted rows, taken from the top (free_list[free_rows - 1] first) before fresh ids; the
  // count of the list is counters->free_rows, fixed for the kernel. Null: no eviction.
  const uint32_t* free_list;
  uint64_t* freed;  // a reused row's bit is cleared
  // Positions whose key is pending admission (nonzero): they neither insert nor probe and
  // read the key's initial values (gather_rows_kernel). Null: none.
  const uint8_t* pending;
  bool touch;  // tables that evict: stamp the rows found with the step
};

// One thread per key. A slot is claimed by CAS on its row field (empty -> locked); the winner
// writes the key and publishes a row id (a freed one first, else a fresh one) with a release
// store. Others wait out the lock and then compare the key, so duplicates in a batch share the
// winner's row.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    find_or_insert_kernel(row::IndexRef index, row::ArenaRef arena, const int64_t* keys, uint64_t n,
                          uint64_t step, InsertParams params, uint32_t* rows, uint8_t* created,
                          DeviceCounters* counters) {
  using RowRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
  using StepRef = cuda::atomic_ref<uint64_t, cuda::thread_scope_device>;
  const unsigned long long free_rows = params.free_list != nullptr ? counters->free_rows : 0;
  unsigned long long local = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = keys[i];
    uint32_t found = row::kNoRow;
    uint8_t mine = 0;
    if (params.pending != nullptr && params.pending[i] != 0) {
      rows[i] = row::kNoRow;
      created[i] = 0;
      continue;
    }
    for (uint64_t s = index.home(key);; s = index.next(s)) {
      row::Slot& slot = index.slots[s];
      RowRef ref(slot.row);
      uint32_t r = ref.load(cuda::memory_order_acquire);
      if (r == row::kEmptyRow) {
        if (ref.compare_exchange_strong(r, row::kLockedRow, cuda::memory_order_acquire,
                                        cuda::memory_order_acquire)) {
          slot.key = key;
          const unsigned long long k =
              free_rows > 0 ? atomicAdd(&counters->free_taken, 1ull) : free_rows;
          if (k < free_rows) {
            found = params.free_list[free_rows - 1 - k];
            row::bitmap_clear<true>(params.freed, found);
          } else {
            found = static_cast<uint32_t>(atomicAdd(&counters->rows, 1ull));
          }
          // The row's key goes with its id: an index rebuild reads keys from the metadata, so
          // it must never see an id whose metadata a later kernel was to write.
          *arena.row_meta(found) = row::RowMeta{key, step};
          ref.store(found, cuda::memory_order_release);  // publishes the key too
          mine = 1;
          break;
        }
        // Lost the race: r holds the winner's value, locked or already published.
      }
      while (r == row::kLockedRow) {
        __nanosleep(32);
        r = ref.load(cuda::memory_order_acquire);
      }
      if (slot.key == key) {  // ordered after the acquire that saw the published row
        found = r;
        // Duplicates store the same step.
        if (params.touch) StepRef(arena.row_meta(r)->step).store(step, cuda::memory_order_relaxed);
        break;
      }
    }
    rows[i] = found;
    created[i] = mine;
    local += mine;
  }
  block_add<BlockSize>(local, &counters->inserted);
}

// After find_or_insert_kernel (one thread): the free rows it took leave the list.
static __global__ void settle_free_list_kernel(DeviceCounters* counters) {
  const unsigned long long taken = min(counters->free_taken, counters->free_rows);
  counters->free_rows -= taken;
  counters->free_taken = 0;
}

// Fills the values and state of each row created by find_or_insert_kernel exactly once: a tile of
// 2^tile_shift threads per position, the tile's threads striding over the row's record.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    init_rows_kernel(row::ArenaRef arena, row::InitParams init, row::OptParams opt,
                     const int64_t* keys, const uint32_t* rows, const uint8_t* created, uint64_t n,
                     uint32_t tile_shift, uint64_t* dirty) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  const uint32_t stride = arena.stride;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    if (created[i] == 0) continue;
    const uint32_t r = rows[i];
    const int64_t key = keys[i];
    float* record = arena.row(r);
    const uint64_t seed = row::init_row_seed(init, key);
    for (uint32_t c = t; c < stride; c += tile) {
      record[c] =
          c < dim ? row::init_value_at(init, seed, c) : row::initial_state(opt, dim, c - dim);
    }
    if (t == 0) row::bitmap_set<true>(dirty, r);
  }
}

// out[i] = value of rows[i] (zeros for kNoRow). Reads leave the row's step alone: as on the
// host backend, a row's step is that of its insert or its last update.
// A position pending admission (pending non-null and nonzero) reads its key's initial values.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    gather_rows_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n, uint32_t tile_shift,
                       const uint8_t* pending, row::InitParams init, const int64_t* keys,
                       float* out) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    const uint32_t r = rows[i];
    float* dst = out + i * dim;
    if (pending != nullptr && pending[i] != 0) {
      const uint64_t seed = row::init_row_seed(init, keys[i]);
      for (uint32_t c = t; c < dim; c += tile) dst[c] = row::init_value_at(init, seed, c);
      continue;
    }
    if (r == row::kNoRow) {
      for (uint32_t c = t; c < dim; c += tile) dst[c] = 0.0f;
      continue;
    }
    const float* src = arena.row(r);
    for (uint32_t c = t; c < dim; c += tile) dst[c] = src[c];
  }
}

// Counts the distinct keys of a sorted batch that have no row (the max_capacity check).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    count_new_keys_kernel(row::IndexRef index, const int64_t* sorted_keys, uint64_t n,
                          unsigned long long* total) {
  unsigned long long local = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = sorted_keys[i];
    const bool first = i == 0 || sorted_keys[i - 1] != key;
    if (first && index.find(key) == row::kNoRow) ++local;
  }
  block_add<BlockSize>(local, total);
}

// Reinserts the live rows of [0, rows) (those not freed; freed may be null) into an empty
// index. Keys are distinct, so a claimed slot is final and nothing reads the index until the
// kernel ends.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    rebuild_index_kernel(row::IndexRef index, row::ArenaRef arena, uint64_t rows,
                         const uint64_t* freed) {
  for (uint64_t r = grid_thread<BlockSize>(); r < rows; r += grid_threads<BlockSize>()) {
    if (freed != nullptr && row::bitmap_test(freed, r)) continue;
    insert_absent_concurrent(index, arena.row_meta(r)->key, static_cast<uint32_t>(r));
  }
}

// Adds the set bits among a bitmap's first `bits` to *total (dirty rows; evicted rows below the
// device tier's budget).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    count_bits_kernel(const uint64_t* words, uint64_t bits, unsigned long long* total) {
  unsigned long long local = 0;
  const uint64_t n_words = row::bitmap_words(bits);
  for (uint64_t w = grid_thread<BlockSize>(); w < n_words; w += grid_threads<BlockSize>()) {
    local += row::bitmap_count_word_below(words, w, bits);
  }
  block_add<BlockSize>(local, total);
}

}  // namespace embstore::cuda_backend
