// The host table's snapshots: capture, the drain beside training calls, copy-on-write of the
// captured rows a call is about to change, and ending a snapshot.
#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/snapshot.h"
#include "host/backend/host_table.hpp"
#include "host/error.hpp"

namespace embstore::host_backend {

uint64_t HostTable::capture(bool full, SnapshotSink* sink, uint64_t* live_rows) {
  std::lock_guard lock(mutex_);
  // A prefetch's read may be overwriting the frames of rows it moves down, which are still their
  // homes: the drain would read them there. Those rows land on disk first.
  if (!prefetch_.down_rows.empty()) finish_prefetch();
  const uint64_t words = dirty_.size();
  // Allocations before the dirty bits are touched: a failure changes nothing. The counts
  // last: once frozen, only end_snapshot settles them.
  captured_.assign(words, 0);
  snapshot_set_.assign(words, 0);
  ledger_.begin_capture(full);
  uint64_t taken = 0;
  for (uint64_t w = 0; w < words; ++w) {
    taken += row::popcount64(
        row::capture_word(full, dirty_.data(), captured_.data(), w, next_row_, freed_[w]));
  }
  std::copy(captured_.begin(), captured_.end(), snapshot_set_.begin());
  ledger_.commit_capture();
  sink_ = sink;
  captured_left_.store(taken);
  drain_word_ = 0;
  drain_stage_ = tiered_ ? DrainStage::kStart : DrainStage::kSweep;
  drain_slot_ = 0;
  *live_rows = rows_;
  return taken;
}

// Drain runs without the table's lock, beside training calls. A row is written by whoever
// takes its captured bit: drain (a few rows of a word at a time) or a training call's
// copy-on-write. A call that finds the bit of a row it updates already gone must not write
// the row while drain may still be copying it, so drain makes drain_copying_ odd for the
// duration of each take-and-copy, and the call waits for it to move on (see
// wait_for_drain_copy). The bitmap's size and every captured row stay put: the captured
// bitmap is not resized during a snapshot, and rows never move (on a tiered table a captured
// row is written out before it moves: host_table_tier.cpp).
uint64_t HostTable::drain(SnapshotSink* sink, uint64_t max_rows) {
  const uint32_t stride = spec().stride();
  const uint64_t record = row::record_bytes(stride);
  // A tiered table's rows on disk are read in batches of many words' rows: one row per word
  // (a sparse delta) would be a read at a time.
  const uint64_t batch = tiered_ ? kTieredDrainRows : 64;
  if (copy_failed_.load()) {
    // A training call's copy-on-write could not read rows it had taken from the tier: they
    // are not in the snapshot, so it fails (end_snapshot marks its rows dirty again).
    fail(EMBSTORE_IO_ERROR,
         "table '{}': copy-on-write could not read captured rows from the "
         "SSD tier in '{}'",
         spec().name, spec().tier_dir);
  }
  uint64_t budget = std::min(max_rows, captured_left_.load());
  while (budget > 0 && drain_pending()) {
    if (drain_stage_ == DrainStage::kSweep && row::atomic_load(&captured_[drain_word_]) == 0) {
      ++drain_word_;  // copy-on-write only clears bits, so it stays empty
      continue;
    }
    uint64_t granted = 0;
    char* out = sink->reserve(std::min(budget, batch), false, &granted);
    if (out == nullptr) break;  // staging is full
    drain_copying_.fetch_add(1);
    // Even after a throw (a failed read of the tier) drain_copying_ must end even, or every
    // later copy-on-write would wait forever (or no longer wait when it must).
    struct EndCopy {
      std::atomic<uint64_t>& counter;
      bool done = false;
      ~EndCopy() {
        if (!done) counter.fetch_add(1);
      }
    } end_copy{drain_copying_};
    uint64_t filled = 0;
    if (tiered_) {
      filled = drain_tiered(granted, out);
    } else {
      uint64_t taken = row::take_captured_rows(captured_.data(), drain_word_, granted);
      for (; taken != 0; taken &= taken - 1, ++filled) {
        const uint64_t r = drain_word_ * 64 + static_cast<uint64_t>(__builtin_ctzll(taken));
        row::write_record(out + filled * record, arena_.row_meta(r)->key, arena_.row(r), stride);
      }
    }
    // After the copies: a call that reads captured_left_ as 0 skips the wait.
    captured_left_.fetch_sub(filled);
    drain_copying_.fetch_add(1);
    end_copy.done = true;
    sink->commit(filled);
    budget -= std::min(budget, filled);
  }
  sink->flush();
  return captured_left_.load();
}

bool HostTable::drain_pending() const {
  return drain_stage_ != DrainStage::kSweep || drain_word_ < captured_.size();
}

// drain's copies on a tiered table: up to `granted` captured rows taken, stage after stage,
// those on disk read in one batch. Under disk_mutex_, so that no home changes meanwhile (a
// training call moving one of these rows finds its captured bit gone and waits for this copy
// before it frees the old home). A full checkpoint's rows on disk are most of the table: taken
// by row id they would be a random page read each (rows of one page rarely fall in one batch);
// in slot order every page is read once, in file order.
uint64_t HostTable::drain_tiered(uint64_t granted, char* out) {
  const uint32_t stride = spec().stride();
  const uint64_t record = row::record_bytes(stride);
  drain_rows_.clear();
  std::lock_guard disk_lock(disk_mutex_);
  bool more = true;
  while (more && drain_rows_.size() < granted && drain_pending()) {
    const uint64_t want = granted - drain_rows_.size();
    switch (drain_stage_) {
      case DrainStage::kStart:
        choose_drain_order();
        break;
      case DrainStage::kSlots:
        more = take_rows_by_slot(want);
        break;
      case DrainStage::kSweep:
        take_rows_by_id(want);
        break;
    }
  }
  drain_homes_.clear();
  for (const uint32_t r : drain_rows_) {
    if (const uint32_t h = home(r); (h & kOnDisk) != 0) drain_homes_.push_back(h);
  }
  drain_scratch_.resize(drain_homes_.size() * size_t{stride});
  if (!drain_homes_.empty()) {
    read_disk_rows(drain_homes_.size(), drain_homes_.data(), drain_scratch_.data());
  }
  uint64_t on_disk = 0;
  for (size_t k = 0; k < drain_rows_.size(); ++k) {
    const uint32_t r = drain_rows_[k];
    const uint32_t h = home(r);
    const float* values =
        (h & kOnDisk) != 0 ? drain_scratch_.data() + on_disk++ * stride : arena_.row(h);
    row::write_record(out + k * record, arena_.row_meta(r)->key, values, stride);
  }
  return drain_rows_.size();
}

// kStart: kSlots when the captured rows on disk are at least 1 / kDrainBySlotRatio of the
// tier's slots (a full checkpoint's), else kSweep (a delta's, mostly rows in memory). One pass
// over the captured rows' homes, under disk_mutex_, stopping once they are known to be many
// (a full checkpoint's stops early; a delta's looks at its rows once).
void HostTable::choose_drain_order() {
  const uint64_t slots = disk_->file_pages() * disk_->rows_per_page();
  uint64_t on_disk = 0;
  for (uint64_t w = 0; w < captured_.size() && on_disk * kDrainBySlotRatio < slots; ++w) {
    for (uint64_t bits = row::atomic_load(&captured_[w]); bits != 0; bits &= bits - 1) {
      const auto r = static_cast<uint32_t>(w * 64 + __builtin_ctzll(bits));
      if ((home(r) & kOnDisk) != 0) ++on_disk;
    }
  }
  drain_stage_ =
      on_disk > 0 && on_disk * kDrainBySlotRatio >= slots ? DrainStage::kSlots : DrainStage::kSweep;
  drain_word_ = 0;
  drain_slot_ = 0;
}

// kSlots: captured rows on disk in slot order from drain_slot_ on, looking at most at
// kDrainSlotsPerStep slots (false: it stopped there; the lock is not held for a walk of the
// whole file when copy-on-write took most rows first). disk_row_ names the row a slot was last
// given: the slot holds it only while that row's home is the slot. At the end of the file,
// kSweep takes what is left (rows compaction moved behind the walk).
bool HostTable::take_rows_by_slot(uint64_t want) {
  const uint64_t captured_rows = captured_.size() * 64;
  const uint64_t slots =
      std::min<uint64_t>(disk_row_.size(), disk_->file_pages() * disk_->rows_per_page());
  const uint64_t end = std::min(slots, drain_slot_ + kDrainSlotsPerStep);
  uint64_t got = 0;
  for (; got < want && drain_slot_ < end; ++drain_slot_) {
    const uint32_t r = disk_row_[drain_slot_];
    // Created after the capture (a slot never given holds 0, which the home check rejects).
    if (r >= captured_rows) continue;
    if ((row::atomic_load(&captured_[r / 64]) & (uint64_t{1} << (r % 64))) == 0) continue;
    if (home(r) != (kOnDisk | static_cast<uint32_t>(drain_slot_))) continue;
    if (!row::take_captured<true>(captured_.data(), r)) continue;  // copy-on-write took it
    drain_rows_.push_back(r);
    ++got;
  }
  if (drain_slot_ < slots)
    return got == want;  // the batch is full, or the walk stopped at its share
  drain_stage_ = DrainStage::kSweep;
  drain_word_ = 0;
  return true;
}

// kSweep: captured rows wherever they are, by row id from drain_word_ on.
void HostTable::take_rows_by_id(uint64_t want) {
  const uint64_t words = captured_.size();
  uint64_t got = 0;
  while (got < want && drain_word_ < words) {
    const uint64_t room = want - got;
    uint64_t taken = row::take_captured_rows(captured_.data(), drain_word_, room);
    const uint64_t n = row::popcount64(taken);
    got += n;
    for (; taken != 0; taken &= taken - 1) {
      drain_rows_.push_back(static_cast<uint32_t>(drain_word_ * 64 + __builtin_ctzll(taken)));
    }
    // Fewer than asked: the word is empty, unless copy-on-write took one of the bits picked
    // (then the rest are still there: take again). Bits are only ever cleared.
    if (n < room && row::atomic_load(&captured_[drain_word_]) == 0) ++drain_word_;
  }
}

const std::vector<int64_t>& HostTable::evicted_at_capture() const {
  return ledger_.evicted_at_capture();
}

std::optional<io::AdmissionFile> HostTable::admission_at_capture() const {
  return ledger_.admission_at_capture();
}

void HostTable::end_snapshot(bool failed) {
  std::lock_guard lock(mutex_);
  if (failed) {
    for (size_t w = 0; w < snapshot_set_.size(); ++w) {
      row::restore_dirty_word(dirty_.data(), snapshot_set_.data(), w, freed_[w]);
    }
    // Rows another table's part of the snapshot held, moved here since (a stack's).
    for (size_t w = 0; w < carried_.size(); ++w) {
      row::restore_dirty_word(dirty_.data(), carried_.data(), w, freed_[w]);
    }
  }
  std::fill(carried_.begin(), carried_.end(), 0);  // empty but on a table that gets puts
  ledger_.end_snapshot(failed);
  copy_failed_.store(false);
  captured_.clear();
  snapshot_set_.clear();
  captured_left_.store(0);
  sink_ = nullptr;
}

// Copy-on-write of rows about to change (updated or evicted) while a snapshot is in
// progress: take_for_copy each row (cow_rows_ cleared first) collects the captured ones,
// then copy_out_taken writes them to the sink.
void HostTable::take_for_copy(uint32_t r) {
  // Rows past the captured bitmap were never captured.
  if (r < captured_.size() * 64 && row::take_captured<true>(captured_.data(), r)) {
    cow_rows_.push_back(r);
  }
}

void HostTable::copy_out_taken() {
  const std::vector<uint32_t>& rows = cow_rows_;
  const uint32_t stride = spec().stride();
  const uint64_t record = row::record_bytes(stride);
  wait_for_drain_copy();
  // Where each row's values are, those on disk read first: nothing is reserved from the sink
  // before the only step that can fail.
  const float* const* values = stage_for_copy(rows);
  size_t done = 0;
  while (done < rows.size()) {
    uint64_t granted = 0;
    char* out = sink_->reserve(rows.size() - done, true, &granted);
    if (out == nullptr) break;  // the snapshot was aborted
    for (uint64_t k = 0; k < granted; ++k) {
      const uint32_t r = rows[done + k];
      row::write_record(out + k * record, arena_.row_meta(r)->key, values[done + k], stride);
    }
    sink_->commit(granted);
    done += granted;
  }
  sink_->count_copy_on_write(rows.size());
  // No staging chunk stays with the table between calls: the writer can always free one.
  sink_->flush();
  // Only now: drain reports the snapshot written out once this reaches 0, so these records
  // must be in staging first.
  captured_left_.fetch_sub(rows.size());
}

// Waits while drain may be copying a row that this call found already taken: drain takes
// and copies with drain_copying_ odd, so a take that preceded this call's is finished once
// the counter has moved on from the odd value read after this call's takes.
void HostTable::wait_for_drain_copy() {
  const uint64_t seen = drain_copying_.load();
  if ((seen & 1) == 0) return;
  for (int spin = 0; drain_copying_.load() == seen; ++spin) {
    if (spin >= 64) std::this_thread::yield();  // drain's thread may be off its core
  }
}

}  // namespace embstore::host_backend
