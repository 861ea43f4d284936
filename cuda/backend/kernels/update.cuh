// The fused optimizer kernel: a row's duplicate gradients summed by the blocked rule
// (cuda/row/grad_sum.h), then one fused update per row (cuda/row/optimizer.h).
//
// Work is split so that no row's occurrences are summed by one warp alone when there are more
// than 32 of them (a hot id of a skewed batch occurs thousands of times): every level-1 node of
// a row's summation tree (up to 32 occurrences) gets a warp. A warp per run takes the run's
// first node (for a run of up to 32 occurrences, the whole row: summed and updated at once); a
// warp per 32-position tile of the sorted batch takes the node that starts in the tile, if any
// (nodes of a run start 32 positions apart, so a tile holds at most one besides runs' first
// ones). A node below the root writes its sum to scratch and counts itself in its parent's
// arrivals; the warp that arrives last sums the parent's children, in order, and climbs on; the
// root's warp updates the row. Which warp sums a node varies, the additions do not, so the bits
// are those of the host backend's tree_sum.
#pragma once

#include "cuda/backend/device.cuh"
#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/grad_sum.h"
#include "cuda/row/optimizer.h"

namespace embstore::cuda_backend {

// A gradient batch grouped by row, as the update kernel reads it, and the scratch of its trees.
struct SortedBatch {
  const float* grads;           // the caller's gradients, n x dim, batch order
  const uint32_t* rows;         // row id per sorted position (no_row: the key has no row)
  const uint32_t* positions;    // batch position per sorted position, batch order within a row
  const uint32_t* run_offsets;  // the first sorted position of each run (one per distinct row)
  const uint32_t* num_runs;     // on the device
  uint32_t n;
  uint32_t no_row;
  float* partials;     // row::sum_scratch_slots(n) x dim floats
  uint32_t* arrivals;  // row::sum_scratch_slots(n), zero before the kernel
};

// The positions of the batch where a row's occurrences start (a run of the sorted rows).
struct RunHead {
  const uint32_t* rows;
  __device__ bool operator()(uint32_t i) const { return i == 0 || rows[i] != rows[i - 1]; }
};

namespace detail {

// Index of the last a[i] <= x in strictly increasing a[0 .. n), given a[0] <= x. The warp probes
// 32 points a round, so log32(n) rounds of one load each. Called by every lane.
__device__ __forceinline__ uint32_t warp_last_not_above(const uint32_t* a, uint32_t n, uint32_t x,
                                                        uint32_t lane) {
  uint32_t lo = 0, hi = n;  // the answer is in [lo, hi)
  while (hi - lo > 1) {
    const uint32_t step = (hi - lo + row::kLanes - 1) / row::kLanes;
    const uint32_t probe = lo + lane * step;
    const bool at_or_below = probe < hi && a[probe] <= x;
    const uint32_t ballot = __ballot_sync(kFullMask, at_or_below);  // lane 0 always set
    lo += (31 - __clz(ballot)) * step;
    hi = min(hi, lo + step);
  }
  return lo;
}

// The level-1 node, other than a run's first, that starts in tile t (sorted positions
// [32t, 32t + 32)), if there is one: its run and its index. Called by every lane.
__device__ __forceinline__ bool node_in_tile(const SortedBatch& b, uint32_t runs, uint64_t t,
                                             uint32_t lane, uint32_t* run, uint32_t* node) {
  const uint32_t x = static_cast<uint32_t>(t) * row::kSumFanIn;
  if (x == 0) return false;
  const uint32_t r = b.rows[x];
  if (r == b.no_row) return false;       // keys without a row (sorted last): nothing to sum
  if (b.rows[x - 1] != r) return false;  // a run starts at x: its first node is its run's warp's
  // The run of x began before x. If it began within the 32 positions before x, its second node
  // starts in this tile, when the run has one: settled without searching the runs.
  const bool in_run = b.rows[x - row::kSumFanIn + lane] == r;
  const uint32_t ballot = __ballot_sync(kFullMask, in_run);
  if ((ballot & 1u) == 0) {
    const uint32_t first = x - row::kSumFanIn + (__ffs(static_cast<int>(ballot)) - 1);
    const uint32_t second = first + row::kSumFanIn;
    if (second >= b.n || b.rows[second] != r) return false;
  }
  const uint32_t j = warp_last_not_above(b.run_offsets, runs, x, lane);
  const uint32_t end = j + 1 < runs ? b.run_offsets[j + 1] : b.n;
  const uint32_t later = row::later_node_in_tile(b.run_offsets[j], end, x);
  if (later == row::kNoNode) return false;
  *run = j;
  *node = later;
  return true;
}

// Writes a node's sum, column c being sum(c), to dst (lane l: columns l, l + 32, ...).
template <typename SumAt>
__device__ __forceinline__ void store_node(float* dst, uint32_t dim, uint32_t lane, SumAt sum) {
  for (uint32_t c = lane; c < dim; c += row::kLanes) dst[c] = sum(c);
}

// Counts a finished child in its parent's arrivals; true for the warp whose child completed the
// parent, which then reads the other children's sums. Called by every lane, after its stores.
// The fences are those of the CUDA guide's last-block pattern, on both sides of the warp
// barriers: every lane's sums are visible to the device before lane 0 counts them, and the
// last warp reads (with __ldcg, past L1) only after the count that told it so.
__device__ __forceinline__ bool last_to_arrive(uint32_t* arrivals, uint32_t children,
                                               uint32_t lane) {
  __threadfence();
  __syncwarp();
  uint32_t before = 0;
  if (lane == 0) {
    __threadfence();
    before = atomicAdd(arrivals, 1u);
  }
  before = __shfl_sync(kFullMask, before, 0);
  if (before + 1 != children) return false;
  __syncwarp();
  __threadfence();
  return true;
}

// One fused update of row r, whose summed gradient in column c is grad(c). Lane l owns columns
// l, l + 32, ...; the steps follow row::apply_row, so the host gets the same bits.
template <row::OptKind Kind, bool Dirty, typename GradAt>
__device__ __forceinline__ void update_row(const row::ArenaRef& arena, uint64_t* dirty,
                                           const row::OptParams& p, uint32_t r, uint64_t step,
                                           uint32_t lane, GradAt grad) {
  const uint32_t dim = arena.dim;
  float* value = arena.row(r);
  float* state = value + dim;
  float sum_sq = 0.0f;
  if constexpr (Kind == row::OptKind::kRowwiseAdagrad) {
    float s = row::lane_sum_sq_at(p, dim, lane, grad, value);
    // Same additions as row::butterfly_sum; every lane ends with the same value.
    for (uint32_t m = row::kLanes / 2; m > 0; m /= 2) s = s + __shfl_xor_sync(kFullMask, s, m);
    sum_sq = s;
  }
  const row::RowScalars rs = row::begin_row(p, dim, state, sum_sq);
  // Columns never touch the row-level state that begin_row read; lane 0 rewrites that only in
  // end_row, after the barrier below.
  for (uint32_t c = lane; c < dim; c += row::kLanes) {
    row::update_column_k<Kind>(p, rs, dim, c, row::effective_grad(p, grad(c), value[c]), value,
                               state);
  }
  __syncwarp();
  if (lane == 0) {
    row::end_row(p, rs, dim, state);
    if constexpr (Dirty) row::bitmap_set<true>(dirty, r);
    arena.row_meta(r)->step = step;
  }
}

}  // namespace detail

// One warp per work item: items [0, runs) are the runs' first nodes, the rest the tiles of the
// sorted batch (see the top of this file). Grid-stride.
template <row::OptKind Kind, bool Dirty, int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    fused_update_kernel(row::ArenaRef arena, uint64_t* dirty, row::OptParams p, SortedBatch b,
                        uint64_t step) {
  static_assert(BlockSize % row::kLanes == 0);
  const uint32_t lane = threadIdx.x % row::kLanes;
  const uint32_t dim = arena.dim;
  const uint32_t runs = *b.num_runs;
  const uint64_t items = uint64_t{runs} + (b.n + row::kSumFanIn - 1) / row::kSumFanIn;
  for (uint64_t w = grid_thread<BlockSize>() / row::kLanes; w < items;
       w += grid_threads<BlockSize>() / row::kLanes) {
    // Everything below is warp-uniform: the same run, node and arrivals in every lane.
    uint32_t run = static_cast<uint32_t>(w), node = 0;
    if (w >= runs && !detail::node_in_tile(b, runs, w - runs, lane, &run, &node)) continue;
    const uint32_t first = b.run_offsets[run];
    const uint32_t end = run + 1 < runs ? b.run_offsets[run + 1] : b.n;
    const uint32_t r = b.rows[first];
    if (r == b.no_row) continue;  // the keys without a row: one run, sorted last
    const row::SumTree tree = row::SumTree::of(end - first);

    const uint32_t* leaves = b.positions + first + node * row::kSumFanIn;
    const uint32_t count = tree.children(1, node);
    auto leaf_sum = [&](uint32_t c) {
      return row::sum_children(count,
                               [&](uint32_t m) { return b.grads[uint64_t{leaves[m]} * dim + c]; });
    };
    if (tree.height == 1) {
      detail::update_row<Kind, Dirty>(arena, dirty, p, r, step, lane, leaf_sum);
      continue;
    }
    const uint32_t base = row::sum_scratch_base(first);
    float* partials = b.partials + uint64_t{base} * dim;
    uint32_t* arrivals = b.arrivals + base;
    detail::store_node(partials + uint64_t{tree.partial_index(1, node)} * dim, dim, lane, leaf_sum);
    uint32_t level = 1, i = node;
    for (;;) {
      const uint32_t parent = i / row::kSumFanIn;
      if (!detail::last_to_arrive(arrivals + tree.arrival_index(level + 1, parent),
                                  tree.children(level + 1, parent), lane)) {
        break;
      }
      ++level;
      i = parent;
      const float* below =
          partials + uint64_t{tree.partial_index(level - 1, i * row::kSumFanIn)} * dim;
      const uint32_t children = tree.children(level, i);
      auto node_sum = [&](uint32_t c) {
        return row::sum_children(children,
                                 [&](uint32_t m) { return __ldcg(below + uint64_t{m} * dim + c); });
      };
      if (level == tree.height) {
        detail::update_row<Kind, Dirty>(arena, dirty, p, r, step, lane, node_sum);
        break;
      }
      detail::store_node(partials + uint64_t{tree.partial_index(level, i)} * dim, dim, lane,
                         node_sum);
    }
  }
}

// The unique rows of a sorted batch (one per run), for copy-on-write.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    run_rows_kernel(const uint32_t* rows, const uint32_t* run_offsets, const uint32_t* num_runs,
                    uint32_t* out) {
  const uint64_t runs = *num_runs;
  for (uint64_t j = grid_thread<BlockSize>(); j < runs; j += grid_threads<BlockSize>()) {
    out[j] = rows[run_offsets[j]];
  }
}

}  // namespace embstore::cuda_backend
