// A table stacked on another: see stacked_table.hpp.
#include "host/table/stacked_table.hpp"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>

#include "cuda/row/eviction.h"
#include "host/error.hpp"

namespace embstore {
namespace {

// take_coldest's cutoff: rows touched at `step` or before.
uint64_t through(uint64_t step) { return step == UINT64_MAX ? step : step + 1; }

}  // namespace

StackSpecs stack_specs(const TableSpec& spec) {
  StackSpecs s{spec, spec, 0};
  // The row limit is the stack's own (choose_victims); neither table has one.
  for (TableSpec* t : {&s.upper, &s.lower}) {
    t->max_capacity = 0;
    t->evict_when_full = false;
  }
  // With admission the stack asks the upper table's counts, before a call at its row limit, how
  // many of the call's keys will get a row (Table::count_admission): they must be on the host.
  s.upper.counts_on_host = spec.max_capacity != 0 && spec.admits();
  const uint64_t below = std::max<uint64_t>(spec.memory_rows / 8, 1);
  s.upper_rows = spec.device_rows + spec.memory_rows - below;
  s.upper.memory_rows = 0;
  s.upper.gives_rows = true;
  s.upper.tier_dir.clear();
  s.upper.initial_capacity = std::min(spec.initial_capacity, s.upper_rows);
  s.lower.device_rows = 0;
  s.lower.memory_rows = below;
  s.lower.admit_after = 0;
  s.lower.admit_bloom_bytes = 0;
  return s;
}

StackedTable::StackedTable(TableSpec spec, std::unique_ptr<Table> upper,
                           std::unique_ptr<Table> lower, uint64_t upper_rows,
                           KeysToHost keys_to_host)
    : Table(std::move(spec)),
      upper_(std::move(upper)),
      lower_(std::move(lower)),
      upper_rows_(upper_rows),
      slack_(upper_rows / kSlackShare),
      keys_to_host_(std::move(keys_to_host)) {}

const std::vector<int64_t>& StackedTable::host_keys(const int64_t* keys, size_t n, void* stream) {
  keys_to_host_(keys, n, stream, &keys_);
  return keys_;
}

void StackedTable::lookup(const int64_t* keys, size_t n, float* values_out, bool insert,
                          uint64_t step, void* stream) {
  std::lock_guard lock(mutex_);
  if (n == 0) return;
  last_step_ = std::max(last_step_, step);
  const int64_t* call_keys = host_keys(keys, n, stream).data();
  const EndCall ending{this};
  bring_up(call_keys, n, insert, step);
  upper_->lookup(keys, n, values_out, insert, step, stream);
}

void StackedTable::apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                                   void* stream) {
  std::lock_guard lock(mutex_);
  if (n == 0) return;
  last_step_ = std::max(last_step_, step);
  const int64_t* call_keys = host_keys(keys, n, stream).data();
  const EndCall ending{this};
  bring_up(call_keys, n, false, step);
  upper_->apply_gradients(keys, grads, n, step, stream);
}

// The rows below are the lower table's to read ahead (a host table's prefetch reads on its own
// thread, beside the trainer's work); the call that needs them moves them up, from memory by
// then. The upper table's own prefetch (the CUDA device tier's trades) follows.
void StackedTable::prefetch(const int64_t* keys, size_t n, void* stream) {
  std::lock_guard lock(mutex_);
  if (n == 0) return;
  const int64_t* call_keys = host_keys(keys, n, stream).data();
  const EndCall ending{this};
  list_missing(call_keys, n);
  // A hint, as a host table's prefetch: its failures are not reported (the call that needs the
  // rows meets them again).
  if (!missing_.empty()) lower_->prefetch(missing_.data(), missing_.size(), nullptr);
  upper_->prefetch(keys, n, stream);
}

// Stages: the keys the upper table lacks (distinct), those of them the lower table holds, room
// above for them (and for the keys neither holds, which an insert may add), the move up.
void StackedTable::bring_up(const int64_t* keys, size_t n, bool insert, uint64_t step) {
  list_missing(keys, n);
  if (missing_.empty()) return;
  std::sort(missing_.begin(), missing_.end());
  missing_.erase(std::unique(missing_.begin(), missing_.end()), missing_.end());
  held_.resize(missing_.size());
  lower_->find_held(missing_.data(), missing_.size(), held_.data());
  ups_.clear();
  for (size_t i = 0; i < missing_.size(); ++i) {
    if (held_[i] != 0) ups_.push_back(missing_[i]);
  }
  uint64_t fresh = insert ? missing_.size() - ups_.size() : 0;
  victims_.clear();
  if (fresh != 0) fresh = choose_victims(fresh, step);
  const uint64_t coming = insert ? missing_.size() : ups_.size();
  if (coming == 0) return;
  const uint64_t live = upper_->live_rows();
  if (live + coming > upper_rows_) {
    make_room_above(live + coming - (upper_rows_ - slack_), step, true);
  }
  if (!ups_.empty()) move_up(ups_);
  if (!victims_.empty()) evict_victims(fresh);
}

// As an untiered table at its row limit, before any row changes: the call's new rows counted
// exactly (with admission, those the upper table's counts would admit: a refused call's keys stay
// counted, count_refused), and refused without an eviction rule. The stack's `need` least recently
// used rows are the oldest of each table's `need` oldest (each listed with its candidates' count:
// too few in all, and the call is refused).
uint64_t StackedTable::choose_victims(uint64_t fresh, uint64_t step) {
  const uint64_t limit = spec().max_capacity;
  if (limit == 0) return fresh;
  const uint64_t live = live_in_both();
  if (live + fresh <= limit) return fresh;  // even if every new key is admitted
  if (spec().admits()) {
    list_fresh_calls();
    fresh = upper_->count_admission(fresh_calls_.data(), fresh_calls_.size(), step, false);
    if (fresh == 0 || live + fresh <= limit) return fresh;  // no new row: nothing to refuse
  }
  if (!spec().evicts()) {
    count_refused(step);
    fail_over_limit(spec(), fresh, live, "new rows", "inserted");
  }
  const uint64_t need = live + fresh - limit;
  const uint64_t above = upper_->list_coldest(need, step, keys_.data(), keys_.size(), &ages_);
  const uint64_t below = lower_->list_coldest(need, step, keys_.data(), keys_.size(), &ages_below_);
  if (above + below < need) {
    count_refused(step);
    fail_no_room(spec(), need, above + below, step);
  }
  ages_.insert(ages_.end(), ages_below_.begin(), ages_below_.end());
  const auto first = [](const RowAge& a, const RowAge& b) {
    return row::evicted_first(a.step, a.key, b.step, b.key);
  };
  std::nth_element(ages_.begin(), ages_.begin() + static_cast<ptrdiff_t>(need), ages_.end(), first);
  for (uint64_t i = 0; i < need; ++i) victims_.push_back(ages_[i].key);
  return fresh;
}

// The call's keys that neither table holds (missing_ less ups_, both sorted), each occurrence in
// call order: what the upper table counts when the call inserts.
void StackedTable::list_fresh_calls() {
  fresh_.clear();
  std::set_difference(missing_.begin(), missing_.end(), ups_.begin(), ups_.end(),
                      std::back_inserter(fresh_));
  fresh_calls_.clear();
  for (const int64_t key : keys_) {
    if (std::binary_search(fresh_.begin(), fresh_.end(), key)) fresh_calls_.push_back(key);
  }
}

// An untiered table counts a refused insert's keys: they stay counted.
void StackedTable::count_refused(uint64_t step) {
  if (spec().admits()) {
    upper_->count_admission(fresh_calls_.data(), fresh_calls_.size(), step, true);
  }
}

// The victims go once the rows have moved (a failed move leaves them), and once the upper table
// has room for the call's new rows (growing can fail; nothing is evicted then). Each victim is in
// one of the two tables, wherever the moves put it. Below first: a host table's eviction can fail
// (a captured row's copy read from disk), and then none has gone; above, on the CUDA table, only
// a device error remains (a host upper table, as in the tests, has no disk to read its captured
// rows from).
void StackedTable::evict_victims(uint64_t fresh) {
  upper_->reserve_put(fresh);
  uint64_t evicted = lower_->evict_keys(victims_.data(), victims_.size());
  if (evicted < victims_.size()) evicted += upper_->evict_keys(victims_.data(), victims_.size());
  if (evicted != victims_.size()) {
    fail(EMBSTORE_INTERNAL, "table '{}': {} rows chosen to evict at max_capacity, {} found",
         spec().name, victims_.size(), evicted);
  }
}

uint64_t StackedTable::make_room_above(uint64_t count, uint64_t step, bool spare_calls) {
  spare_.clear();
  if (spare_calls) {
    spare_.assign(keys_.begin(), keys_.end());
    spare_.insert(spare_.end(), previous_.begin(), previous_.end());
  }
  // Room below first: once the rows are taken, their put must not fail.
  lower_->reserve_put(count);
  moved_.clear();
  upper_->take_coldest(count, through(step), spare_.data(), spare_.size(), &moved_);
  if (moved_.size() == 0) return 0;
  put_or_return(*lower_, *upper_);
  moved_down_ += moved_.size();
  return moved_.size();
}

// After reserve_put, only a device error fails a put; the rows then go back where they came
// from (whose room they just left), so that none is lost unless the device fails twice.
void StackedTable::put_or_return(Table& to, Table& from) {
  try {
    to.put_rows(moved_);
  } catch (...) {
    from.put_rows(moved_);
    throw;
  }
}

void StackedTable::move_up(const std::vector<int64_t>& keys) {
  upper_->reserve_put(keys.size());
  moved_.clear();
  lower_->take_rows(keys.data(), keys.size(), &moved_);
  put_or_return(*upper_, *lower_);
  moved_up_ += moved_.size();
}

void StackedTable::end_call() noexcept {
  try {
    // Down to the slack below the budget, sparing the rows of this call and the one before (a
    // prefetch's are about to be used); down to the budget without sparing them, if need be.
    uint64_t live = upper_->live_rows();
    if (live > upper_rows_) {
      live -= make_room_above(live - (upper_rows_ - slack_), last_step_, true);
      if (live > upper_rows_) make_room_above(live - upper_rows_, last_step_, false);
    }
  } catch (...) {
    // The rows stay above, over the budget; the next call that needs room meets the failure
    // again and reports it.
  }
  keys_.swap(previous_);
}

TableCounters StackedTable::counters() {
  std::lock_guard lock(mutex_);
  const TableCounters a = upper_->counters();
  const TableCounters b = lower_->counters();
  TableCounters c;
  c.rows = a.rows + b.rows;
  c.capacity = a.capacity + b.capacity;
  c.dirty_rows = a.dirty_rows + b.dirty_rows;
  c.inserted = a.inserted + b.inserted;  // the lower table's: rows a restore loaded there
  c.evicted = a.evicted + b.evicted;
  c.pending_admission = a.pending_admission;  // admission counts only above
  c.skipped_keys = a.skipped_keys;
  c.admitted = a.admitted;
  c.rows_in_device = a.rows_in_device;
  c.rows_in_memory = a.rows - a.rows_in_device + b.rows_in_memory;
  c.rows_on_disk = b.rows_on_disk;
  // Every hop counts: within the upper table (device and host memory), between the tables,
  // within the lower one (host memory and SSD).
  c.rows_moved_up = a.rows_moved_up + moved_up_ + b.rows_moved_up;
  c.rows_moved_down = a.rows_moved_down + moved_down_ + b.rows_moved_down;
  c.tier_bytes_read = b.tier_bytes_read;
  c.tier_bytes_written = b.tier_bytes_written;
  return c;
}

void StackedTable::set_dirty_tracking(bool on) {
  std::lock_guard lock(mutex_);
  upper_->set_dirty_tracking(on);
  lower_->set_dirty_tracking(on);
}

uint64_t StackedTable::capture(bool full, SnapshotSink* sink, uint64_t* live_rows) {
  std::lock_guard lock(mutex_);
  uint64_t live_above = 0, live_below = 0;
  const uint64_t above = upper_->capture(full, sink, &live_above);
  uint64_t below = 0;
  try {
    below = lower_->capture(full, sink, &live_below);
  } catch (...) {
    upper_->end_snapshot(true);
    throw;
  }
  try {
    // The tombstones of both tables, less the keys with a row in either: a key evicted below may
    // have a new row above.
    evicted_ = upper_->evicted_at_capture();
    const std::vector<int64_t>& below_evicted = lower_->evicted_at_capture();
    evicted_.insert(evicted_.end(), below_evicted.begin(), below_evicted.end());
    if (!evicted_.empty()) {
      std::vector<uint8_t> held(evicted_.size());
      held_in_either(evicted_.data(), evicted_.size(), held.data());
      size_t kept = 0;
      for (size_t i = 0; i < evicted_.size(); ++i) {
        if (held[i] == 0) evicted_[kept++] = evicted_[i];
      }
      evicted_.resize(kept);
    }
  } catch (...) {
    upper_->end_snapshot(true);
    lower_->end_snapshot(true);
    throw;
  }
  *live_rows = live_above + live_below;
  return above + below;
}

uint64_t StackedTable::drain(SnapshotSink* sink, uint64_t max_rows) {
  const uint64_t left_above = upper_->drain(sink, max_rows);
  const uint64_t left_below = lower_->drain(sink, left_above == 0 ? max_rows : 0);
  return left_above + left_below;
}

void StackedTable::end_snapshot(bool failed) {
  std::lock_guard lock(mutex_);
  upper_->end_snapshot(failed);
  lower_->end_snapshot(failed);
  evicted_.clear();
}

uint64_t StackedTable::evict_before(uint64_t cutoff_step) {
  std::lock_guard lock(mutex_);
  return upper_->evict_before(cutoff_step) + lower_->evict_before(cutoff_step);
}

void StackedTable::reserve(uint64_t rows) {
  std::lock_guard lock(mutex_);
  if (spec().max_capacity != 0) {  // a load past the limit fails anyway
    const uint64_t live = live_in_both();
    rows = std::min(rows, spec().max_capacity > live ? spec().max_capacity - live : 0);
  }
  upper_->reserve(std::min(rows, upper_rows_));
  if (rows > upper_rows_) lower_->reserve(rows - upper_rows_);
}

// The rows fill the upper table up to its budget, the rest go below. Newest version first: with
// skip_held, a key either table holds is left out, as is a repeat within the input.
void StackedTable::load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                             uint64_t step, bool skip_held) {
  std::lock_guard lock(mutex_);
  if (n == 0) return;
  const uint32_t dim = spec().dim;
  const uint32_t state_dim = spec().state_dim();
  std::vector<size_t> keep;
  keep.reserve(n);
  if (skip_held) {
    std::vector<uint8_t> held(n);
    held_in_either(keys, n, held.data());
    std::vector<std::pair<int64_t, size_t>> order(n);
    for (size_t i = 0; i < n; ++i) order[i] = {keys[i], i};
    std::sort(order.begin(), order.end());  // by key, then input position: the first of a run
    for (size_t j = 0; j < n; ++j) {
      const size_t i = order[j].second;
      if (j > 0 && order[j - 1].first == order[j].first) continue;
      if (held[i] == 0) keep.push_back(i);
    }
    std::sort(keep.begin(), keep.end());
  } else {
    for (size_t i = 0; i < n; ++i) keep.push_back(i);
  }
  if (spec().max_capacity != 0) {
    const uint64_t held = live_in_both();
    if (held + keep.size() > spec().max_capacity) {
      fail_over_limit(spec(), keep.size(), held, "rows to load", "loaded");
    }
  }
  const uint64_t live = upper_->live_rows();
  const size_t above = static_cast<size_t>(
      std::min<uint64_t>(keep.size(), upper_rows_ > live ? upper_rows_ - live : 0));
  std::vector<int64_t> part_keys;
  std::vector<float> part_values, part_state;
  const auto load_part = [&](Table& table, size_t first, size_t last) {
    if (first == last) return;
    part_keys.clear();
    part_values.clear();
    part_state.clear();
    for (size_t j = first; j < last; ++j) {
      const size_t i = keep[j];
      part_keys.push_back(keys[i]);
      part_values.insert(part_values.end(), values + i * dim, values + (i + 1) * dim);
      if (state_dim > 0) {
        part_state.insert(part_state.end(), state + i * state_dim, state + (i + 1) * state_dim);
      }
    }
    table.load_rows(part_keys.data(), part_values.data(), part_state.data(), part_keys.size(), step,
                    false);
  };
  load_part(*upper_, 0, above);
  load_part(*lower_, above, keep.size());
}

bool StackedTable::load_admission(const io::AdmissionFile& counts, std::string* why) {
  std::lock_guard lock(mutex_);
  if (counts.kind != io::AdmissionKind::kExact || counts.entries.empty()) {
    return upper_->load_admission(counts, why);
  }
  std::vector<int64_t> keys;
  keys.reserve(counts.entries.size());
  for (const io::AdmissionEntry& e : counts.entries) keys.push_back(e.key);
  std::vector<uint8_t> below(keys.size());
  lower_->find_held(keys.data(), keys.size(), below.data());
  io::AdmissionFile kept;
  kept.kind = counts.kind;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (below[i] == 0) kept.entries.push_back(counts.entries[i]);
  }
  return upper_->load_admission(kept, why);
}

uint64_t StackedTable::live_in_both() { return upper_->live_rows() + lower_->live_rows(); }

void StackedTable::held_in_either(const int64_t* keys, size_t n, uint8_t* held) {
  std::vector<uint8_t> below(n);
  upper_->find_held(keys, n, held);
  lower_->find_held(keys, n, below.data());
  for (size_t i = 0; i < n; ++i) held[i] |= below[i];
}

void StackedTable::list_missing(const int64_t* keys, size_t n) {
  held_.resize(n);
  upper_->find_held(keys, n, held_.data());
  missing_.clear();
  for (size_t i = 0; i < n; ++i) {
    if (held_[i] == 0) missing_.push_back(keys[i]);
  }
}

}  // namespace embstore
