// Kernels of whole rows leaving and entering a CUDA table (cuda_moves.cu; a stack's moves,
// host/table/stacked_table.hpp).
#pragma once

#include "cuda/backend/device.cuh"
#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/index.h"

namespace embstore::cuda_backend {

// The rows rows[0, n) as they leave: key, stamp, dirty bit, whether the snapshot in flight holds
// them (row::in_snapshot) and record (stride floats), a tile of lanes per row. Reads only: their
// bits go once they are freed (free_rows_kernel), after the copy-on-write that can still fail.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    gather_leaving_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n,
                          const uint64_t* dirty, const uint64_t* snapshot, const uint64_t* carried,
                          int64_t* keys, uint64_t* steps, uint8_t* dirty_out,
                          uint8_t* in_snapshot_out, float* records, uint32_t tile_shift) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t lane = threadIdx.x & (tile - 1);
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    const uint32_t r = rows[i];
    if (lane == 0) {
      const row::RowMeta meta = *arena.row_meta(r);
      keys[i] = meta.key;
      steps[i] = meta.step;
      dirty_out[i] = row::bitmap_test(dirty, r) ? 1 : 0;
      in_snapshot_out[i] = row::in_snapshot(snapshot, carried, r) ? 1 : 0;
    }
    const float* from = arena.row(r);
    for (uint32_t c = lane; c < arena.stride; c += tile) records[i * arena.stride + c] = from[c];
  }
}

// Rows put in whole, rows [first, first + n) of a put (the arrays hold those n): the i-th of the
// put takes row::put_row_id's id, which gets the key, stamp, record (a tile of lanes per row),
// dirty bit and carried bit (a row the snapshot in flight held where it was: carried while one
// is in flight here, else dirty at once), and leaves the free list (its freed bit cleared). The
// keys are distinct and absent (checked before).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    put_rows_kernel(row::IndexRef index, row::ArenaRef arena, const int64_t* keys,
                    const uint64_t* steps, const uint8_t* dirty_in, const uint8_t* in_snapshot,
                    const float* records, uint64_t first, uint64_t n, const uint32_t* free_list,
                    uint64_t free_rows, uint64_t first_fresh, uint64_t* dirty, uint64_t* freed,
                    uint64_t* carried, bool in_flight, uint32_t tile_shift) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t lane = threadIdx.x & (tile - 1);
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    const uint32_t r = row::put_row_id(first + i, free_list, free_rows, first_fresh);
    float* to = arena.row(r);
    for (uint32_t c = lane; c < arena.stride; c += tile) to[c] = records[i * arena.stride + c];
    if (lane != 0) continue;
    const int64_t key = keys[i];
    *arena.row_meta(r) = row::RowMeta{key, steps[i]};
    if (freed != nullptr) row::bitmap_clear<true>(freed, r);
    // carried is allocated wherever rows are put (spec().gives_rows).
    const row::PutBits bits = row::put_row_bits(dirty_in[i] != 0, in_snapshot[i] != 0, in_flight);
    if (bits.dirty) {
      row::bitmap_set<true>(dirty, r);
    } else {
      row::bitmap_clear<true>(dirty, r);
    }
    if (bits.carried) {
      row::bitmap_set<true>(carried, r);
    } else {
      row::bitmap_clear<true>(carried, r);
    }
    insert_absent_concurrent(index, key, r);
  }
}

// After put_rows_kernel: the free rows it took and the fresh ids it handed out (one thread).
static __global__ void settle_put_kernel(DeviceCounters* counters, unsigned long long n) {
  const unsigned long long reused = n < counters->free_rows ? n : counters->free_rows;
  counters->free_rows -= reused;
  counters->rows += n - reused;
}

}  // namespace embstore::cuda_backend
