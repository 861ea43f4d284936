// The host table's fused update (apply_gradients): the batch grouped by row, the rows about to
// change copied out to a snapshot in progress, then each row's gradients summed by the blocked
// rule and applied by the optimizer on the pool's threads.
#include <mutex>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/grad_sum.h"
#include "cuda/row/optimizer.h"
#include "host/backend/host_table.hpp"

namespace embstore::host_backend {
namespace {

constexpr uint32_t kEnd = 0xFFFFFFFFu;

}  // namespace

void HostTable::apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                                void*) {
  std::lock_guard lock(mutex_);
  rows_scratch_.resize(n);
  uint32_t* rows = rows_scratch_.data();
  find_rows(keys, n, rows);
  const SettleAtExit settle_at_exit{this};
  if (tiered_) {  // before anything changes: a failed move fails the call with nothing done
    begin_tier_call();
    bring_up(rows, n);
  }
  group_by_row(rows, n, dirty_tracking_);
  if (captured_left_.load() > 0) {
    cow_rows_.clear();
    cow_rows_.reserve(groups_.size());
    for (const Group& g : groups_) take_for_copy(g.row);
    copy_out_taken();
  }
  row::dispatch_opt(spec().opt.kind,
                    [&](auto kind) { update_groups<decltype(kind)::value>(grads, step); });
}

// Positions of each row in batch order: groups_[g] = {row, first, last, count}, next_[i] = the
// next position of the same row. Keys without a row are counted and left out. With `mark`, each
// row's dirty bit is set here, in the serial pass that meets every updated row, rather than by
// the parallel update workers: a plain OR instead of atomics and cache lines passed between
// cores. The update follows in the same call under the table lock, so nothing can observe the bit
// before the row is written.
void HostTable::group_by_row(const uint32_t* rows, size_t n, bool mark) {
  uint64_t* dirty = dirty_.data();
  uint64_t slots = 16;
  while (slots < 2 * n) slots *= 2;
  const int shift = 64 - row::msb64(slots);
  group_map_.assign(slots, 0);
  groups_.clear();
  next_.resize(n);
  uint64_t skipped = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = rows[i];
    if (r == row::kNoRow) {
      ++skipped;
      continue;
    }
    next_[i] = kEnd;
    uint64_t s = (uint64_t{r} * 0x9E3779B97F4A7C15ull) >> shift;  // Fibonacci hashing
    while (group_map_[s] != 0 && groups_[group_map_[s] - 1].row != r) s = (s + 1) & (slots - 1);
    if (group_map_[s] == 0) {
      groups_.push_back({r, static_cast<uint32_t>(i), static_cast<uint32_t>(i), 1});
      group_map_[s] = static_cast<uint32_t>(groups_.size());
      if (mark) row::bitmap_set<false>(dirty, r);
    } else {
      Group& g = groups_[group_map_[s] - 1];
      next_[g.last] = static_cast<uint32_t>(i);
      g.last = static_cast<uint32_t>(i);
      ++g.count;
    }
  }
  skipped_ += skipped;
}

// Each row's gradients summed by the blocked rule (cuda/row/grad_sum.h), then one fused update.
// A row of up to 32 occurrences is summed in batch order; a longer one through its tree's
// partial sums, on the same thread, so the result never depends on the thread count.
template <row::OptKind Kind>
void HostTable::update_groups(const float* grads, uint64_t step) {
  const uint32_t dim = spec().dim;
  const uint32_t stride = spec().stride();
  const row::OptParams opt = spec().opt;
  const row::ArenaRef arena = arena_;
  const uint32_t* frames = nullptr;  // by group, on a tiered table
  if (tiered_) {
    group_frames_.resize(groups_.size());
    for (size_t g = 0; g < groups_.size(); ++g) group_frames_[g] = home(groups_[g].row);
    frames = group_frames_.data();
  }
  pool_.parallel_for(groups_.size(), kGrain / 4, [&](size_t begin, size_t end) {
    std::vector<float> sum(dim);
    std::vector<float> partials;
    for (size_t gi = begin; gi < end; ++gi) {
      if (gi + kAhead < end) {
        prefetch_row(arena.row(frames ? frames[gi + kAhead] : groups_[gi + kAhead].row), stride);
      }
      const Group& g = groups_[gi];
      const float* grad = grads + size_t{g.first} * dim;
      if (g.count > 1) {
        const row::SumTree tree = row::SumTree::of(g.count);
        partials.resize(size_t{tree.partials()} * dim);
        uint32_t leaf = g.first;
        row::tree_sum(
            tree, dim,
            [&] {
              const float* at = grads + size_t{leaf} * dim;
              leaf = next_[leaf];
              return at;
            },
            partials.data(), sum.data());
        grad = sum.data();
      }
      float* value = arena.row(frames ? frames[gi] : g.row);
      row::apply_row<Kind>(opt, dim, value, value + dim, grad);
      arena.row_meta(g.row)->step = step;
    }
  });
}

}  // namespace embstore::host_backend
