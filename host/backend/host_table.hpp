// The host backend: tables in host memory, parallel over the store's thread pool, built from
// the same per-row logic (cuda/row/) that the CUDA kernels run.
//
// The class is declared here and its methods are spread by concern: host_table.cpp (setup,
// growth, the index's find-or-add, counters), host_table_lookup.cpp (lookup and insert),
// host_table_update.cpp (apply_gradients), host_table_eviction.cpp (eviction),
// host_table_snapshot.cpp (capture, drain, copy-on-write), host_table_restore.cpp (reserve,
// load_rows, load_admission), host_table_memory.cpp (prefault, spill) and host_table_tier.cpp
// (the SSD tier below a memory budget: rows moved down and brought up).
//
// Rows and frames. A row id names a row for as long as it lives: the index maps keys to row
// ids, and the metadata, dirty, captured and freed bits are by row id. Its value and optimizer
// state sit in a frame of the value arena. Untiered, frame == row id. Tiered (memory_rows), the
// value arena holds about memory_rows frames, home_ maps each row to its frame or, with kOnDisk
// set, to its handle in the tier's RowSlots, and every call brings the rows it needs up first.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/index.h"
#include "cuda/row/optimizer.h"
#include "host/backend/backends.hpp"
#include "host/backend/host_buffer.hpp"
#include "host/store/thread_pool.hpp"
#include "host/table/key_ledger.hpp"
#include "io/tier/row_slots.hpp"

namespace embstore::host_backend {

// Keys are independent, so batches split into parts of this many keys or rows.
constexpr size_t kGrain = 4096;
// How many keys ahead the probe and copy loops prefetch: enough to cover a memory latency.
constexpr size_t kAhead = 16;
// The most rows one drain step of a tiered table copies: its rows on disk are one batched read.
constexpr uint64_t kTieredDrainRows = 1024;
// A tiered table's drain reads its captured rows on disk in the order of their slots (pages in
// file order, each once) rather than by row id when they are at least this fraction of the
// tier's slots (1 / kDrainBySlotRatio): looking at every slot costs a few nanoseconds each, a
// random page read some microseconds.
constexpr uint64_t kDrainBySlotRatio = 256;
// The most slots one drain step looks at in slot order (some hundreds of microseconds).
constexpr uint64_t kDrainSlotsPerStep = uint64_t{1} << 18;
// A tiered table halves every row's heat after this many budgets' worth of row uses: long
// enough to tell a hot row from a passing one, short enough to follow a shifting hot set.
constexpr uint64_t kHeatPeriodBudgets = 8;
// A tiered table that does not prefetch starts writing an eighth of its budget down in the
// background once its free frames fall below this fraction of it (a sixteenth): the next calls
// find room made, with the write behind the trainer's work between calls.
constexpr uint64_t kWriteBackLowFraction = 16;
// The name of a tiered table's thread (prefetches, write-backs).
inline constexpr char kTierThreadName[] = "embstore-tier";

// Per-row entries of a tiered table, chunked as the arena's metadata, so an entry never moves.
template <typename T>
struct ChunkedRef {
  T* chunks[row::kMaxChunks];
  uint32_t base_shift;
  T* at(uint64_t r) const {
    const row::ChunkPos p = row::chunk_of(r, base_shift);
    return chunks[p.chunk] + p.offset;
  }
};
// A row's home on a tiered table: a frame of the value arena, or with kOnDisk set a handle of
// the tier's RowSlots.
inline constexpr uint32_t kOnDisk = 0x80000000u;
using HomeRef = ChunkedRef<uint32_t>;

inline void prefetch_row(const float* row, uint32_t floats) {
  const char* p = reinterpret_cast<const char*>(row);
  const char* end = p + size_t{floats} * sizeof(float);
  for (; p < end; p += 64) __builtin_prefetch(p);
}

class HostTable final : public Table {
 public:
  HostTable(TableSpec spec, ThreadPool& pool);
  // Waits for the job the tier thread is running, if any (one not started is dropped).
  ~HostTable() override;

  void prefault_initial_capacity() override;
  void prefetch(const int64_t* keys, size_t n, void*) override;
  void lookup(const int64_t* keys, size_t n, float* out, bool insert, uint64_t step,
              void*) override;
  void apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                       void*) override;
  TableCounters counters() override;
  void set_dirty_tracking(bool on) override;
  uint64_t capture(bool full, SnapshotSink* sink, uint64_t* live_rows) override;
  uint64_t drain(SnapshotSink* sink, uint64_t max_rows) override;
  const std::vector<int64_t>& evicted_at_capture() const override;
  std::optional<io::AdmissionFile> admission_at_capture() const override;
  void end_snapshot(bool failed) override;
  void reserve(uint64_t rows) override;
  bool skips_held_keys() const override;
  void load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                 uint64_t step, bool skip_held) override;
  bool can_spill() const override;
  void spill(SpillFile& file) override;
  void unspill(SpillFile& file) override;
  bool load_admission(const io::AdmissionFile& counts, std::string* why) override;
  uint64_t evict_before(uint64_t cutoff_step) override;
  // host_table_moves.cpp
  uint64_t live_rows() override;
  void find_held(const int64_t* keys, size_t n, uint8_t* held) override;
  void take_rows(const int64_t* keys, size_t n, MovedRows* out) override;
  void take_coldest(uint64_t count, uint64_t before_step, const int64_t* spare, size_t n_spare,
                    MovedRows* out) override;
  void reserve_put(uint64_t n) override;
  void put_rows(const MovedRows& rows) override;
  uint64_t list_coldest(uint64_t count, uint64_t before_step, const int64_t* spare, size_t n_spare,
                        std::vector<RowAge>* out) override;
  uint64_t evict_keys(const int64_t* keys, size_t n) override;
  uint64_t count_admission(const int64_t* keys, size_t n, uint64_t step, bool count) override;

 private:
  struct Group {
    uint32_t row, first, last, count;
  };
  struct PrefetchJob;  // below, with the tier's members

  // A chunk's rows in a spill file: the first value_bytes and meta_bytes of arena chunk
  // `chunk`'s two buffers (its rows in use, rounded up to whole pages).
  struct SpilledChunk {
    uint32_t chunk;
    uint64_t value_bytes, meta_bytes, values_at, meta_at, values_xxh3, meta_xxh3;
  };

  // host_table.cpp
  uint32_t find_or_add_row(int64_t key, bool* added);
  void reserve_rows(uint64_t rows);
  void rebuild_index(uint64_t slots);

  // host_table_lookup.cpp
  template <bool Streaming>
  void copy_rows(const uint32_t* rows, size_t n, float* out);
  void find_rows(const int64_t* keys, size_t n, uint32_t* rows);
  // victims_ = the rows of keys (those the table holds), in their order.
  void rows_of(const int64_t* keys, size_t n);
  void insert_missing(const int64_t* keys, size_t n, uint32_t* rows, uint64_t step);
  void read_pending(const int64_t* keys, float* out);
  void touch_rows(const uint32_t* rows, size_t n, uint64_t step);

  // host_table_update.cpp
  void group_by_row(const uint32_t* rows, size_t n, bool mark);
  template <row::OptKind Kind>
  void update_groups(const float* grads, uint64_t step);

  // host_table_moves.cpp
  void prepare_put(uint64_t n);

  // host_table_eviction.cpp
  // Evicts `victims` (live rows, each once): remove_rows with tombstones.
  void evict_rows(std::vector<uint32_t>& victims) { remove_rows(victims, nullptr); }
  // Removes `victims` (live rows, each once): written to a snapshot in progress first, then
  // their keys leave the index and the rows go to the free list. With out, their rows are
  // appended to it (read from disk where they are there) and no tombstones are left (a move to
  // another table); without, an eviction. Throws with nothing removed.
  void remove_rows(std::vector<uint32_t>& victims, MovedRows* out);
  template <typename F>
  void for_each_candidate(uint64_t before, const uint64_t* spared, F&& f) const;
  // The min(need, candidates) least recently used rows touched before `step`, sparing the n
  // `reading` rows, into victims_; returns the candidates.
  uint64_t pick_least_recent(uint64_t need, uint64_t step, const uint32_t* reading, size_t n);

  // host_table_snapshot.cpp
  void take_for_copy(uint32_t r);
  void copy_out_taken();
  void wait_for_drain_copy();
  // A tiered table's drain goes in stages: first (kStart) it counts its captured rows on disk;
  // when they are many, it takes them in slot order (kSlots), and last every captured row left,
  // wherever it is, by row id (kSweep: rows in memory, sparse deltas, rows compaction moved
  // behind the slot scan). Each take_* takes up to `want` captured rows into drain_rows_, under
  // disk_mutex_, so that the homes it sees hold until they are copied.
  enum class DrainStage { kStart, kSlots, kSweep };
  uint64_t drain_tiered(uint64_t granted, char* out);
  void choose_drain_order();
  bool take_rows_by_slot(uint64_t want);
  void take_rows_by_id(uint64_t want);
  bool drain_pending() const;

  // host_table_restore.cpp
  void load_index_parallel(const int64_t* keys, size_t n, uint32_t* rows, uint64_t limit);

  // host_table_tier.cpp (tiered tables only, unless said otherwise)
  void open_tier();
  // The frame of a resident row; on an untiered table the row itself (any table).
  uint32_t frame_of(uint32_t r) const { return tiered_ ? *home_.at(r) : r; }
  uint32_t home(uint32_t r) const { return __atomic_load_n(home_.at(r), __ATOMIC_RELAXED); }
  void set_home(uint32_t r, uint32_t h) { __atomic_store_n(home_.at(r), h, __ATOMIC_RELAXED); }
  // A new tier call: rows it stamps are not moved down until the next one.
  void begin_tier_call() { ++use_clock_; }
  // Brings rows[0..n) (kNoRow entries skipped, repeats allowed) up, making room first; stamps
  // every one. Throws Error(IO_ERROR) with nothing lost.
  void bring_up(const uint32_t* rows, size_t n);
  // Stamps the rows of rows[0..n) in memory with this call (kNoRow entries skipped, repeats
  // allowed) and counts a use of each; up_rows_ = the others, on disk, each once, also counted.
  // Whether there are any.
  bool stamp_resident(const uint32_t* rows, size_t n);
  // Makes sure `need` frames can be taken without passing the budget, moving the least recently
  // used rows (not stamped in this call) down: at least an eighth of the budget at a time.
  void make_frames(uint64_t need);
  // At the end of a call: moves the least recently used rows down until the budget holds again
  // (after a call on more rows than it), then write_back_ahead. A failure leaves them in memory:
  // the call succeeded.
  void settle();
  // When few frames are free, no job is in flight and the table has not prefetched in its last
  // calls: hands the write of an eighth of the budget's coldest rows (not those of this call or
  // the one before) to the prefetch thread, as a job that reads nothing.
  void write_back_ahead();
  // Settles a tiered table when a call ends, however it ends.
  struct SettleAtExit {
    HostTable* table;
    ~SettleAtExit() {
      if (table->tiered_) table->settle();
    }
  };
  // Moves down up to `count` rows, never those stamped at spare_since or later; the order is
  // pick_cold_frames' (host_table_tier.cpp).
  void move_down_least_used(uint64_t count, uint64_t spare_since);
  // The frames of up to `count` rows to move down into down_frames_ (sorted): never rows stamped
  // at spare_since or later, nor rows a prefetch moves down already.
  void pick_cold_frames(uint64_t count, uint64_t spare_since);
  // Frames held: rows in memory (a prefetch's rows moving down included) and the free frames a
  // prefetch's read fills.
  uint64_t held_frames() const { return resident_ + prefetch_.fresh_frames; }
  // Ends the prefetch in flight, if any: waits for its thread, then the rows it moved down are on
  // disk and the rows it read in memory. When the write failed, nothing moved and nothing was
  // read; when the read failed, its rows are still on disk. A write-back's rows among
  // wanted[0..n_wanted) (a call's, kNoRow skipped) stay in memory. Under mutex_.
  void finish_prefetch(const uint32_t* wanted = nullptr, size_t n_wanted = 0);
  void keep_wanted_rows(PrefetchJob& job, const uint32_t* wanted, size_t n);
  // Whether any of rows[0..n) is a row a prefetch moves, up or down.
  bool any_moving(const uint32_t* rows, size_t n) const;
  // The prefetch thread: writes each job's rows down, then reads its rows up into their frames,
  // beside training calls.
  void prefetch_loop();
  void run_prefetch_job(PrefetchJob& job);
  // Hands the prefetch thread a job: moving down the rows in frames `downs`, then reading rows
  // `reads` (on disk, distinct) into their frames and free ones (each may be empty). Allocates
  // everything first: a failure changes nothing.
  void submit_job(const std::vector<uint32_t>& reads, const std::vector<uint32_t>& downs);
  bool job_in_flight() const { return prefetch_.submitted; }
  uint32_t take_frame();
  void place_in_frame(uint32_t r, uint32_t f);
  // A row new to the table (an insert, a restore's load) in a frame of its own, heat 1.
  void place_new_row(uint32_t r);
  // Counts one more call that used row r; halves every row's heat once the calls counted since
  // the last halving reach kHeatPeriodBudgets times the budget (the count forgets old use).
  void heat_up(uint32_t r);
  void cool_all();
  void reserve_frames(uint64_t frames);
  void reserve_frames_for(uint64_t n);
  void reserve_disk_rows(uint64_t n);
  // Room for releasing n rows' homes without allocating (evict_rows' "nothing can fail").
  void reserve_release(size_t n);
  void move_down(std::vector<uint32_t>& frames);
  // Before rows in `frames` move down: the captured ones are written to the snapshot, with the
  // value they had at the capture (moving does not change it).
  void copy_out_before_move(const std::vector<uint32_t>& frames);
  // After the rows in `frames` were written to disk slots `handles`: points their homes there
  // and frees their frames, except the first `keep` (which the caller reuses).
  void finish_move_down(const std::vector<uint32_t>& frames, const uint64_t* handles, size_t keep);
  void move_up(const std::vector<uint32_t>& rows);
  // After rows' bytes were read into frames: points their homes there, frees their disk slots
  // and writes captured ones by copy-on-write. The frames were taken; stamped with `clock`.
  void finish_move_up(const std::vector<uint32_t>& rows, const std::vector<uint32_t>& frames,
                      uint64_t clock);
  // Frees the disk handles or frames of rows that leave the table (eviction).
  void release_homes(const std::vector<uint32_t>& rows);
  // The records of `rows` into records (stride floats each), those on disk read in one batch.
  // Throws IO_ERROR, with nothing changed, when the read fails.
  void read_records(const std::vector<uint32_t>& rows, float* records);
  void compact_disk();
  // rows' frames (kNoRow kept) into frames_scratch_; rows itself when untiered.
  const uint32_t* frames_of(const uint32_t* rows, size_t n);
  // Where each of rows' values are, for copy-on-write (which may meet rows on disk: eviction),
  // those on disk read into cow_scratch_ in one batch. Any table; on the training thread. When
  // the read fails, the taken rows cannot be written: the snapshot is failed (copy_failed_,
  // which the drain reports) and the call throws IO_ERROR.
  const float* const* stage_for_copy(const std::vector<uint32_t>& rows);
  // Under disk_mutex_: the rows of disk homes[0..n) into out (stride floats each). Any thread
  // (the drain's and copy-on-write's scratch differ, but these handles are shared: the lock).
  void read_disk_rows(size_t n, const uint32_t* homes, float* out);
  [[noreturn]] void fail_tier(int err, const char* what, const std::string& detail) const;

  // host_table_memory.cpp
  std::vector<Prefaulter::Range> row_ranges(uint64_t first, uint64_t end) const;
  void populate_rows(uint64_t first, uint64_t end);
  static uint64_t spill_span(const HostBuffer& buffer, uint64_t used);
  void check_spill(int r, const char* what) const;

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
  // load_index_parallel's per-key slot and probe result, its keys ordered by the range of
  // slots their homes lie in, and its counts per chunk of the input and range.
  std::vector<uint64_t> load_slots_;
  std::vector<uint8_t> load_state_;
  std::vector<uint32_t> load_order_;
  std::vector<uint64_t> load_counts_;
  bool dirty_tracking_ = true;
  // The snapshot in progress: the copy-on-write sink, the rows still to write, the rows it
  // captured, where drain resumes, and drain's copy counter (odd while it copies).
  SnapshotSink* sink_ = nullptr;
  std::vector<uint64_t> captured_, snapshot_set_;
  // By row id: rows put in (put_rows) that the snapshot in flight holds where they came from,
  // marked dirty if it fails. Empty until a table's first put; then sized with dirty_, cleared
  // by end_snapshot and as rows leave.
  std::vector<uint64_t> carried_;
  std::atomic<uint64_t> captured_left_{0};
  uint64_t drain_word_ = 0;
  DrainStage drain_stage_ = DrainStage::kSweep;  // a tiered table's; kStart from capture
  uint64_t drain_slot_ = 0;                      // the next disk handle kSlots looks at
  std::atomic<uint64_t> drain_copying_{0};
  std::vector<uint32_t> cow_rows_;
  // Scratch kept between calls so the hot path does not allocate.
  std::vector<uint32_t> rows_scratch_, group_map_, next_, missing_pos_, pending_pos_, new_rows_,
      victims_;
  std::vector<int64_t> missing_keys_;
  std::vector<uint64_t> reading_;  // pick_least_recent: the rows of the call that needs room
  std::vector<Group> groups_;
  std::vector<SpilledChunk> spilled_;  // while a restore has the rows in its spill file
  // The SSD tier (spec().memory_rows != 0). Frames: the value arena's slots; chunks
  // frame_chunks_ of value_chunks_. frame_row_: the row in each frame (kNoRow: free);
  // frame_used_: the use clock of its last call. heat_: by row, wherever it lives, how many calls
  // used it (saturating, halved now and then); rows move down coldest first, least recently
  // used among equals. disk_mutex_ guards disk_ and every write of home_ (drain reads captured
  // rows' homes and disk rows beside training calls).
  bool tiered_ = false;
  HomeRef home_{};
  ChunkedRef<uint8_t> heat_{};
  std::vector<HostBuffer> home_chunks_;
  uint64_t heat_count_ = 0;  // heat_up calls since the last cool_all
  uint32_t frame_chunks_ = 0;
  uint64_t frame_capacity_ = 0, next_frame_ = 0, resident_ = 0, use_clock_ = 0;
  std::vector<uint32_t> frame_row_, free_frames_;
  std::vector<uint64_t> frame_used_;
  std::unique_ptr<io::RowSlots> disk_;
  std::mutex disk_mutex_;
  // By handle: the row it was last given (dead handles keep theirs). Under disk_mutex_ (the
  // drain reads it).
  std::vector<uint32_t> disk_row_;
  uint64_t moved_up_ = 0, moved_down_ = 0;
  std::vector<uint32_t> up_rows_, down_frames_, frames_scratch_, group_frames_;
  std::vector<uint64_t> handles_, handles_for_read_;
  std::vector<std::pair<uint64_t, uint64_t>> compact_moves_;
  std::vector<char*> row_ptrs_, read_ptrs_;
  std::vector<uint32_t> drain_homes_, drain_rows_, cow_homes_;
  std::vector<const float*> cow_values_;
  std::atomic<bool> copy_failed_{false};  // see stage_for_copy
  std::vector<float> cow_scratch_, drain_scratch_;
  // The job in flight (submitted: there is one), a prefetch's or a write-back's (no rows to
  // read). The caller's thread picks the cold rows whose frames the read needs, or an eighth of
  // the budget's for a write-back (down_frames, down_rows: they stay in memory, their captured
  // ones written to the snapshot first) and takes free frames for the rest (fresh_frames), then
  // hands the job to prefetch_thread_, which under disk_mutex_ writes the cold rows to fresh
  // slots (down_handles) and reads the rows on disk into `frames` (the cold rows' first). Every
  // home stays as it was meanwhile (a checkpoint's drain reads the rows on disk there), and the
  // next call that needs one of these rows or room, that may free rows, or that captures a
  // snapshot finishes it (finish_prefetch). moving_: its rows, both ways, by row id (under mutex_).
  // Once submitted, the thread writes only down_handles, handles, down_err, err and done (under
  // prefetch_mutex_).
  struct PrefetchJob {
    std::vector<uint32_t> rows, frames;
    std::vector<char*> into;
    std::vector<uint64_t> handles;
    std::vector<uint32_t> down_frames, down_rows;
    std::vector<const char*> down_from;
    std::vector<uint64_t> down_handles;
    uint64_t fresh_frames = 0;
    uint64_t clock = 0;
    bool submitted = false, done = false;
    int down_err = 0, err = 0;
  };
  PrefetchJob prefetch_;
  std::vector<uint64_t> moving_;
  uint64_t prefetch_clock_ = 0;  // use_clock_ of the last prefetch (0: none yet)
  std::mutex prefetch_mutex_;
  std::condition_variable prefetch_cv_;
  bool prefetch_stop_ = false;
  std::thread prefetch_thread_;  // kTierThreadName, started by the first job
  // The fault-in of the rows asked for at create, or of those a restore loads (reserve());
  // last, so it stops before the memory goes.
  Prefaulter prefaulter_;
};

}  // namespace embstore::host_backend
