// Kernels of the device tier's moves (cuda_device_tier.cu): the rows a prefetch wants, the idle
// device rows that may make room for them, and the trades (cuda/row/device_tier.h).
#pragma once

#include "cuda/backend/device.cuh"
#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/device_tier.h"
#include "cuda/row/index.h"

namespace embstore::cuda_backend {

// A device row that may move down (row::may_move_down), among the row ids handed out.
struct MayMoveDown {
  row::ArenaRef arena;
  const uint32_t* wanted;
  uint32_t generation;
  const uint64_t* snapshot;
  const uint64_t* freed;
  const DeviceCounters* counters;
  uint64_t cutoff_step;
  __device__ bool operator()(uint32_t r) const {
    if (r >= counters->rows) return false;  // no row yet: its metadata is not one
    return row::may_move_down(r, arena.row_meta(r)->step, cutoff_step, wanted, generation, snapshot,
                              freed);
  }
};

// Marks every row of rows[0, n) wanted by this prefetch (generation), and lists those in host
// memory (ids >= budget), each once, outside the snapshot in flight, in up[0, *up_count).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    want_rows_kernel(const uint32_t* rows, uint64_t n, uint64_t budget, uint32_t* wanted,
                     uint32_t generation, const uint64_t* snapshot, uint32_t* up,
                     unsigned long long* up_count) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const uint32_t r = rows[i];
    if (r == row::kNoRow) continue;
    const uint32_t before = atomicExch(&wanted[r], generation);
    if (r < budget || before == generation) continue;  // on the device, or a duplicate
    if (snapshot != nullptr && row::bitmap_test(snapshot, r)) continue;
    up[atomicAdd(up_count, 1ull)] = r;
  }
}

// Trades down[i] with up[i] for i below the smaller count (at most max_pairs): a tile of
// 2^tile_shift lanes per pair swaps the records, its first lane the identities and marks the
// row's new id wanted (the next prefetch keeps it: its batch is about to use it). Adds the
// pairs to *moved.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    trade_rows_kernel(row::ArenaRef arena, row::IndexRef index, uint64_t* dirty, uint64_t* carried,
                      uint32_t* wanted, uint32_t generation, const uint32_t* down,
                      const unsigned long long* down_count, const uint32_t* up,
                      const unsigned long long* up_count, uint64_t max_pairs, uint32_t tile_shift,
                      unsigned long long* moved) {
  const uint64_t pairs =
      min(min(*down_count, *up_count), static_cast<unsigned long long>(max_pairs));
  const uint32_t lanes = 1u << tile_shift;
  for (uint64_t t = grid_thread<BlockSize>(); t < (pairs << tile_shift);
       t += grid_threads<BlockSize>()) {
    const uint64_t i = t >> tile_shift;
    const uint32_t lane = static_cast<uint32_t>(t & (lanes - 1));
    row::swap_records(arena, down[i], up[i], lane, lanes);
    if (lane == 0) {
      row::swap_identities<true>(arena, index, dirty, carried, down[i], up[i]);
      wanted[down[i]] = generation;
    }
  }
  if (grid_thread<BlockSize>() == 0 && pairs != 0) atomicAdd(moved, pairs);
}

}  // namespace embstore::cuda_backend
