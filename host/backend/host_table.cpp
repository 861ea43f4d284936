// The host backend: tables in host memory, parallel over the store's thread pool, built from
// the same per-row logic (cuda/row/) that the CUDA kernels run.
#include <sys/mman.h>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/grad_sum.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"
#include "cuda/row/snapshot.h"
#include "host/backend/backends.hpp"
#include "host/backend/host_buffer.hpp"
#include "host/error.hpp"
#include "host/store/thread_pool.hpp"
#include "host/table/key_ledger.hpp"
#include "io/format/xxh3.hpp"

namespace embstore {
namespace {

// Keys are independent, so batches split into parts of this many keys or rows.
constexpr size_t kGrain = 4096;
// How many keys ahead the probe and copy loops prefetch: enough to cover a memory latency.
constexpr size_t kAhead = 16;
constexpr uint32_t kEnd = 0xFFFFFFFFu;
constexpr uint64_t kNoSlot = ~uint64_t{0};
// A restore's blocks hold about 1 MiB of rows (2,000 of dim 64 with Adagrad): load_rows splits
// them finer than training batches.
constexpr size_t kLoadGrain = 256;
// reserve() leaves room for this many rows more than asked: about two restore blocks.
constexpr uint64_t kLoadHeadroom = 4096;
// prefault_initial_capacity() starts a thread only for more rows up front than this.
constexpr uint64_t kPrefaultAtCreateRows = 1 << 16;

// Rows of a batch whose output exceeds the caches are written with streaming stores: the
// output cannot stay cached anyway, and this saves reading every destination line first.
constexpr size_t kStreamingOutputBytes = size_t{8} << 20;

template <bool Streaming>
void copy_row(float* dst, const float* src, uint32_t dim) {
#if defined(__SSE2__)
  if constexpr (Streaming) {  // dst is 16-byte aligned and dim a multiple of 4
    for (uint32_t c = 0; c < dim; c += 4) {
      _mm_stream_ps(dst + c, src ? _mm_loadu_ps(src + c) : _mm_setzero_ps());
    }
    return;
  }
#endif
  if (src) {
    std::memcpy(dst, src, dim * sizeof(float));
  } else {
    std::memset(dst, 0, dim * sizeof(float));
  }
}

void prefetch_row(const float* row, uint32_t floats) {
  const char* p = reinterpret_cast<const char*>(row);
  const char* end = p + size_t{floats} * sizeof(float);
  for (; p < end; p += 64) __builtin_prefetch(p);
}

class HostTable final : public Table {
 public:
  HostTable(TableSpec spec, ThreadPool& pool)
      : Table(std::move(spec)), pool_(pool), ledger_(this->spec()) {
    arena_.base_shift = row::base_shift_for(this->spec().initial_capacity);
    arena_.dim = this->spec().dim;
    arena_.stride = this->spec().stride();
    reserve_rows(this->spec().initial_capacity);
  }

  // On a thread of its own while training starts: the kernel zeroes each page at its first
  // touch, which otherwise lands in the inserting lookups of the first steps (bench-peers' DLRM
  // step on 2 cores, 4 tables of 1M rows up front: 10-15% more steps/s over 120 steps after 20
  // of warm-up). Where the kernel cannot (before Linux 5.14), pages arrive on first touch.
  void prefault_initial_capacity() override {
    std::lock_guard lock(mutex_);
    if (spec().initial_capacity > kPrefaultAtCreateRows) {
      (void)prefaulter_.start(row_ranges(0, spec().initial_capacity));
    }
  }

  void lookup(const int64_t* keys, size_t n, float* out, bool insert, uint64_t step,
              void*) override {
    std::lock_guard lock(mutex_);
    rows_scratch_.resize(n);
    uint32_t* rows = rows_scratch_.data();
    find_rows(keys, n, rows);
    pending_pos_.clear();
    if (insert) insert_missing(keys, n, rows, step);
    const uint32_t dim = spec().dim;
    const bool streaming = n * dim * sizeof(float) >= kStreamingOutputBytes && dim % 4 == 0 &&
                           reinterpret_cast<uintptr_t>(out) % 16 == 0;
    streaming ? copy_rows<true>(rows, n, out) : copy_rows<false>(rows, n, out);
    if (!pending_pos_.empty()) read_pending(keys, out);
  }

  void apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                       void*) override {
    std::lock_guard lock(mutex_);
    rows_scratch_.resize(n);
    uint32_t* rows = rows_scratch_.data();
    find_rows(keys, n, rows);
    group_by_row(rows, n, dirty_tracking_);
    if (captured_left_.load() > 0) {
      cow_rows_.clear();
      for (const Group& g : groups_) take_for_copy(g.row);
      copy_out_taken();
    }
    row::dispatch_opt(spec().opt.kind,
                      [&](auto kind) { update_groups<decltype(kind)::value>(grads, step); });
  }

  TableCounters counters() override {
    std::lock_guard lock(mutex_);
    TableCounters c;
    c.rows = rows_;
    c.capacity = row::arena_capacity(chunks_, arena_.base_shift);
    c.dirty_rows = row::bitmap_count(dirty_.data(), 0, dirty_.size());
    c.inserted = inserted_;
    c.evicted = ledger_.evicted_total();
    c.skipped_keys = skipped_;
    c.admitted = admitted_;
    c.pending_admission = ledger_.pending_admission();
    return c;
  }

  void set_dirty_tracking(bool on) override {
    std::lock_guard lock(mutex_);
    dirty_tracking_ = on;
  }

  uint64_t capture(bool full, SnapshotSink* sink, uint64_t* live_rows) override {
    std::lock_guard lock(mutex_);
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
    *live_rows = rows_;
    return taken;
  }

  // Drain runs without the table's lock, beside training calls. A row is written by whoever
  // takes its captured bit: drain (a few rows of a word at a time) or a training call's
  // copy-on-write. A call that finds the bit of a row it updates already gone must not write
  // the row while drain may still be copying it, so drain makes drain_copying_ odd for the
  // duration of each take-and-copy, and the call waits for it to move on (see
  // wait_for_drain_copy). The bitmap's size and every captured row stay put: the captured
  // bitmap is not resized during a snapshot, and rows never move.
  uint64_t drain(SnapshotSink* sink, uint64_t max_rows) override {
    const uint32_t stride = spec().stride();
    const uint64_t record = row::record_bytes(stride);
    const uint64_t words = captured_.size();
    uint64_t budget = std::min(max_rows, captured_left_.load());
    while (budget > 0 && drain_word_ < words) {
      if (row::atomic_load(&captured_[drain_word_]) == 0) {
        ++drain_word_;  // copy-on-write only clears bits, so it stays empty
        continue;
      }
      uint64_t granted = 0;
      char* out = sink->reserve(std::min<uint64_t>(budget, 64), false, &granted);
      if (out == nullptr) break;  // staging is full
      drain_copying_.fetch_add(1);
      uint64_t taken = row::take_captured_rows(captured_.data(), drain_word_, granted);
      uint64_t filled = 0;
      for (; taken != 0; taken &= taken - 1, ++filled) {
        const uint64_t r = drain_word_ * 64 + static_cast<uint64_t>(__builtin_ctzll(taken));
        row::write_record(out + filled * record, arena_.row_meta(r)->key, arena_.row(r), stride);
      }
      // After the copies: a call that reads captured_left_ as 0 skips the wait.
      captured_left_.fetch_sub(filled);
      drain_copying_.fetch_add(1);
      sink->commit(filled);
      budget -= std::min(budget, filled);
    }
    sink->flush();
    return captured_left_.load();
  }

  const std::vector<int64_t>& evicted_at_capture() const override {
    return ledger_.evicted_at_capture();
  }

  std::optional<io::AdmissionFile> admission_at_capture() const override {
    return ledger_.admission_at_capture();
  }

  void end_snapshot(bool failed) override {
    std::lock_guard lock(mutex_);
    if (failed) {
      for (size_t w = 0; w < snapshot_set_.size(); ++w) {
        row::restore_dirty_word(dirty_.data(), snapshot_set_.data(), w, freed_[w]);
      }
    }
    ledger_.end_snapshot(failed);
    captured_.clear();
    snapshot_set_.clear();
    captured_left_.store(0);
    sink_ = nullptr;
  }

  void reserve(uint64_t rows) override {
    std::lock_guard lock(mutex_);
    const uint64_t limit = row::row_limit(spec().max_capacity);
    rows = std::min(rows, limit > rows_ ? limit - rows_ : 0);  // a load past it fails anyway
    // Room beyond: load_rows inserts a block in parallel only while the whole block would fit.
    reserve_rows(std::min(next_row_ + rows + kLoadHeadroom, uint64_t{row::kMaxRows}));
    // The rows' memory is faulted in behind the caller's back while it loads; where that
    // cannot be, before it returns.
    if (!prefaulter_.start(row_ranges(next_row_, next_row_ + rows))) {
      populate_rows(next_row_, next_row_ + rows);
    }
  }

  bool skips_held_keys() const override { return true; }

  void load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                 uint64_t step, bool skip_held) override {
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
    // The index first, then the copies on the pool's threads. A key the table holds
    // (skip_held), or a repeat of a key in the input (a corrupt file; the first copy is kept),
    // gets no row here. Rows get ids in input order, as a serial insert gives.
    rows_scratch_.resize(n);
    uint32_t* rows = rows_scratch_.data();
    const bool parallel = pool_.size() > 1 && n >= 2 * kLoadGrain && free_rows_.empty() &&
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
    const uint32_t dim = spec().dim;
    const uint32_t state_dim = spec().state_dim();
    const row::ArenaRef arena = arena_;
    const row::IndexRef index = index_;
    const uint64_t* claimed = parallel ? load_slots_.data() : nullptr;
    pool_.parallel_for(n, kLoadGrain, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        const uint32_t r = rows[i];
        if (r == row::kNoRow) continue;
        // A slot claimed by load_index_parallel gets its row now: distinct slots, no race.
        if (claimed != nullptr && claimed[i] != kNoSlot) index.slots[claimed[i]].row = r;
        *arena.row_meta(r) = row::RowMeta{keys[i], step};
        float* dst = arena.row(r);
        std::memcpy(dst, values + i * dim, dim * sizeof(float));
        if (state_dim > 0) {
          std::memcpy(dst + dim, state + i * state_dim, state_dim * sizeof(float));
        }
      }
    });
  }

  bool can_spill() const override { return true; }

  void spill(SpillFile& file) override {
    std::lock_guard lock(mutex_);
    prefaulter_.stop();
    // The rows in use of each chunk (rows never move: an arena chunk's rows start at its
    // start), values then metadata; memory given back only once all of it is on the disk.
    std::vector<SpilledChunk> parts;
    const uint64_t stride_bytes = uint64_t{arena_.stride} * sizeof(float);
    uint64_t chunk_first = 0;
    for (uint32_t c = 0; c < chunks_ && chunk_first < next_row_; ++c) {
      const uint64_t chunk_rows = row::chunk_rows(c, arena_.base_shift);
      const uint64_t rows = std::min(next_row_ - chunk_first, chunk_rows);
      SpilledChunk part{c,
                        spill_span(value_chunks_[c], rows * stride_bytes),
                        spill_span(meta_chunks_[c], rows * sizeof(row::RowMeta)),
                        0,
                        0,
                        0,
                        0};
      part.values_xxh3 = XXH3_64bits(value_chunks_[c].as<char>(), part.value_bytes);
      part.meta_xxh3 = XXH3_64bits(meta_chunks_[c].as<char>(), part.meta_bytes);
      check_spill(file.append(value_chunks_[c].as<char>(), part.value_bytes, &part.values_at),
                  "write");
      check_spill(file.append(meta_chunks_[c].as<char>(), part.meta_bytes, &part.meta_at), "write");
      parts.push_back(part);
      chunk_first += chunk_rows;
    }
    check_spill(file.settle(), "write");
    for (const SpilledChunk& p : parts) {
      value_chunks_[p.chunk].discard();
      meta_chunks_[p.chunk].discard();
    }
    spilled_ = std::move(parts);
  }

  void unspill(SpillFile& file) override {
    std::lock_guard lock(mutex_);
    for (const SpilledChunk& p : spilled_) {
      check_spill(file.read(value_chunks_[p.chunk].as<char>(), p.value_bytes, p.values_at),
                  "read back");
      check_spill(file.read(meta_chunks_[p.chunk].as<char>(), p.meta_bytes, p.meta_at),
                  "read back");
      // The disk gave back what it was given, or the restore says the rows are lost.
      if (XXH3_64bits(value_chunks_[p.chunk].as<char>(), p.value_bytes) != p.values_xxh3 ||
          XXH3_64bits(meta_chunks_[p.chunk].as<char>(), p.meta_bytes) != p.meta_xxh3) {
        check_spill(-EBADMSG, "read back (checksum mismatch)");
      }
    }
    spilled_.clear();
  }

  bool load_admission(const io::AdmissionFile& counts, std::string* why) override {
    std::lock_guard lock(mutex_);
    const row::IndexRef index = index_;
    return ledger_.load_admission(counts, why,
                                  [&](int64_t key) { return index.find(key) != row::kNoRow; });
  }

 private:
  // Copy-on-write of rows about to change (updated or evicted) while a snapshot is in
  // progress: take_for_copy each row (cow_rows_ cleared first) collects the captured ones,
  // then copy_out_taken writes them to the sink.
  void take_for_copy(uint32_t r) {
    // Rows past the captured bitmap were never captured.
    if (r < captured_.size() * 64 && row::take_captured<true>(captured_.data(), r)) {
      cow_rows_.push_back(r);
    }
  }

  void copy_out_taken() {
    const std::vector<uint32_t>& rows = cow_rows_;
    const uint32_t stride = spec().stride();
    const uint64_t record = row::record_bytes(stride);
    wait_for_drain_copy();
    size_t done = 0;
    while (done < rows.size()) {
      uint64_t granted = 0;
      char* out = sink_->reserve(rows.size() - done, true, &granted);
      if (out == nullptr) break;  // the snapshot was aborted
      for (uint64_t k = 0; k < granted; ++k) {
        const uint32_t r = rows[done + k];
        row::write_record(out + k * record, arena_.row_meta(r)->key, arena_.row(r), stride);
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

  // A training lookup touches the rows it finds (they must not be evicted to make room for
  // the keys beside them). Duplicates store the same value, hence relaxed atomics.
  void touch_rows(const uint32_t* rows, size_t n, uint64_t step) {
    const row::ArenaRef arena = arena_;
    pool_.parallel_for(n, kGrain, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        if (rows[i] != row::kNoRow) {
          __atomic_store_n(&arena.row_meta(rows[i])->step, step, __ATOMIC_RELAXED);
        }
      }
    });
  }

  // The key's row, or a new one (a freed row first, else the next fresh one; *fresh tells
  // which) placed in the index. The caller fills a new row.
  uint32_t find_or_add_row(int64_t key, bool* added) {
    const bool reuse = !free_rows_.empty();
    if (!reuse && next_row_ == room_) reserve_rows(next_row_ + 1);  // doubles arena or index
    const uint32_t candidate = reuse ? free_rows_.back() : static_cast<uint32_t>(next_row_);
    bool inserted = false;
    const uint32_t r = index_.find_or_insert_serial(key, candidate, &inserted);
    if (inserted) {
      if (reuse) {
        free_rows_.pop_back();
        row::bitmap_clear<false>(freed_.data(), r);
      } else {
        ++next_row_;
      }
      ++rows_;
      arena_.row_meta(r)->key = key;
    }
    if (added != nullptr) *added = inserted;
    return r;
  }

  // Evicts `victims` (live rows, each once): written to a snapshot in progress first, then
  // their keys leave the index and the rows go to the free list.
  void evict_rows(std::vector<uint32_t>& victims) {
    if (victims.empty()) return;
    if (captured_left_.load() > 0) {
      cow_rows_.clear();
      for (const uint32_t r : victims) take_for_copy(r);
      copy_out_taken();
    }
    // Room first: past this point nothing can fail.
    free_rows_.reserve(free_rows_.size() + victims.size());
    ledger_.reserve_evicted(victims.size());
    for (const uint32_t r : victims) {
      const int64_t key = arena_.row_meta(r)->key;
      index_.erase_serial(key);
      row::release_row<false>(dirty_.data(), freed_.data(), r);
      free_rows_.push_back(r);
      ledger_.evicted(&key, 1);
    }
    rows_ -= victims.size();
  }

 public:
  uint64_t evict_before(uint64_t cutoff_step) override {
    std::lock_guard lock(mutex_);
    victims_.clear();
    for_each_candidate(cutoff_step, nullptr, [&](uint32_t r, uint64_t) { victims_.push_back(r); });
    evict_rows(victims_);
    ledger_.forget_before(cutoff_step);
    return victims_.size();
  }

 private:
  // f(row, its last-touched step) for every row that an eviction with cutoff `before` may take
  // (row::evictable; spared may be null).
  template <typename F>
  void for_each_candidate(uint64_t before, const uint64_t* spared, F&& f) const {
    for (uint64_t r = 0; r < next_row_; ++r) {
      const uint64_t s = arena_.row_meta(r)->step;
      if (row::evictable(freed_.data(), spared, r, s, before)) f(static_cast<uint32_t>(r), s);
    }
  }

  // Evicts the `need` least recently used rows touched before `step` (ties: the lowest row),
  // sparing the n `reading` rows of the call that needs the room (kNoRow entries skipped), or
  // throws CAPACITY_EXCEEDED, evicting nothing, when fewer are there. Two passes over the
  // rows' stamps and no sort of the table: a histogram of the stamps finds the step below
  // which every row goes, and only the rows of the boundary step range are ordered.
  void make_room(uint64_t need, uint64_t step, const uint32_t* reading, size_t n) {
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
    if (candidates < need) fail_no_room(spec(), need, candidates, step);
    constexpr uint64_t kBuckets = 4096;
    const uint64_t width = (step - oldest + kBuckets - 1) / kBuckets;
    std::vector<uint64_t> histogram(kBuckets, 0);
    for_each_candidate(step, spared,
                       [&](uint32_t, uint64_t s) { ++histogram[(s - oldest) / width]; });
    uint64_t boundary = 0, below = 0;  // every row of the buckets below `boundary` goes
    while (below + histogram[boundary] < need) below += histogram[boundary++];
    const uint64_t lo = oldest + boundary * width, hi = lo + width;
    victims_.clear();
    std::vector<std::pair<uint64_t, uint32_t>> edge;  // (step, row) in [lo, hi)
    for_each_candidate(step, spared, [&](uint32_t r, uint64_t s) {
      if (s < lo) {
        victims_.push_back(r);
      } else if (s < hi) {
        edge.emplace_back(s, r);
      }
    });
    const size_t rest = need - victims_.size();
    std::nth_element(edge.begin(), edge.begin() + rest, edge.end());
    for (size_t i = 0; i < rest; ++i) victims_.push_back(edge[i].second);
    evict_rows(victims_);
  }

  // Waits while drain may be copying a row that this call found already taken: drain takes
  // and copies with drain_copying_ odd, so a take that preceded this call's is finished once
  // the counter has moved on from the odd value read after this call's takes.
  void wait_for_drain_copy() {
    const uint64_t seen = drain_copying_.load();
    if ((seen & 1) == 0) return;
    for (int spin = 0; drain_copying_.load() == seen; ++spin) {
      if (spin >= 64) std::this_thread::yield();  // drain's thread may be off its core
    }
  }

  template <bool Streaming>
  void copy_rows(const uint32_t* rows, size_t n, float* out) {
    const uint32_t dim = spec().dim;
    const row::ArenaRef arena = arena_;
    pool_.parallel_for(n, kGrain, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        if (i + kAhead < end && rows[i + kAhead] != row::kNoRow) {
          prefetch_row(arena.row(rows[i + kAhead]), dim);
        }
        copy_row<Streaming>(out + i * dim, rows[i] == row::kNoRow ? nullptr : arena.row(rows[i]),
                            dim);
      }
#if defined(__SSE2__)
      if constexpr (Streaming) _mm_sfence();  // streaming stores are weakly ordered
#endif
    });
  }

  void find_rows(const int64_t* keys, size_t n, uint32_t* rows) {
    const row::IndexRef index = index_;
    pool_.parallel_for(n, kGrain, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) {
        if (i + kAhead < end) __builtin_prefetch(&index.slots[index.home(keys[i + kAhead])]);
        rows[i] = index.find(keys[i]);
      }
    });
  }

  // Gives each missing admitted key one new row, in order of first appearance; the positions
  // of keys still pending go to pending_pos_. On a table that evicts, the rows found are
  // touched. Either every new row fits under the row limit or nothing is inserted or touched
  // (the keys stay counted).
  void insert_missing(const int64_t* keys, size_t n, uint32_t* rows, uint64_t step) {
    missing_pos_.clear();
    for (size_t i = 0; i < n; ++i) {
      if (rows[i] == row::kNoRow) missing_pos_.push_back(static_cast<uint32_t>(i));
    }
    if (AdmissionCounter* admission = ledger_.admission()) {
      // Every occurrence counts, in batch order; the positions of admitted keys stay.
      size_t kept = 0;
      for (const uint32_t i : missing_pos_) {
        if (admission->count(keys[i], step)) {
          missing_pos_[kept++] = i;
        } else {
          pending_pos_.push_back(i);
        }
      }
      missing_pos_.resize(kept);
    }
    const uint64_t missing = missing_pos_.size();
    if (missing == 0) {
      if (spec().evicts()) touch_rows(rows, n, step);
      return;
    }
    const uint64_t limit = row::row_limit(spec().max_capacity);
    if (rows_ + missing > limit) {
      // Near the limit only: count distinct new keys exactly (duplicates share a row), and
      // make room for them when the table evicts.
      missing_keys_.clear();
      for (const uint32_t i : missing_pos_) missing_keys_.push_back(keys[i]);
      std::sort(missing_keys_.begin(), missing_keys_.end());
      const uint64_t fresh =
          std::unique(missing_keys_.begin(), missing_keys_.end()) - missing_keys_.begin();
      if (rows_ + fresh > limit) {
        if (!spec().evicts()) fail_over_limit(spec(), fresh, rows_, "new rows", "inserted");
        make_room(rows_ + fresh - limit, step, rows, n);
      }
    }
    // Only once there is room: a refused call touches nothing.
    if (spec().evicts()) touch_rows(rows, n, step);

    const uint64_t fresh_from = next_row_;  // rows from here on were never used: zero pages
    new_rows_.clear();
    for (size_t j = 0; j < missing; ++j) {
      if (j + kAhead < missing) {
        __builtin_prefetch(&index_.slots[index_.home(keys[missing_pos_[j + kAhead]])]);
      }
      const size_t i = missing_pos_[j];
      bool added = false;
      rows[i] = find_or_add_row(keys[i], &added);
      if (added) new_rows_.push_back(rows[i]);
    }
    inserted_ += new_rows_.size();
    admitted_ += new_rows_.size();
    if (AdmissionCounter* admission = ledger_.admission()) {
      for (const uint32_t r : new_rows_) admission->admitted(arena_.row_meta(r)->key);
    }

    const TableSpec& s = spec();
    const row::ArenaRef arena = arena_;
    uint64_t* dirty = dirty_.data();
    const uint32_t* new_rows = new_rows_.data();
    const bool concurrent = pool_.size() > 1;
    const bool zero_state = row::initial_state_is_zero(s.opt);
    pool_.parallel_for(new_rows_.size(), kGrain, [&](size_t begin, size_t end) {
      for (size_t k = begin; k < end; ++k) {
        const uint32_t r = new_rows[k];
        row::RowMeta* meta = arena.row_meta(r);
        float* values = arena.row(r);
        row::init_row(s.init, meta->key, s.dim, values);
        if (!zero_state || r < fresh_from) row::init_state(s.opt, s.dim, values + s.dim);
        meta->step = step;
        concurrent ? row::bitmap_set<true>(dirty, r) : row::bitmap_set<false>(dirty, r);
      }
    });
  }

  // Pending keys read the values their row would start with.
  void read_pending(const int64_t* keys, float* out) {
    const row::InitParams init = spec().init;
    const uint32_t dim = spec().dim;
    const uint32_t* pos = pending_pos_.data();
    pool_.parallel_for(pending_pos_.size(), kGrain, [&](size_t begin, size_t end) {
      for (size_t k = begin; k < end; ++k) {
        row::init_row(init, keys[pos[k]], dim, out + size_t{pos[k]} * dim);
      }
    });
  }

  // Positions of each row in batch order: groups_[g] = {row, first, last, count}, next_[i] = the
  // next position of the same row. Keys without a row are counted and left out. With `mark`, each
  // row's dirty bit is set here, in the serial pass that meets every updated row, rather than by
  // the parallel update workers: a plain OR instead of atomics and cache lines passed between
  // cores. The update follows in the same call under the table lock, so nothing can observe the bit
  // before the row is written.
  void group_by_row(const uint32_t* rows, size_t n, bool mark) {
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
  void update_groups(const float* grads, uint64_t step) {
    const uint32_t dim = spec().dim;
    const uint32_t stride = spec().stride();
    const row::OptParams opt = spec().opt;
    const row::ArenaRef arena = arena_;
    pool_.parallel_for(groups_.size(), kGrain / 4, [&](size_t begin, size_t end) {
      std::vector<float> sum(dim);
      std::vector<float> partials;
      for (size_t gi = begin; gi < end; ++gi) {
        if (gi + kAhead < end) prefetch_row(arena.row(groups_[gi + kAhead].row), stride);
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
        float* value = arena.row(g.row);
        row::apply_row<Kind>(opt, dim, value, value + dim, grad);
        arena.row_meta(g.row)->step = step;
      }
    });
  }

  // Makes room for `rows` rows: arena chunks (rows never move), dirty bits, and an index that
  // stays at most half full (rebuilt at the new size).
  void reserve_rows(uint64_t rows) {
    while (row::arena_capacity(chunks_, arena_.base_shift) < rows) {
      if (chunks_ == row::kMaxChunks) fail(EMBSTORE_OUT_OF_MEMORY, "row arena is at its limit");
      const uint64_t n = row::chunk_rows(chunks_, arena_.base_shift);
      HostBuffer values(n * arena_.stride * sizeof(float));
      HostBuffer meta(n * sizeof(row::RowMeta));
      arena_.values[chunks_] = values.as<float>();
      arena_.meta[chunks_] = meta.as<row::RowMeta>();
      value_chunks_.push_back(std::move(values));
      meta_chunks_.push_back(std::move(meta));
      ++chunks_;
    }
    const uint64_t words = row::bitmap_words(row::arena_capacity(chunks_, arena_.base_shift));
    dirty_.resize(words, 0);
    freed_.resize(words, 0);
    // New rows are never captured: the bitmaps of a snapshot in progress keep their size
    // (drain reads captured_ without the lock).
    const uint64_t slots = row::index_slots_for(rows);
    if (index_.slots == nullptr || slots > index_.mask + 1) rebuild_index(slots);
    room_ = std::min(row::arena_capacity(chunks_, arena_.base_shift), (index_.mask + 1) / 2);
  }

  // The index part of load_rows on the pool's threads, for a table with room for every key of
  // the input (no rebuild half-way) and no free rows. Each thread owns a range of slots and
  // claims slots there for the absent keys homed in it (row::IndexRef::claim_in_range), in input
  // order; then, serially and in input order, claimed keys get the next row ids and the keys
  // whose probe crossed into another range are inserted (find_or_add_row): the ids a serial
  // load gives. load_slots_[i] is the slot claimed for key i (its row is written by the caller's
  // copy pass) or kNoSlot. A throw leaves claimed slots without rows: the table is a restore's,
  // dropped with the failure.
  void load_index_parallel(const int64_t* keys, size_t n, uint32_t* rows, uint64_t limit) {
    load_slots_.assign(n, kNoSlot);
    load_state_.resize(n);
    const row::IndexRef index = index_;
    const uint64_t slots = index.mask + 1;
    const size_t parts = pool_.size();
    uint64_t* slot_of = load_slots_.data();
    uint8_t* state = load_state_.data();
    pool_.parallel_for(parts, 1, [&](size_t first_part, size_t end_part) {
      for (size_t p = first_part; p < end_part; ++p) {
        const uint64_t lo = slots * p / parts, hi = slots * (p + 1) / parts;
        for (size_t i = 0; i < n; ++i) {
          if (i + kAhead < n) {
            const uint64_t h = index.home(keys[i + kAhead]);
            if (h >= lo && h < hi) __builtin_prefetch(&index.slots[h]);
          }
          const uint64_t h = index.home(keys[i]);
          if (h < lo || h >= hi) continue;
          state[i] = index.claim_in_range(keys[i], lo, hi, row::kLockedRow, &slot_of[i]);
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

  // The arena of rows [first, end), values and metadata, as ranges in row order (a few
  // thousand rows each, so the two kinds advance together).
  std::vector<Prefaulter::Range> row_ranges(uint64_t first, uint64_t end) const {
    constexpr uint64_t kRowsPerRange = 1 << 14;
    const uint64_t stride_bytes = uint64_t{arena_.stride} * sizeof(float);
    std::vector<Prefaulter::Range> ranges;
    uint64_t chunk_first = 0;
    for (uint32_t c = 0; c < chunks_ && chunk_first < end; ++c) {
      const uint64_t chunk_end = chunk_first + row::chunk_rows(c, arena_.base_shift);
      for (uint64_t lo = std::max(first, chunk_first); lo < std::min(end, chunk_end);) {
        const uint64_t hi = std::min({end, chunk_end, lo + kRowsPerRange});
        ranges.push_back({value_chunks_[c].as<char>() + (lo - chunk_first) * stride_bytes,
                          (hi - lo) * stride_bytes});
        ranges.push_back({meta_chunks_[c].as<char>() + (lo - chunk_first) * sizeof(row::RowMeta),
                          (hi - lo) * sizeof(row::RowMeta)});
        lo = hi;
      }
      chunk_first = chunk_end;
    }
    return ranges;
  }

  // Faults in the arena of rows [first, end) (values and metadata) on the pool's threads.
  void populate_rows(uint64_t first, uint64_t end) {
    const uint64_t stride_bytes = uint64_t{arena_.stride} * sizeof(float);
    uint64_t chunk_first = 0;
    for (uint32_t c = 0; c < chunks_ && chunk_first < end; ++c) {
      const uint64_t chunk_end = chunk_first + row::chunk_rows(c, arena_.base_shift);
      const uint64_t lo = std::max(first, chunk_first), hi = std::min(end, chunk_end);
      if (lo < hi) {
        value_chunks_[c].populate(pool_, (lo - chunk_first) * stride_bytes,
                                  (hi - lo) * stride_bytes);
        meta_chunks_[c].populate(pool_, (lo - chunk_first) * sizeof(row::RowMeta),
                                 (hi - lo) * sizeof(row::RowMeta));
      }
      chunk_first = chunk_end;
    }
  }

  void rebuild_index(uint64_t slots) {
    HostBuffer buffer(slots * sizeof(row::Slot));
    row::IndexRef index{buffer.as<row::Slot>(), slots - 1};
    // Every row = kEmptyRow; in parallel, as this is the index's first touch.
    pool_.parallel_for(slots, size_t{1} << 16, [&](size_t begin, size_t end) {
      std::memset(index.slots + begin, 0xFF, (end - begin) * sizeof(row::Slot));
    });
    if (index_.slots != nullptr) {
      for (uint64_t s = 0; s <= index_.mask; ++s) {
        const row::Slot& old = index_.slots[s];
        if (old.row < row::kMaxRows) index.insert_absent(old.key, old.row);
      }
    }
    index_buffer_ = std::move(buffer);
    index_ = index;
  }

  struct Group {
    uint32_t row, first, last, count;
  };

  // A chunk's rows in a spill file: the first value_bytes and meta_bytes of arena chunk
  // `chunk`'s two buffers (its rows in use, rounded up to whole pages).
  struct SpilledChunk {
    uint32_t chunk;
    uint64_t value_bytes, meta_bytes, values_at, meta_at, values_xxh3, meta_xxh3;
  };

  // `used` bytes at the start of buffer, rounded up to the spill file's alignment: within its
  // mapping, which has whole pages.
  static uint64_t spill_span(const HostBuffer& buffer, uint64_t used) {
    constexpr uint64_t a = SpillFile::kAlignment;
    return std::min((used + a - 1) / a * a, (uint64_t{buffer.bytes()} + a - 1) / a * a);
  }

  void check_spill(int r, const char* what) const {
    if (r < 0) {
      fail(EMBSTORE_IO_ERROR, "table '{}': could not {} its rows in the restore's spill file: {}",
           spec().name, what, std::strerror(-r));
    }
  }

  std::mutex mutex_;  // one call at a time per table (drain() goes without it)
  ThreadPool& pool_;
  row::ArenaRef arena_{};
  uint32_t chunks_ = 0;
  std::vector<HostBuffer> value_chunks_, meta_chunks_;
  HostBuffer index_buffer_;
  row::IndexRef index_{nullptr, 0};
  std::vector<uint64_t> dirty_;
  // Rows are handed out below next_row_; evicted ones wait in free_rows_ (their freed_ bit
  // set) for a new key. rows_: the live rows.
  std::vector<uint64_t> freed_;
  std::vector<uint32_t> free_rows_;
  uint64_t next_row_ = 0, rows_ = 0, inserted_ = 0, skipped_ = 0, admitted_ = 0;
  KeyLedger ledger_;   // admission counts and tombstones
  uint64_t room_ = 0;  // next_row_ may reach this before the arena or the index must grow
  // load_index_parallel's per-key slot and probe result.
  std::vector<uint64_t> load_slots_;
  std::vector<uint8_t> load_state_;
  bool dirty_tracking_ = true;
  // The snapshot in progress: the copy-on-write sink, the rows still to write, the rows it
  // captured, where drain resumes, and drain's copy counter (odd while it copies).
  SnapshotSink* sink_ = nullptr;
  std::vector<uint64_t> captured_, snapshot_set_;
  std::atomic<uint64_t> captured_left_{0};
  uint64_t drain_word_ = 0;
  std::atomic<uint64_t> drain_copying_{0};
  std::vector<uint32_t> cow_rows_;
  // Scratch kept between calls so the hot path does not allocate.
  std::vector<uint32_t> rows_scratch_, group_map_, next_, missing_pos_, pending_pos_, new_rows_,
      victims_;
  std::vector<int64_t> missing_keys_;
  std::vector<uint64_t> reading_;  // make_room: the rows of the call that needs room
  std::vector<Group> groups_;
  std::vector<SpilledChunk> spilled_;  // while a restore has the rows in its spill file
  // The fault-in of the rows asked for at create, or of those a restore loads (reserve());
  // last, so it stops before the memory goes.
  Prefaulter prefaulter_;
};

}  // namespace

std::unique_ptr<Table> make_host_table(TableSpec spec, ThreadPool& pool) {
  return std::make_unique<HostTable>(std::move(spec), pool);
}

}  // namespace embstore
