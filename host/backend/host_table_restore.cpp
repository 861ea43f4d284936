// The host table's side of a restore: reserve (room for the rows to load, faulted in ahead),
// load_rows (the index in input order, in parallel where it can be, then the rows copied in on
// the pool's threads) and load_admission.
#include <algorithm>
#include <cstring>
#include <mutex>

#include "cuda/row/arena.h"
#include "cuda/row/index.h"
#include "host/backend/host_table.hpp"
#include "host/error.hpp"

namespace embstore::host_backend {
namespace {

constexpr uint64_t kNoSlot = ~uint64_t{0};
// A restore's blocks hold about 1 MiB of rows (2,000 of dim 64 with Adagrad): load_rows splits
// them finer than training batches.
constexpr size_t kLoadGrain = 256;
// reserve() leaves room for this many rows more than asked: about two restore blocks.
constexpr uint64_t kLoadHeadroom = 4096;

}  // namespace

void HostTable::reserve(uint64_t rows) {
  std::lock_guard lock(mutex_);
  const uint64_t limit = row::row_limit(spec().max_capacity);
  rows = std::min(rows, limit > rows_ ? limit - rows_ : 0);  // a load past it fails anyway
  // Room beyond: load_rows inserts a block in parallel only while the whole block would fit.
  reserve_rows(std::min(next_row_ + rows + kLoadHeadroom, uint64_t{row::kMaxRows}));
  if (tiered_) return;  // frames come as the rows do (load_rows)
  // The rows' memory is faulted in behind the caller's back while it loads; where that
  // cannot be, before it returns.
  if (!prefaulter_.start(row_ranges(next_row_, next_row_ + rows))) {
    populate_rows(next_row_, next_row_ + rows);
  }
}

bool HostTable::skips_held_keys() const { return true; }

void HostTable::load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                          uint64_t step, bool skip_held) {
  std::lock_guard lock(mutex_);
  if (n == 0) return;
  const uint64_t limit = row::row_limit(spec().max_capacity);
  // Skipping, the rows added are known only as they are added: checked after each (the
  // table is a restore's, dropped when this throws), and the table grows only if reserve()
  // was too small.
  if (!skip_held) {
    if (rows_ + n > limit) fail_over_limit(spec(), n, rows_, "rows to load", "loaded");
    reserve_rows(next_row_ + n);
  }
  const SettleAtExit settle_at_exit{this};
  if (tiered_) {  // room for every row of the block before the index changes
    finish_prefetch();
    begin_tier_call();
    make_frames(n);
    reserve_frames_for(n);
    reserve_rows(std::min<uint64_t>(next_row_ + n, row::kMaxRows));
  }
  // The index first, then the copies on the pool's threads. A key the table holds
  // (skip_held), or a repeat of a key in the input (a corrupt file; the first copy is kept),
  // gets no row here. Rows get ids in input order, as a serial insert gives.
  rows_scratch_.resize(n);
  uint32_t* rows = rows_scratch_.data();
  const bool parallel = pool_.size() > 1 && n >= 2 * kLoadGrain && n <= UINT32_MAX &&
                        free_rows_.empty() &&
                        next_row_ + n <= room_;  // no growth or rebuild half-way
  if (parallel) {
    load_index_parallel(keys, n, rows, limit);
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (i + kAhead < n) __builtin_prefetch(&index_.slots[index_.home(keys[i + kAhead])]);
      bool added = false;
      const uint32_t r = find_or_add_row(keys[i], &added);  // sets a new row's key
      rows[i] = added ? r : row::kNoRow;
      if (!added) continue;
      ++inserted_;
      if (rows_ > limit) fail_over_limit(spec(), 1, rows_ - 1, "rows to load", "loaded");
    }
  }
  if (tiered_) {
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] != row::kNoRow) place_new_row(rows[i]);
    }
  }
  const uint32_t dim = spec().dim;
  const uint32_t state_dim = spec().state_dim();
  const row::ArenaRef arena = arena_;
  const row::IndexRef index = index_;
  const bool tiered = tiered_;
  const HomeRef homes = home_;
  const uint64_t* claimed = parallel ? load_slots_.data() : nullptr;
  pool_.parallel_for(n, kLoadGrain, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      const uint32_t r = rows[i];
      if (r == row::kNoRow) continue;
      // A slot claimed by load_index_parallel gets its row now: distinct slots, no race.
      if (claimed != nullptr && claimed[i] != kNoSlot) index.slots[claimed[i]].row = r;
      *arena.row_meta(r) = row::RowMeta{keys[i], step};
      float* dst = arena.row(tiered ? *homes.at(r) : r);
      std::memcpy(dst, values + i * dim, dim * sizeof(float));
      if (state_dim > 0) {
        std::memcpy(dst + dim, state + i * state_dim, state_dim * sizeof(float));
      }
    }
  });
}

// The index part of load_rows on the pool's threads, for a table with room for every key of
// the input (no rebuild half-way) and no free rows. Each thread owns a range of slots and
// claims slots there for the absent keys homed in it (row::IndexRef::claim_in_range), in input
// order; then, serially and in input order, claimed keys get the next row ids and the keys
// whose probe crossed into another range are inserted (find_or_add_row): the ids a serial
// load gives. load_slots_[i] is the slot claimed for key i (its row is written by the caller's
// copy pass) or kNoSlot. A throw leaves claimed slots without rows: the table is a restore's,
// dropped with the failure.
//
// The keys reach their range's thread through a stable counting sort (load_order_), so that
// each key is hashed and placed once whatever the thread count: with every thread scanning the
// whole input for its own keys, the work grew with the threads.
void HostTable::load_index_parallel(const int64_t* keys, size_t n, uint32_t* rows, uint64_t limit) {
  const row::IndexRef index = index_;
  const uint64_t slots = index.mask + 1;
  const size_t parts = pool_.size();
  // Slot h lies in part h * parts / slots, whose range starts at slot ceil(slots * p / parts).
  const auto part_of = [&](uint64_t h) { return static_cast<size_t>(h * parts / slots); };
  const auto range_start = [&](size_t p) { return (slots * p + parts - 1) / parts; };
  load_slots_.resize(n);
  load_state_.resize(n);
  load_order_.resize(n);
  load_counts_.assign(parts * parts, 0);  // [chunk of the input][part]
  uint64_t* slot_of = load_slots_.data();
  uint8_t* state = load_state_.data();
  uint32_t* order = load_order_.data();
  uint64_t* counts = load_counts_.data();
  const auto chunk_begin = [&](size_t c) { return n * c / parts; };
  // Each key's home (kept in its slot_of until its claim), and the keys per part in each chunk.
  pool_.parallel_for(parts, 1, [&](size_t first, size_t last) {
    for (size_t c = first; c < last; ++c) {
      uint64_t* count = counts + c * parts;
      for (size_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) {
        slot_of[i] = index.home(keys[i]);
        ++count[part_of(slot_of[i])];
      }
    }
  });
  // Where each chunk's keys of each part go: part by part, chunk after chunk (input order).
  std::vector<uint64_t> part_begin(parts + 1, 0);
  uint64_t at = 0;
  for (size_t p = 0; p < parts; ++p) {
    part_begin[p] = at;
    for (size_t c = 0; c < parts; ++c) {
      const uint64_t k = counts[c * parts + p];
      counts[c * parts + p] = at;
      at += k;
    }
  }
  part_begin[parts] = at;
  pool_.parallel_for(parts, 1, [&](size_t first, size_t last) {
    for (size_t c = first; c < last; ++c) {
      uint64_t* next = counts + c * parts;
      for (size_t i = chunk_begin(c); i < chunk_begin(c + 1); ++i) {
        order[next[part_of(slot_of[i])]++] = static_cast<uint32_t>(i);
      }
    }
  });
  pool_.parallel_for(parts, 1, [&](size_t first, size_t last) {
    for (size_t p = first; p < last; ++p) {
      const uint64_t lo = range_start(p), hi = range_start(p + 1);
      const uint64_t end = part_begin[p + 1];
      for (uint64_t j = part_begin[p]; j < end; ++j) {
        if (j + kAhead < end) __builtin_prefetch(&index.slots[slot_of[order[j + kAhead]]]);
        const uint32_t i = order[j];
        state[i] = index.claim_in_range(keys[i], lo, hi, row::kLockedRow, &slot_of[i]);
        if (state[i] != row::IndexRef::kClaimed) slot_of[i] = kNoSlot;
      }
    }
  });
  for (size_t i = 0; i < n; ++i) {
    bool added = false;
    if (state[i] == row::IndexRef::kClaimed) {
      rows[i] = static_cast<uint32_t>(next_row_++);
      ++rows_;
      added = true;
    } else if (state[i] == row::IndexRef::kLeavesRange) {
      const uint32_t r = find_or_add_row(keys[i], &added);
      rows[i] = added ? r : row::kNoRow;
    } else {
      rows[i] = row::kNoRow;
    }
    if (!added) continue;
    ++inserted_;
    if (rows_ > limit) fail_over_limit(spec(), 1, rows_ - 1, "rows to load", "loaded");
  }
}

bool HostTable::load_admission(const io::AdmissionFile& counts, std::string* why) {
  std::lock_guard lock(mutex_);
  const row::IndexRef index = index_;
  return ledger_.load_admission(counts, why,
                                [&](int64_t key) { return index.find(key) != row::kNoRow; });
}

}  // namespace embstore::host_backend
