// Kernels of eviction and the free list, and the selection of keys pending admission.
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

// Selection predicates (cub::DeviceSelect::If over row ids or batch positions).
// A row that an eviction with cutoff `before` may take (row::evictable).
struct EvictionCandidate {
  row::ArenaRef arena;
  const uint64_t* freed;
  const uint64_t* spared;
  uint64_t before;
  __device__ bool operator()(uint32_t r) const {
    return row::evictable(freed, spared, r, arena.row_meta(r)->step, before);
  }
};

// A candidate row (make_room) below the boundary bucket: it goes (row::RoomBoundary::goes).
struct GoesForRoom {
  row::ArenaRef arena;
  row::RoomBoundary edge;
  __device__ bool operator()(uint32_t r) const { return edge.goes(arena.row_meta(r)->step); }
};

// A candidate row (make_room) of the boundary bucket (row::RoomBoundary::in_boundary).
struct InRoomBoundary {
  row::ArenaRef arena;
  row::RoomBoundary edge;
  __device__ bool operator()(uint32_t r) const { return edge.in_boundary(arena.row_meta(r)->step); }
};

// A batch position whose key has no row.
struct MissingAt {
  const uint32_t* rows;
  __device__ bool operator()(uint32_t i) const { return rows[i] == row::kNoRow; }
};

// Sets the bit of every row of rows[0, n) (kNoRow skipped).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    mark_rows_kernel(const uint32_t* rows, uint64_t n, uint64_t* bits) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    if (rows[i] != row::kNoRow) row::bitmap_set<true>(bits, rows[i]);
  }
}

// mask[positions[i]] = 1.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    mark_positions_kernel(const uint32_t* positions, uint64_t n, uint8_t* mask) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    mask[positions[i]] = 1;
  }
}

template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    gather_steps_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n, uint64_t* steps) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    steps[i] = arena.row_meta(rows[i])->step;
  }
}

// histogram[b] += the stamps of stamps[0, n) in bucket b (row::RoomBuckets), counted per block
// in shared memory first: stamps cluster in few buckets, where global atomics would queue.
// histogram: RoomBuckets::kCount counters, zeroed before.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    stamp_histogram_kernel(const uint64_t* stamps, uint64_t n, row::RoomBuckets buckets,
                           unsigned long long* histogram) {
  __shared__ unsigned int counts[row::RoomBuckets::kCount];
  for (uint32_t b = threadIdx.x; b < row::RoomBuckets::kCount; b += BlockSize) counts[b] = 0;
  __syncthreads();
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    atomicAdd(&counts[buckets.of(stamps[i])], 1u);
  }
  __syncthreads();
  for (uint32_t b = threadIdx.x; b < row::RoomBuckets::kCount; b += BlockSize) {
    if (counts[b] != 0) atomicAdd(&histogram[b], static_cast<unsigned long long>(counts[b]));
  }
}

template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    gather_row_keys_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n, int64_t* keys) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    keys[i] = arena.row_meta(rows[i])->key;
  }
}

template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    gather_keys_kernel(const int64_t* keys, const uint32_t* positions, uint64_t n, int64_t* out) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    out[i] = keys[positions[i]];
  }
}

// Frees victims[0, n) (distinct live rows, already written to a snapshot in progress): their
// keys go to keys_out, their dirty and carried bits (carried: may be NULL) are cleared, their
// freed bits set, and they join the free list at free_list[free_base + i]. The index is rebuilt
// afterwards.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    free_rows_kernel(row::ArenaRef arena, const uint32_t* victims, uint64_t n, uint64_t* dirty,
                     uint64_t* freed, uint64_t* carried, uint32_t* free_list, uint64_t free_base,
                     int64_t* keys_out) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const uint32_t r = victims[i];
    keys_out[i] = arena.row_meta(r)->key;
    row::release_row<true>(dirty, freed, carried, r);
    free_list[free_base + i] = r;
  }
}

static __global__ void add_free_rows_kernel(DeviceCounters* counters, unsigned long long n) {
  counters->free_rows += n;
}

}  // namespace embstore::cuda_backend
