// The fused optimizer kernel: one warp per unique row of a gradient batch.
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

// One warp per unique row of a gradient batch (runs of the row-sorted positions). Lane l owns
// columns l, l+32, ...; the per-row steps follow row::apply_row so the host gets the same bits.
template <row::OptKind Kind, bool Dirty, int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    fused_update_kernel(row::ArenaRef arena, uint64_t* dirty, row::OptParams p, const float* grads,
                        const uint32_t* run_rows, const uint32_t* run_lengths,
                        const uint32_t* run_offsets, const uint32_t* positions,
                        const uint32_t* num_runs, uint32_t no_row, uint64_t step) {
  static_assert(BlockSize % row::kLanes == 0);
  const uint32_t lane = threadIdx.x % row::kLanes;
  const uint32_t dim = arena.dim;
  const uint64_t runs = *num_runs;
  for (uint64_t w = grid_thread<BlockSize>() / row::kLanes; w < runs;
       w += grid_threads<BlockSize>() / row::kLanes) {
    const uint32_t r = run_rows[w];
    if (r == no_row) continue;  // the keys without a row; warp-uniform
    const uint32_t* pos = positions + run_offsets[w];
    const uint32_t len = run_lengths[w];
    float* value = arena.row(r);
    float* state = value + dim;
    // Summed gradient of column c: batch order, starting from the first occurrence.
    auto grad_sum = [&](uint32_t c) {
      float g = grads[uint64_t{pos[0]} * dim + c];
      for (uint32_t k = 1; k < len; ++k) g = g + grads[uint64_t{pos[k]} * dim + c];
      return g;
    };
    float sum_sq = 0.0f;
    if constexpr (Kind == row::OptKind::kRowwiseAdagrad) {
      float s = row::lane_sum_sq_at(p, dim, lane, grad_sum, value);
      // Same additions as row::butterfly_sum; every lane ends with the same value.
      for (uint32_t m = row::kLanes / 2; m > 0; m /= 2) s = s + __shfl_xor_sync(kFullMask, s, m);
      sum_sq = s;
    }
    const row::RowScalars rs = row::begin_row(p, dim, state, sum_sq);
    // Columns never touch the row-level state that begin_row read; lane 0 rewrites that only
    // in end_row, after the barrier below.
    for (uint32_t c = lane; c < dim; c += row::kLanes) {
      row::update_column_k<Kind>(p, rs, dim, c, row::effective_grad(p, grad_sum(c), value[c]),
                                 value, state);
    }
    __syncwarp();
    if (lane == 0) {
      row::end_row(p, rs, dim, state);
      if constexpr (Dirty) row::bitmap_set<true>(dirty, r);
      arena.row_meta(r)->step = step;
    }
  }
}

}  // namespace embstore::cuda_backend
