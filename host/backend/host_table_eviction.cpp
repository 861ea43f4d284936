// The host table's eviction: evict_before (the rows last touched before a step),
// pick_least_recent (the least recently used rows, for an insert past the row limit), and
// evict_rows, which both end in.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/index.h"
#include "host/backend/host_table.hpp"

namespace embstore::host_backend {

uint64_t HostTable::evict_before(uint64_t cutoff_step) {
  std::lock_guard lock(mutex_);
  victims_.clear();
  for_each_candidate(cutoff_step, nullptr, [&](uint32_t r, uint64_t) { victims_.push_back(r); });
  evict_rows(victims_);
  ledger_.forget_before(cutoff_step);
  return victims_.size();
}

void HostTable::remove_rows(std::vector<uint32_t>& victims, MovedRows* out) {
  if (victims.empty()) return;
  if (tiered_) {
    finish_prefetch();  // a row being read must not lose its disk slot
    reserve_release(victims.size());
  }
  const uint32_t stride = spec().stride();
  const size_t out_before = out != nullptr ? out->size() : 0;
  if (out != nullptr) {
    out->reserve_more(victims.size(), stride);
    out->records.resize((out_before + victims.size()) * size_t{stride});
    try {
      read_records(victims, out->records.data() + out_before * size_t{stride});
    } catch (...) {
      out->truncate(out_before, stride);
      throw;
    }
  }
  if (captured_left_.load() > 0) {
    cow_rows_.clear();
    cow_rows_.reserve(victims.size());
    for (const uint32_t r : victims) take_for_copy(r);
    try {
      copy_out_taken();
    } catch (...) {
      if (out != nullptr) out->truncate(out_before, stride);
      throw;
    }
  }
  // Room first: past this point nothing can fail.
  free_rows_.reserve(free_rows_.size() + victims.size());
  if (tiered_) release_homes(victims);
  if (out == nullptr) ledger_.reserve_evicted(victims.size());
  const bool in_flight = sink_ != nullptr && !snapshot_set_.empty();
  uint64_t* carried = carried_.empty() ? nullptr : carried_.data();
  for (const uint32_t r : victims) {
    const row::RowMeta meta = *arena_.row_meta(r);
    if (out != nullptr) {
      // Rows past the snapshot's set were created after its capture.
      const uint64_t* snapshot =
          in_flight && r < snapshot_set_.size() * 64 ? snapshot_set_.data() : nullptr;
      out->keys.push_back(meta.key);
      out->steps.push_back(meta.step);
      out->dirty.push_back(row::bitmap_test(dirty_.data(), r) ? 1 : 0);
      out->in_snapshot.push_back(row::in_snapshot(snapshot, carried, r) ? 1 : 0);
    }
    index_.erase_serial(meta.key);
    row::release_row<false>(dirty_.data(), freed_.data(), carried, r);
    free_rows_.push_back(r);
    if (out == nullptr) ledger_.evicted(&meta.key, 1);
  }
  rows_ -= victims.size();
}

// f(row, its last-touched step) for every row that an eviction with cutoff `before` may take
// (row::evictable; spared may be null).
template <typename F>
void HostTable::for_each_candidate(uint64_t before, const uint64_t* spared, F&& f) const {
  for (uint64_t r = 0; r < next_row_; ++r) {
    const uint64_t s = arena_.row_meta(r)->step;
    if (row::evictable(freed_.data(), spared, r, s, before)) f(static_cast<uint32_t>(r), s);
  }
}

// Making room at the row limit (insert_missing), a stack's list of candidates and a take of the
// coldest rows choose so: the `need` least recently used rows touched before `step` (ties: the
// lowest key, so that tables fed the same calls evict the same keys whatever their rows' ids),
// sparing the n `reading` rows of the call that needs the room (kNoRow entries skipped). Two
// passes over the rows' stamps and no sort of the table: a histogram of the stamps finds the
// step below which every row goes, and only the rows of the boundary step range are ordered.
uint64_t HostTable::pick_least_recent(uint64_t need, uint64_t step, const uint32_t* reading,
                                      size_t n) {
  victims_.clear();
  reading_.resize(dirty_.size(), 0);
  for (size_t i = 0; i < n; ++i) {
    if (reading[i] != row::kNoRow) row::bitmap_set<false>(reading_.data(), reading[i]);
  }
  struct Clear {  // the scratch bitmap stays all zero between calls
    std::vector<uint64_t>& bits;
    const uint32_t* rows;
    size_t n;
    ~Clear() {
      for (size_t i = 0; i < n; ++i) {
        if (rows[i] != row::kNoRow) row::bitmap_clear<false>(bits.data(), rows[i]);
      }
    }
  } clear{reading_, reading, n};
  const uint64_t* spared = reading_.data();
  uint64_t oldest = UINT64_MAX, candidates = 0;
  for_each_candidate(step, spared, [&](uint32_t, uint64_t s) {
    oldest = std::min(oldest, s);
    ++candidates;
  });
  need = std::min(need, candidates);
  if (need == 0) return candidates;
  const row::RoomBuckets buckets = row::RoomBuckets::spanning(oldest, step);
  std::vector<uint64_t> histogram(row::RoomBuckets::kCount, 0);
  for_each_candidate(step, spared, [&](uint32_t, uint64_t s) { ++histogram[buckets.of(s)]; });
  const row::RoomBoundary edge_of = row::room_boundary(buckets, histogram.data(), need);
  struct Edge {  // a candidate of the boundary bucket
    uint64_t step;
    int64_t key;
    uint32_t row;
    bool operator<(const Edge& o) const { return row::evicted_first(step, key, o.step, o.key); }
  };
  std::vector<Edge> edge;
  edge.reserve(edge_of.in_bucket);
  for_each_candidate(step, spared, [&](uint32_t r, uint64_t s) {
    if (edge_of.goes(s)) {
      victims_.push_back(r);
    } else if (edge_of.in_boundary(s)) {
      edge.push_back({s, arena_.row_meta(r)->key, r});
    }
  });
  const size_t rest = need - victims_.size();
  std::nth_element(edge.begin(), edge.begin() + rest, edge.end());
  for (size_t i = 0; i < rest; ++i) victims_.push_back(edge[i].row);
  return candidates;
}

}  // namespace embstore::host_backend
