// How a row's duplicate gradients in one batch are summed: the blocked rule both backends run.
//
// The occurrences of a row in a batch (its "leaves", in batch order; on a sharded store the
// owner's batch, the ranks' occurrences in rank order) are the leaves of a tree of fan-in 32:
//   level 0: the leaves;
//   level k >= 1: node i sums nodes 32i, 32i + 1, ..., 32i + 31 of level k - 1 (those that
//     exist), left to right: ((c0 + c1) + c2) + ... (a node of one child is that child);
//   the tree has the least height H >= 1 whose level H has one node: the row's summed gradient.
// So up to 32 occurrences are summed one after the other in batch order (as every batch was up to
// 0.4.0), 33 to 1024 as 32-leaf blocks summed in order and then those block sums in order, and so
// on. Every float is rounded as written, column by column, so the result depends only on the
// gradients and their order: not on the backend, the thread count, the GPU, the other keys of
// the batch or the row ids.
//
// The host backend evaluates the tree level by level on one thread (tree_sum); the CUDA backend
// gives each level-1 node of a long run its own warp and combines the nodes above as their
// children arrive (cuda/backend/kernels/update.cuh). Both index nodes and scratch through
// SumTree below.
#pragma once

#include "cuda/row/hd.h"

namespace embstore::row {

inline constexpr uint32_t kSumFanIn = 32;
inline constexpr uint32_t kSumFanInShift = 5;
// Leaves fit in 32 bits (a batch holds at most 2^32 - 1 keys), so at most 7 levels: 32^7 = 2^35.
inline constexpr uint32_t kMaxSumHeight = 7;

// The height of a row's tree: 1 for up to 32 leaves, 2 for up to 1024, ...
EMBSTORE_HD uint32_t sum_tree_height(uint64_t leaves) {
  uint32_t height = 1;
  while (leaves > kSumFanIn) {
    leaves = (leaves + kSumFanIn - 1) >> kSumFanInShift;
    ++height;
  }
  return height;
}

// The tree of one row: node counts per level, the children of a node, and where a node's partial
// sum (levels 1 .. H-1) and arrival count (levels 2 .. H, CUDA) live in the call's scratch.
struct SumTree {
  uint32_t leaves;
  uint32_t height;

  EMBSTORE_HD static SumTree of(uint32_t leaves) {
    return SumTree{leaves, sum_tree_height(leaves)};
  }

  // Nodes of level k: ceil(leaves / 32^k); level 0 is the leaves, level height has one node.
  EMBSTORE_HD uint32_t nodes(uint32_t level) const {
    const uint64_t span = uint64_t{1} << (kSumFanInShift * level);
    return static_cast<uint32_t>((uint64_t{leaves} + span - 1) / span);
  }
  // Children of node i of level k (k >= 1): nodes 32i .. 32i + count - 1 of level k - 1.
  EMBSTORE_HD uint32_t children(uint32_t level, uint32_t i) const {
    const uint32_t below = nodes(level - 1);
    const uint32_t first = i * kSumFanIn;
    return below - first < kSumFanIn ? below - first : kSumFanIn;
  }
  // Partial sums below the root: levels 1 .. height-1, level by level.
  EMBSTORE_HD uint32_t partials() const {
    uint32_t n = 0;
    for (uint32_t k = 1; k < height; ++k) n += nodes(k);
    return n;
  }
  EMBSTORE_HD uint32_t partial_index(uint32_t level, uint32_t i) const {
    uint32_t at = i;
    for (uint32_t k = 1; k < level; ++k) at += nodes(k);
    return at;
  }
  // Arrival counts: levels 2 .. height (the nodes whose children are partials).
  EMBSTORE_HD uint32_t arrivals() const {
    uint32_t n = 0;
    for (uint32_t k = 2; k <= height; ++k) n += nodes(k);
    return n;
  }
  EMBSTORE_HD uint32_t arrival_index(uint32_t level, uint32_t i) const {
    uint32_t at = i;
    for (uint32_t k = 2; k < level; ++k) at += nodes(k);
    return at;
  }
};

// Where a run's scratch starts, for the run of leaves at positions [first, first + leaves) of a
// batch sorted by row (CUDA): the multiples of 16 in that range, so runs never share scratch and
// a batch of n keys needs ceil(n / 16) + 1 slots, whatever its runs. A run with a partial has
// more than 32 leaves, so it holds at least floor(leaves / 16) multiples of 16, and needs fewer:
// ceil(L/32) <= floor(L/16) for L in 33..1024; above, about L/31 + height <= L/16 - 1. Its
// arrivals number no more than its partials. (tests/row/grad_sum_test.cpp checks both.)
inline constexpr uint32_t kSumSlotSpacing = 16;
EMBSTORE_HD uint32_t sum_scratch_base(uint32_t first) {
  return (first + kSumSlotSpacing - 1) / kSumSlotSpacing;
}
EMBSTORE_HD uint64_t sum_scratch_slots(uint64_t n) {
  return (n + kSumSlotSpacing - 1) / kSumSlotSpacing + 1;
}

// The CUDA kernel's work items (kernels/update.cuh): a warp per run takes the run's first level-1
// node, and a warp per tile of 32 sorted positions [x, x + 32) takes the node of the run at
// [first, end) that starts in the tile after the run's first; nodes of a run start 32 apart, so
// a tile holds at most one. Returns that node's index, or kNoNode.
inline constexpr uint32_t kNoNode = 0xFFFFFFFFu;
EMBSTORE_HD uint32_t later_node_in_tile(uint32_t first, uint32_t end, uint32_t x) {
  if (x <= first) return kNoNode;
  const uint32_t start = first + (x - first + kSumFanIn - 1) / kSumFanIn * kSumFanIn;
  return start < end ? (start - first) / kSumFanIn : kNoNode;
}

// The sum of one node in one column, its children read by child(m): the order every evaluation
// uses. The host's loops go column-innermost over whole rows; each column sees these additions.
template <typename ChildAt>
EMBSTORE_HD float sum_children(uint32_t count, ChildAt child) {
  float g = child(0);
  for (uint32_t m = 1; m < count; ++m) g = g + child(m);
  return g;
}

// The host's evaluation: every node of the tree in level order, on one thread. next_leaf()
// returns the leaves' gradient rows (dim floats) in batch order; partials holds tree.partials()
// rows; the root goes to out. A tree of height 1 uses no partials.
template <typename NextLeaf>
inline void tree_sum(const SumTree& tree, uint32_t dim, NextLeaf next_leaf, float* partials,
                     float* out) {
  auto add_rows = [dim](float* dst, uint32_t count, auto child) {
    const float* first = child(0);
    for (uint32_t c = 0; c < dim; ++c) dst[c] = first[c];
    for (uint32_t m = 1; m < count; ++m) {
      const float* src = child(m);
      for (uint32_t c = 0; c < dim; ++c) dst[c] = dst[c] + src[c];
    }
  };
  for (uint32_t level = 1; level <= tree.height; ++level) {
    const uint32_t nodes = tree.nodes(level);
    for (uint32_t i = 0; i < nodes; ++i) {
      float* dst =
          level == tree.height ? out : partials + uint64_t{tree.partial_index(level, i)} * dim;
      const uint32_t count = tree.children(level, i);
      if (level == 1) {
        add_rows(dst, count, [&](uint32_t) { return next_leaf(); });
      } else {
        const uint32_t below = tree.partial_index(level - 1, i * kSumFanIn);
        add_rows(dst, count, [&](uint32_t m) { return partials + uint64_t{below + m} * dim; });
      }
    }
  }
}

}  // namespace embstore::row
