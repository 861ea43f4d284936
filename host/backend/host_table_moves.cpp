// The host table's side of a stack of tables (host/table/stacked_table.hpp): whole rows taken
// out, with their stamps and dirty bits, and put in as they were. Neither is an insert nor an
// eviction: no counts change and no tombstones are left. And a stack's eviction at its row
// limit: the candidates listed (list_coldest), then the chosen ones evicted (evict_keys).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/index.h"
#include "host/backend/host_table.hpp"
#include "host/error.hpp"

namespace embstore::host_backend {

uint64_t HostTable::live_rows() {
  std::lock_guard lock(mutex_);
  return rows_;
}

void HostTable::find_held(const int64_t* keys, size_t n, uint8_t* held) {
  std::lock_guard lock(mutex_);
  for (size_t i = 0; i < n; ++i) {
    if (i + kAhead < n) __builtin_prefetch(&index_.slots[index_.home(keys[i + kAhead])]);
    held[i] = index_.find(keys[i]) != row::kNoRow ? 1 : 0;
  }
}

void HostTable::rows_of(const int64_t* keys, size_t n) {
  victims_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (const uint32_t r = index_.find(keys[i]); r != row::kNoRow) victims_.push_back(r);
  }
}

void HostTable::take_rows(const int64_t* keys, size_t n, MovedRows* out) {
  std::lock_guard lock(mutex_);
  rows_of(keys, n);
  const SettleAtExit settle_at_exit{this};
  remove_rows(victims_, out);
}

void HostTable::take_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                             size_t n_spare, MovedRows* out) {
  std::lock_guard lock(mutex_);
  if (count == 0) return;
  rows_scratch_.resize(n_spare);
  find_rows(spare, n_spare, rows_scratch_.data());
  pick_least_recent(count, before_step, rows_scratch_.data(), n_spare);
  const SettleAtExit settle_at_exit{this};
  remove_rows(victims_, out);
}

uint64_t HostTable::list_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                                 size_t n_spare, std::vector<RowAge>* out) {
  std::lock_guard lock(mutex_);
  out->clear();
  if (count == 0) return 0;
  rows_scratch_.resize(n_spare);
  find_rows(spare, n_spare, rows_scratch_.data());
  const uint64_t candidates = pick_least_recent(count, before_step, rows_scratch_.data(), n_spare);
  out->reserve(victims_.size());
  for (const uint32_t r : victims_) {
    const row::RowMeta* meta = arena_.row_meta(r);
    out->push_back({meta->step, meta->key});
  }
  return candidates;
}

uint64_t HostTable::evict_keys(const int64_t* keys, size_t n) {
  std::lock_guard lock(mutex_);
  rows_of(keys, n);
  const SettleAtExit settle_at_exit{this};
  evict_rows(victims_);
  return victims_.size();
}

uint64_t HostTable::count_admission(const int64_t* keys, size_t n, uint64_t step, bool count) {
  std::lock_guard lock(mutex_);
  return ledger_.count_admission(keys, n, step, count, spec().name);
}

void HostTable::reserve_put(uint64_t n) {
  std::lock_guard lock(mutex_);
  if (n != 0) prepare_put(n);
}

// Row ids, index room, the carried bits (allocated by the first put) and a tiered table's frames
// for n rows put in, free now: the put then moves nothing down and allocates nothing.
void HostTable::prepare_put(uint64_t n) {
  reserve_rows(std::min<uint64_t>(next_row_ + n, row::kMaxRows));
  if (carried_.empty()) carried_.assign(dirty_.size(), 0);
  if (!tiered_) return;
  finish_prefetch();
  begin_tier_call();
  make_frames(n);
  reserve_frames_for(n);
}

void HostTable::put_rows(const MovedRows& rows) {
  std::lock_guard lock(mutex_);
  const size_t n = rows.size();
  if (n == 0) return;
  for (size_t i = 0; i < n; ++i) {
    if (index_.find(rows.keys[i]) != row::kNoRow) {
      fail(EMBSTORE_INTERNAL, "table '{}': a row put in for key {} that the table holds",
           spec().name, rows.keys[i]);
    }
  }
  if (rows_ + n > row::row_limit(spec().max_capacity)) {
    fail_over_limit(spec(), n, rows_, "rows moved in", "moved");
  }
  // Room for every row before the index changes (none to make after reserve_put).
  const SettleAtExit settle_at_exit{this};
  prepare_put(n);
  const bool in_flight = sink_ != nullptr;
  const uint32_t stride = spec().stride();
  for (size_t i = 0; i < n; ++i) {
    bool added = false;
    const uint32_t r = find_or_add_row(rows.keys[i], &added);
    if (!added) continue;  // a repeat: the first is kept
    if (tiered_) place_new_row(r);
    *arena_.row_meta(r) = row::RowMeta{rows.keys[i], rows.steps[i]};
    std::memcpy(arena_.row(frame_of(r)), rows.records.data() + i * size_t{stride},
                stride * sizeof(float));
    // Its bits were cleared when its id was freed (remove_rows): set what it brings.
    const row::PutBits bits =
        row::put_row_bits(rows.dirty[i] != 0, rows.in_snapshot[i] != 0, in_flight);
    if (bits.dirty) row::bitmap_set<false>(dirty_.data(), r);
    if (bits.carried) row::bitmap_set<false>(carried_.data(), r);
  }
}

}  // namespace embstore::host_backend
