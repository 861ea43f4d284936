// The host table's SSD tier (spec().memory_rows != 0): rows beyond the memory budget live in a
// RowSlots file of the store's tier_dir; a call brings the rows it needs up in one batched read
// and makes room by moving the least recently used rows down in one batched write.
//
// Moves and checkpoints. Dirty, captured and freed bits are by row id, so they stay with a row
// wherever it lives, and capture does not look at tiers. A captured row that moves (either way)
// is first written to the snapshot by copy-on-write, with the value it had at the capture (a
// move does not change it), so the drain never meets it again; a row the drain took before the
// move is copied by the drain from its old home, which stays intact until wait_for_drain_copy
// says the drain moved on. Every write of home_ holds disk_mutex_, as does the drain when it
// reads a captured row's home and its bytes on disk.
//
// Failures. Nothing changes before the I/O of a move succeeds: a failed write leaves the rows in
// their frames, a failed read leaves them on disk; the call fails with IO_ERROR and no row is
// lost. A job on the table's thread (a prefetch's, a write-back) reports nothing: the call that
// needs its rows or room moves them itself, and reports a failure then.
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/index.h"
#include "host/backend/host_table.hpp"
#include "host/error.hpp"

namespace embstore::host_backend {
namespace {

// Handles must leave kOnDisk free: a RowSlots handle is page * rows_per_page + slot, so this
// bounds the tier at 2^31 slots (2^31 rows of more than 2 KiB, more of smaller ones).
constexpr uint64_t kMaxHandle = kOnDisk;
// The most pages one compaction rewrites (RowSlotsOptions::compact_max_pages).
constexpr size_t kCompactMaxPages = 1024;
using io::detail::errno_text;

}  // namespace

void HostTable::open_tier() {
  io::RowSlotsOptions options;
  options.queue_depth = 128;
  options.compact_max_pages = kCompactMaxPages;
  std::string detail;
  const size_t row_bytes = size_t{spec().stride()} * sizeof(float);
  if (int r = io::RowSlots::create(spec().tier_dir, row_bytes, options, &disk_, &detail); r < 0) {
    const embstore_status_t status = r == -ENOENT || r == -ENOTDIR || r == -EINVAL
                                         ? EMBSTORE_INVALID_ARGUMENT
                                         : EMBSTORE_IO_ERROR;
    fail(status, "table '{}': the SSD tier in tier_dir '{}': {}", spec().name, spec().tier_dir,
         detail.empty() ? errno_text(r) : detail);
  }
  reserve_frames(std::min(spec().memory_rows, spec().initial_capacity));
}

void HostTable::fail_tier(int err, const char* what, const std::string& detail) const {
  fail(EMBSTORE_IO_ERROR, "table '{}': {} the SSD tier in '{}': {}; no row was lost", spec().name,
       what, spec().tier_dir, detail.empty() ? errno_text(err) : detail);
}

// Picks the cold rows whose frames the read needs and takes free frames for the rest, then hands
// the job to the prefetch thread: the cold rows' write and the read happen there, and the call
// returns before either is done.
void HostTable::prefetch(const int64_t* keys, size_t n, void*) {
  std::lock_guard lock(mutex_);
  if (!tiered_) return;
  finish_prefetch();  // one in flight at a time
  rows_scratch_.resize(n);
  find_rows(keys, n, rows_scratch_.data());
  const SettleAtExit settle_at_exit{this};
  begin_tier_call();
  prefetch_clock_ = use_clock_;
  if (!stamp_resident(rows_scratch_.data(), n)) return;
  // A hint: only the rows that fit beside those of this call and the one before (the current
  // batch, whose update comes next) are read, the hottest first; the call that needs the others
  // reads them. The frames: free room under the budget, then those of colder rows, which move
  // down first (and an eighth of the budget beyond, as make_frames moves).
  const uint64_t budget = spec().memory_rows;
  down_frames_.clear();
  if (held_frames() + up_rows_.size() > budget) {
    pick_cold_frames(held_frames() + up_rows_.size() - budget + budget / 8, use_clock_ - 1);
  }
  const uint64_t room = budget + down_frames_.size() > held_frames()
                            ? budget + down_frames_.size() - held_frames()
                            : 0;
  if (up_rows_.size() > room) {
    // The hottest of them (ties: the lower row id), read in row order.
    const auto hotter = [&](uint32_t a, uint32_t b) {
      const uint8_t ha = *heat_.at(a), hb = *heat_.at(b);
      return ha != hb ? ha > hb : a < b;
    };
    std::nth_element(up_rows_.begin(), up_rows_.begin() + static_cast<std::ptrdiff_t>(room),
                     up_rows_.end(), hotter);
    up_rows_.resize(room);
    std::sort(up_rows_.begin(), up_rows_.end());
  }
  if (up_rows_.empty()) return;
  submit_job(up_rows_, down_frames_);
}

void HostTable::submit_job(const std::vector<uint32_t>& reads, const std::vector<uint32_t>& downs) {
  // Everything allocated before the first change: a failure leaves the table as it was.
  PrefetchJob job;
  const size_t reused = std::min(reads.size(), downs.size());
  job.rows = reads;
  job.frames.resize(reads.size());
  job.into.resize(reads.size());
  job.handles.reserve(reads.size());
  job.down_frames = downs;
  job.down_rows.resize(downs.size());
  job.down_from.resize(downs.size());
  job.down_handles.reserve(downs.size());
  job.fresh_frames = reads.size() - reused;
  job.clock = use_clock_;
  reserve_frames_for(job.fresh_frames);  // take_frame cannot fail now
  // The captured rows among those moving down go to the snapshot now, from their frames, before
  // the read may overwrite them: the drain never meets them again. Before anything that waits
  // for disk_mutex_, which the drain holds while it reads a batch from the tier: a call waiting
  // there could see the drain take these rows first, or not, by the scheduler's choice. Writing
  // them early is harmless if what follows fails: they hold their captured values.
  copy_out_before_move(job.down_frames);
  reserve_disk_rows(downs.size());  // finish_move_down cannot fail now
  if (!prefetch_thread_.joinable()) prefetch_thread_ = std::thread([this] { prefetch_loop(); });
  for (size_t i = 0; i < downs.size(); ++i) {
    const uint32_t f = job.down_frames[i];
    job.down_rows[i] = frame_row_[f];
    job.down_from[i] = reinterpret_cast<const char*>(arena_.row(f));
    row::bitmap_set<false>(moving_.data(), job.down_rows[i]);
  }
  for (size_t i = 0; i < reads.size(); ++i) {
    // Not a candidate for moving down: a taken frame's frame_row_ stays kNoRow.
    job.frames[i] = i < reused ? job.down_frames[i] : take_frame();
    job.into[i] = reinterpret_cast<char*>(arena_.row(job.frames[i]));
    row::bitmap_set<false>(moving_.data(), job.rows[i]);
  }
  job.submitted = true;
  {
    std::lock_guard prefetch_lock(prefetch_mutex_);
    prefetch_ = std::move(job);
  }
  prefetch_cv_.notify_all();
}

void HostTable::prefetch_loop() {
  // Named for debuggers and top -H (and the tests, which tell its tier writes from a
  // checkpoint writer's by it).
  pthread_setname_np(pthread_self(), kTierThreadName);
  std::unique_lock lock(prefetch_mutex_);
  for (;;) {
    prefetch_cv_.wait(lock,
                      [&] { return prefetch_stop_ || (prefetch_.submitted && !prefetch_.done); });
    // A table going away skips a job not started: its frames go with the table.
    if (prefetch_stop_) return;
    if (prefetch_.submitted && !prefetch_.done) {
      PrefetchJob& job = prefetch_;
      lock.unlock();
      run_prefetch_job(job);
      lock.lock();
      job.done = true;
      prefetch_cv_.notify_all();
    }
  }
}

// On the prefetch thread. The training thread neither reads nor writes the job's frames until
// finish_prefetch (a call that needs one of its rows finishes the job first), so the write reads
// the cold rows' frames and the read overwrites them without a lock on them.
void HostTable::run_prefetch_job(PrefetchJob& job) {
  std::lock_guard disk_lock(disk_mutex_);
  if (!job.down_from.empty()) {
    job.down_handles.resize(job.down_from.size());
    job.down_err =
        disk_->put(job.down_from.size(), job.down_from.data(), job.down_handles.data(), nullptr);
    if (job.down_err == 0 &&
        *std::max_element(job.down_handles.begin(), job.down_handles.end()) >= kMaxHandle) {
      disk_->free(job.down_handles.size(), job.down_handles.data());
      job.down_err = -ENOSPC;
    }
    if (job.down_err < 0) return;  // nothing moved: the read would overwrite their frames
  }
  if (job.rows.empty()) return;  // a write-back
  // The rows' homes cannot change while the job is in flight (compaction waits for it, and any
  // other move of them finishes it first): read under disk_mutex_ with the rest of the I/O.
  job.handles.clear();
  for (const uint32_t r : job.rows) job.handles.push_back(home(r) & ~kOnDisk);
  job.err = disk_->get(job.rows.size(), job.handles.data(), job.into.data(), nullptr);
}

bool HostTable::any_moving(const uint32_t* rows, size_t n) const {
  if (!job_in_flight()) return false;
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] != row::kNoRow && row::bitmap_test(moving_.data(), rows[i])) return true;
  }
  return false;
}

void HostTable::finish_prefetch(const uint32_t* wanted, size_t n_wanted) {
  if (!job_in_flight()) return;
  PrefetchJob job;
  {
    std::unique_lock lock(prefetch_mutex_);
    prefetch_cv_.wait(lock, [&] { return prefetch_.done; });
    job = std::move(prefetch_);
    prefetch_ = PrefetchJob{};
  }
  if (job.rows.empty() && job.down_err == 0) keep_wanted_rows(job, wanted, n_wanted);
  for (const uint32_t r : job.rows) row::bitmap_clear<false>(moving_.data(), r);
  for (const uint32_t r : job.down_rows) row::bitmap_clear<false>(moving_.data(), r);
  const size_t reused = job.rows.size() - job.fresh_frames;
  if (job.down_err < 0) {
    // Nothing moved and nothing was read: the cold rows stay in their frames, the rows to read on
    // disk (the call that needs them reads them itself, and reports the failure if it happens
    // again); the free frames taken go back.
    for (size_t i = reused; i < job.frames.size(); ++i) free_frames_.push_back(job.frames[i]);
    return;
  }
  // The rows written down leave their frames; those the read filled are kept for it.
  finish_move_down(job.down_frames, job.down_handles.data(), job.err < 0 ? 0 : reused);
  if (job.err < 0) {
    for (size_t i = reused; i < job.frames.size(); ++i) free_frames_.push_back(job.frames[i]);
    return;
  }
  if (!job.rows.empty()) finish_move_up(job.rows, job.frames, job.clock);
}

// A write-back leaves its rows' frames intact (nothing is read into them): those the call needs
// stay there, their new slots freed, rather than go down only to be read back.
void HostTable::keep_wanted_rows(PrefetchJob& job, const uint32_t* wanted, size_t n) {
  size_t kept = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint32_t r = wanted[i];
    if (r != row::kNoRow && row::bitmap_test(moving_.data(), r)) {
      row::bitmap_clear<false>(moving_.data(), r);  // marks it: it stays
      ++kept;
    }
  }
  if (kept == 0) return;
  // The rows that go down first, those that stay after (order does not matter: nothing reuses
  // a write-back's frames).
  size_t going = 0;
  for (size_t i = 0; i < job.down_rows.size(); ++i) {
    if (row::bitmap_test(moving_.data(), job.down_rows[i])) {
      std::swap(job.down_rows[i], job.down_rows[going]);
      std::swap(job.down_frames[i], job.down_frames[going]);
      std::swap(job.down_handles[i], job.down_handles[going]);
      ++going;
    }
  }
  {
    std::lock_guard disk_lock(disk_mutex_);
    disk_->free(job.down_handles.size() - going, job.down_handles.data() + going);
  }
  job.down_rows.resize(going);
  job.down_frames.resize(going);
  job.down_handles.resize(going);
}

bool HostTable::stamp_resident(const uint32_t* rows, size_t n) {
  // Three random reads a row (its home, its frame's stamp, its heat), in arrays far larger than
  // the caches: each is asked for ahead of its use, so that the misses overlap. The home a
  // frame's stamp needs is read half as far ahead, once its own fetch has had time.
  constexpr size_t kAhead = 64;
  const auto fetch_row = [&](size_t i) {
    if (i < n && rows[i] != row::kNoRow) {
      __builtin_prefetch(home_.at(rows[i]));
      __builtin_prefetch(heat_.at(rows[i]), 1);
    }
  };
  const auto fetch_stamp = [&](size_t i) {
    if (i >= n || rows[i] == row::kNoRow) return;
    const uint32_t h = home(rows[i]);
    if ((h & kOnDisk) == 0) __builtin_prefetch(&frame_used_[h], 1);
  };
  for (size_t i = 0; i < kAhead; ++i) fetch_row(i);
  for (size_t i = 0; i < kAhead / 2; ++i) fetch_stamp(i);
  up_rows_.clear();
  for (size_t i = 0; i < n; ++i) {
    fetch_row(i + kAhead);
    fetch_stamp(i + kAhead / 2);
    const uint32_t r = rows[i];
    if (r == row::kNoRow) continue;
    const uint32_t h = home(r);
    if ((h & kOnDisk) != 0) {
      up_rows_.push_back(r);
    } else if (frame_used_[h] != use_clock_) {
      frame_used_[h] = use_clock_;
      heat_up(r);
    }
  }
  if (up_rows_.empty()) return false;
  std::sort(up_rows_.begin(), up_rows_.end());
  up_rows_.erase(std::unique(up_rows_.begin(), up_rows_.end()), up_rows_.end());
  for (const uint32_t r : up_rows_) heat_up(r);
  return true;
}

void HostTable::bring_up(const uint32_t* rows, size_t n) {
  if (any_moving(rows, n)) finish_prefetch(rows, n);
  if (!stamp_resident(rows, n)) return;
  make_frames(up_rows_.size());
  move_up(up_rows_);
}

void HostTable::make_frames(uint64_t need) {
  const uint64_t budget = spec().memory_rows;
  if (held_frames() + need <= budget) return;
  // A job in flight is moving rows down: their frames may be all this call needs.
  if (job_in_flight()) {
    finish_prefetch();
    if (held_frames() + need <= budget) return;
  }
  // The rows past the budget, and an eighth of the budget beyond, so that the next calls find
  // room without a pass over the stamps. Fewer than that may be free to go (the call's own rows
  // are spared): then the call runs over the budget (take_frame) until settle().
  move_down_least_used(held_frames() + need - budget + budget / 8, use_clock_);
}

void HostTable::settle() {
  const uint64_t budget = spec().memory_rows;
  try {
    if (held_frames() > budget) move_down_least_used(held_frames() - budget, UINT64_MAX);
    write_back_ahead();
  } catch (...) {
    // The call itself succeeded (or is failing already): its rows stay in memory, over the
    // budget, and the next call that needs room meets the failure again and reports it. A
    // failed move changes nothing, and this runs from destructors too: nothing may escape.
  }
}

// A table that prefetches leaves its moves to its prefetches (a write-back would make the next
// prefetch wait for it); one that does not gets its room made between its calls.
void HostTable::write_back_ahead() {
  const uint64_t budget = spec().memory_rows;
  const uint64_t low = budget / kWriteBackLowFraction;
  if (low == 0 || held_frames() + low <= budget || job_in_flight()) return;
  if (prefetch_clock_ != 0 && use_clock_ <= prefetch_clock_ + 2) return;
  pick_cold_frames(budget / 8, use_clock_ - 1);
  if (!down_frames_.empty()) submit_job({}, down_frames_);
}

void HostTable::move_down_least_used(uint64_t count, uint64_t spare_since) {
  pick_cold_frames(count, spare_since);
  move_down(down_frames_);
}

// Rows used in this call or the one before go last: a prefetch of batch i + 1 runs between
// batch i's lookup and its update, and must not move down the rows that update needs (nor the
// update's settling the rows just prefetched). Among the others, coldest first (a row used in
// one call goes before one used in many, however recent: a pass over the tail of the key space
// does not push the hot rows out), then least recently used; ties: the lowest frame.
void HostTable::pick_cold_frames(uint64_t count, uint64_t spare_since) {
  constexpr uint64_t kClockBits = 54;
  constexpr uint64_t kClockMask = (uint64_t{1} << kClockBits) - 1;
  constexpr uint64_t kRecent = uint64_t{1} << 62;  // above heat (8 bits) and clock
  const bool moving = !prefetch_.down_rows.empty();
  std::vector<std::pair<uint64_t, uint32_t>> candidates;
  for (uint64_t f = 0; f < next_frame_; ++f) {
    const uint32_t r = frame_row_[f];
    if (r == row::kNoRow || frame_used_[f] >= spare_since) continue;
    if (moving && row::bitmap_test(moving_.data(), r)) continue;  // a prefetch writes it down
    const uint64_t recent = frame_used_[f] + 1 >= use_clock_ ? kRecent : 0;
    const uint64_t order =
        recent | uint64_t{*heat_.at(r)} << kClockBits | (frame_used_[f] & kClockMask);
    candidates.emplace_back(order, static_cast<uint32_t>(f));
  }
  if (candidates.size() > count) {
    std::nth_element(candidates.begin(), candidates.begin() + count, candidates.end());
    candidates.resize(count);
  }
  down_frames_.clear();
  for (const auto& c : candidates) down_frames_.push_back(c.second);
  std::sort(down_frames_.begin(), down_frames_.end());
}

uint32_t HostTable::take_frame() {
  if (!free_frames_.empty()) {
    const uint32_t f = free_frames_.back();
    free_frames_.pop_back();
    return f;
  }
  if (next_frame_ == frame_capacity_) reserve_frames(next_frame_ + 1);
  return static_cast<uint32_t>(next_frame_++);
}

void HostTable::place_in_frame(uint32_t r, uint32_t f) {
  frame_row_[f] = r;
  frame_used_[f] = use_clock_;
  ++resident_;
}

void HostTable::place_new_row(uint32_t r) {
  const uint32_t f = take_frame();
  set_home(r, f);
  place_in_frame(r, f);
  *heat_.at(r) = 0;  // a reused row id forgets its old row's heat
  heat_up(r);
}

void HostTable::heat_up(uint32_t r) {
  uint8_t& heat = *heat_.at(r);
  if (heat < UINT8_MAX) ++heat;
  if (++heat_count_ >= kHeatPeriodBudgets * spec().memory_rows) cool_all();
}

void HostTable::cool_all() {
  heat_count_ = 0;
  const uint64_t rows = next_row_;
  for (uint32_t c = 0; c < chunks_ && row::arena_capacity(c, arena_.base_shift) < rows; ++c) {
    const uint64_t first = row::arena_capacity(c, arena_.base_shift);
    const uint64_t n = std::min(row::chunk_rows(c, arena_.base_shift), rows - first);
    uint8_t* heat = heat_.chunks[c];
    for (uint64_t i = 0; i < n; ++i) heat[i] >>= 1;
  }
}

// Frame chunks double as the arena's row chunks do (frames never move). The bookkeeping grows
// first and a chunk counts only once it is there: a failed allocation leaves the frames as
// they were.
void HostTable::reserve_frames(uint64_t frames) {
  while (frame_capacity_ < frames) {
    if (frame_chunks_ == row::kMaxChunks) {
      fail(EMBSTORE_OUT_OF_MEMORY, "table '{}': the frame arena is at its limit", spec().name);
    }
    const uint64_t n = row::chunk_rows(frame_chunks_, arena_.base_shift);
    const uint64_t capacity = row::arena_capacity(frame_chunks_ + 1, arena_.base_shift);
    frame_row_.resize(capacity, row::kNoRow);
    frame_used_.resize(capacity, 0);
    free_frames_.reserve(capacity);
    value_chunks_.reserve(frame_chunks_ + 1);
    HostBuffer values(n * arena_.stride * sizeof(float));
    arena_.values[frame_chunks_] = values.as<float>();
    value_chunks_.push_back(std::move(values));
    ++frame_chunks_;
    frame_capacity_ = capacity;
  }
}

// Room for n more frames (free ones first; free_frames_ always has capacity for every frame), so
// that take_frame cannot fail.
void HostTable::reserve_frames_for(uint64_t n) {
  const uint64_t free = free_frames_.size();
  if (n > free) reserve_frames(next_frame_ + (n - free));
}

// disk_row_ entries for the handles of n rows put now, and of the rows a prefetch in flight puts
// (before or after them): finish_move_down must not allocate.
void HostTable::reserve_disk_rows(uint64_t n) {
  const uint64_t per_page = disk_->rows_per_page();
  const auto pages_for = [&](uint64_t rows) { return (rows + per_page - 1) / per_page; };
  // The prefetch thread may be growing the file, and the drain reads disk_row_: the lock.
  std::lock_guard disk_lock(disk_mutex_);
  const uint64_t handles =
      (disk_->file_pages() + pages_for(n) + pages_for(prefetch_.down_frames.size())) * per_page;
  if (disk_row_.size() < handles)
    disk_row_.resize(std::max<uint64_t>(handles, disk_row_.size() * 2));
}

// Writes the rows of `frames` to fresh disk slots, then points their homes there and frees the
// frames. A captured row goes to the snapshot first.
void HostTable::move_down(std::vector<uint32_t>& frames) {
  if (frames.empty()) return;
  const size_t n = frames.size();
  copy_out_before_move(frames);  // first, as in submit_job
  reserve_disk_rows(n);
  row_ptrs_.resize(n);
  handles_.resize(n);
  for (size_t i = 0; i < n; ++i) row_ptrs_[i] = reinterpret_cast<char*>(arena_.row(frames[i]));
  {
    std::lock_guard disk_lock(disk_mutex_);
    std::string detail;
    if (int r = disk_->put(n, row_ptrs_.data(), handles_.data(), &detail); r < 0) {
      fail_tier(r, "moving rows down to", detail);
    }
    if (*std::max_element(handles_.begin(), handles_.end()) >= kMaxHandle) {
      disk_->free(n, handles_.data());
      fail(EMBSTORE_OUT_OF_MEMORY, "table '{}': the SSD tier is at its limit of {} row slots",
           spec().name, kMaxHandle);
    }
  }
  finish_move_down(frames, handles_.data(), 0);
}

void HostTable::copy_out_before_move(const std::vector<uint32_t>& frames) {
  if (captured_left_.load() == 0 || frames.empty()) return;
  cow_rows_.clear();
  cow_rows_.reserve(frames.size());
  for (const uint32_t f : frames) take_for_copy(frame_row_[f]);
  copy_out_taken();  // also waits for a drain copying one of them from its frame
}

void HostTable::finish_move_down(const std::vector<uint32_t>& frames, const uint64_t* handles,
                                 size_t keep) {
  std::lock_guard disk_lock(disk_mutex_);
  for (size_t i = 0; i < frames.size(); ++i) {
    const uint32_t f = frames[i];
    const uint32_t r = frame_row_[f];
    disk_row_[handles[i]] = r;
    set_home(r, kOnDisk | static_cast<uint32_t>(handles[i]));
    frame_row_[f] = row::kNoRow;
    if (i >= keep) free_frames_.push_back(f);
  }
  resident_ -= frames.size();
  moved_down_ += frames.size();
}

// Reads `rows` (on disk, distinct) into frames, then finish_move_up. Frames come from
// make_frames (called before) or grow past the budget.
void HostTable::move_up(const std::vector<uint32_t>& rows) {
  const size_t n = rows.size();
  std::vector<uint32_t> frames(n);
  reserve_frames_for(n);  // take_frame cannot fail now
  cow_rows_.reserve(n);
  for (size_t i = 0; i < n; ++i) frames[i] = take_frame();
  row_ptrs_.resize(n);
  handles_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    row_ptrs_[i] = reinterpret_cast<char*>(arena_.row(frames[i]));
    handles_[i] = home(rows[i]) & ~kOnDisk;
  }
  {
    std::lock_guard disk_lock(disk_mutex_);
    std::string detail;
    if (int r = disk_->get(n, handles_.data(), row_ptrs_.data(), &detail); r < 0) {
      for (const uint32_t f : frames) free_frames_.push_back(f);
      fail_tier(r, "reading rows from", detail);
    }
  }
  finish_move_up(rows, frames, use_clock_);
}

void HostTable::finish_move_up(const std::vector<uint32_t>& rows,
                               const std::vector<uint32_t>& frames, uint64_t clock) {
  const size_t n = rows.size();
  cow_rows_.reserve(n);
  handles_.resize(n);
  {
    std::lock_guard disk_lock(disk_mutex_);
    for (size_t i = 0; i < n; ++i) {
      handles_[i] = home(rows[i]) & ~kOnDisk;
      set_home(rows[i], frames[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) {
    place_in_frame(rows[i], frames[i]);
    frame_used_[frames[i]] = clock;
  }
  moved_up_ += n;
  if (captured_left_.load() > 0) {
    // Their values are still those of the capture: written now, from the frames.
    cow_rows_.clear();
    for (const uint32_t r : rows) take_for_copy(r);
    copy_out_taken();  // also waits for a drain copying one of them from disk (no disk read)
  }
  std::lock_guard disk_lock(disk_mutex_);
  disk_->free(n, handles_.data());
  compact_disk();
}

// Under disk_mutex_. Compaction is an optimization: when it fails, every row stays where it was.
// disk_row_ is sized for every handle it can report first: once it returns, the old handles are
// dead, and applying the moves must not fail.
// Not while a job is in flight: the rows it writes down are in slots no home names yet.
void HostTable::compact_disk() {
  if (job_in_flight()) return;
  const uint64_t per_page = disk_->rows_per_page();
  const uint64_t handles = (disk_->file_pages() + kCompactMaxPages + 1) * per_page;
  try {
    if (disk_row_.size() < handles) disk_row_.resize(handles);
    compact_moves_.clear();
    compact_moves_.reserve(disk_->pages_in_use() * per_page);
  } catch (const std::bad_alloc&) {
    return;
  }
  std::string detail;
  if (disk_->compact(&compact_moves_, &detail) < 0) return;
  for (const auto& [from, to] : compact_moves_) {
    const uint32_t r = disk_row_[from];
    disk_row_[to] = r;
    set_home(r, kOnDisk | static_cast<uint32_t>(to));
  }
}

void HostTable::release_homes(const std::vector<uint32_t>& rows) {
  handles_.clear();
  for (const uint32_t r : rows) {  // reserved by the caller (reserve_release)
    const uint32_t h = home(r);
    if ((h & kOnDisk) != 0) {
      handles_.push_back(h & ~kOnDisk);
    } else {
      frame_row_[h] = row::kNoRow;
      free_frames_.push_back(h);
      --resident_;
    }
  }
  if (handles_.empty()) return;
  std::lock_guard disk_lock(disk_mutex_);
  disk_->free(handles_.size(), handles_.data());
}

void HostTable::reserve_release(size_t n) { handles_.reserve(n); }

const uint32_t* HostTable::frames_of(const uint32_t* rows, size_t n) {
  if (!tiered_) return rows;
  frames_scratch_.resize(n);
  for (size_t i = 0; i < n; ++i)
    frames_scratch_[i] = rows[i] == row::kNoRow ? row::kNoRow : home(rows[i]);
  return frames_scratch_.data();
}

// On the training thread, the only writer of home_: only the disk needs the lock.
const float* const* HostTable::stage_for_copy(const std::vector<uint32_t>& rows) {
  const uint32_t stride = spec().stride();
  cow_values_.resize(rows.size());
  if (!tiered_) {
    for (size_t k = 0; k < rows.size(); ++k) cow_values_[k] = arena_.row(rows[k]);
    return cow_values_.data();
  }
  cow_homes_.clear();
  for (const uint32_t r : rows) {
    if (const uint32_t h = home(r); (h & kOnDisk) != 0) cow_homes_.push_back(h);
  }
  cow_scratch_.resize(cow_homes_.size() * size_t{stride});
  if (!cow_homes_.empty()) {
    std::lock_guard disk_lock(disk_mutex_);
    try {
      read_disk_rows(cow_homes_.size(), cow_homes_.data(), cow_scratch_.data());
    } catch (const Error&) {
      copy_failed_.store(true);
      throw;
    }
  }
  size_t on_disk = 0;
  for (size_t k = 0; k < rows.size(); ++k) {
    const uint32_t h = home(rows[k]);
    cow_values_[k] =
        (h & kOnDisk) != 0 ? cow_scratch_.data() + on_disk++ * size_t{stride} : arena_.row(h);
  }
  return cow_values_.data();
}

void HostTable::read_disk_rows(size_t n, const uint32_t* homes, float* out) {
  handles_for_read_.resize(n);
  read_ptrs_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    handles_for_read_[i] = homes[i] & ~kOnDisk;
    read_ptrs_[i] = reinterpret_cast<char*>(out + i * size_t{spec().stride()});
  }
  std::string detail;
  if (int err = disk_->get(n, handles_for_read_.data(), read_ptrs_.data(), &detail); err < 0) {
    fail_tier(err, "reading rows for a checkpoint from", detail);
  }
}

// On the training thread, the only writer of home_. The drain reads the disk with the same
// handle lists (read_disk_rows): they are filled under disk_mutex_ too.
void HostTable::read_records(const std::vector<uint32_t>& rows, float* records) {
  const size_t stride = spec().stride();
  std::unique_lock<std::mutex> disk_lock(disk_mutex_, std::defer_lock);
  if (tiered_) disk_lock.lock();
  handles_for_read_.clear();
  read_ptrs_.clear();
  for (size_t i = 0; i < rows.size(); ++i) {
    float* dst = records + i * stride;
    const uint32_t h = frame_of(rows[i]);
    if (tiered_ && (h & kOnDisk) != 0) {
      handles_for_read_.push_back(h & ~kOnDisk);
      read_ptrs_.push_back(reinterpret_cast<char*>(dst));
    } else {
      std::memcpy(dst, arena_.row(h), stride * sizeof(float));
    }
  }
  if (handles_for_read_.empty()) return;
  std::string detail;
  if (int err = disk_->get(handles_for_read_.size(), handles_for_read_.data(), read_ptrs_.data(),
                           &detail);
      err < 0) {
    fail_tier(err, "reading rows from", detail);
  }
}

}  // namespace embstore::host_backend
