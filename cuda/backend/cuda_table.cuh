// The CUDA backend's table: a table in the device memory of one GPU. Kernels are thin wrappers over
// the portable per-row logic in cuda/row/, so every row they compute is bit-identical to the
// host backend's. What lives here is CUDA-only: the concurrent find-or-insert, launch
// configuration, CUB sorts and scans, growth, streams and events.
//
// Ordering: each call waits (on the device) for an event recorded at the end of the table's
// previous call, so a table's work runs in call order whatever streams the caller uses, and
// the grow-only scratch buffer is never used by two calls at once. The checkpoint drain is the
// exception: it runs on a stream of its own beside the calls, with its own buffers and lock
// (drain_mutex_), and copies a row before it takes the row's captured bit (cuda_snapshot.cu).
//
// The class is declared here and its methods are spread by concern: cuda_table.cu (setup,
// growth, lookup, counters), cuda_update.cu (the fused update), cuda_eviction.cu (eviction,
// admission counting), cuda_snapshot.cu (capture, drain, copy-on-write, restore); their
// kernels are in kernels/*.cuh.
#pragma once

#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cuda/atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cuda/backend/device.cuh"
#include "cuda/backend/device_admission.cuh"
#include "cuda/backend/device_memory.cuh"
#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"
#include "cuda/row/snapshot.h"
#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/table/key_ledger.hpp"
#include "host/table/table.hpp"

namespace embstore::cuda_backend {

// The device tier's moves: a device row may make room for a hot one once it has not been
// inserted or updated for this many steps (the latest step a call gave and the one before), and
// is not wanted by this prefetch or the one before it (the current batch, whose update comes
// after); a prefetch of n keys searches at most max(this x n, 1024) device ids for such rows.
inline constexpr uint64_t kDeviceTierIdleSteps = 2;
inline constexpr uint64_t kDeviceTierWindowPerKey = 4;

class CudaTable final : public Table {
 public:
  CudaTable(TableSpec spec, int device);
  ~CudaTable() override;

  void lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
              void* stream) override;
  void apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                       void* stream) override;
  TableCounters counters() override;
  // The device tier (cuda_device_tier.cu): moves the rows of keys in host memory up to the
  // device, each trading ids with an idle device row; nothing without device_rows.
  void prefetch(const int64_t* keys, size_t n, void* stream) override;
  void set_dirty_tracking(bool on) override {
    std::lock_guard lock(mutex_);
    dirty_tracking_ = on;
  }
  uint64_t capture(bool full, SnapshotSink* sink, uint64_t* live_rows) override;
  const std::vector<int64_t>& evicted_at_capture() const override {
    return ledger_.evicted_at_capture();
  }
  std::optional<io::AdmissionFile> admission_at_capture() const override {
    return ledger_.admission_at_capture();
  }
  uint64_t drain(SnapshotSink* sink, uint64_t max_rows) override;
  void end_snapshot(bool failed) override;
  uint64_t evict_before(uint64_t cutoff_step) override;
  void reserve(uint64_t rows) override;
  // Skipping held keys: each piece's keys sorted on the device, the first occurrence of each
  // key the table does not hold loaded (mark_new_keys), the others left out.
  bool skips_held_keys() const override { return true; }
  void load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                 uint64_t step, bool skip_held) override;
  bool load_admission(const io::AdmissionFile& counts, std::string* why) override;
  // Whole rows out and in (cuda_moves.cu): a stack's moves (host/table/stacked_table.hpp).
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
  // Orders a call after the table's previous call and marks its end for the next one.
  class CallScope {
   public:
    CallScope(cudaEvent_t done, cudaStream_t stream) : done_(done), stream_(stream) {
      check(cudaStreamWaitEvent(stream, done, 0), "cudaStreamWaitEvent");
    }
    ~CallScope() {
      // Also after a failure part-way: the next call must wait for what was enqueued. If the
      // event cannot be recorded, wait here instead, so no later call can overtake this one.
      if (cudaEventRecord(done_, stream_) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaStreamSynchronize(stream_);
        (void)cudaGetLastError();
      }
    }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    cudaEvent_t done_;
    cudaStream_t stream_;
  };

  // Hands the sink's records to the writer on every way out of drain() and copy_on_write().
  struct FlushOnExit {
    SnapshotSink* sink;
    ~FlushOnExit() {
      try {
        sink->flush();
      } catch (...) {
      }
    }
  };

  // What every data-path call holds: the table's lock, its device, and its place in the
  // table's call order.
  struct Call {
    Call(CudaTable& t, void* stream_ptr)
        : lock(t.mutex_),
          guard(t.device_),
          stream(static_cast<cudaStream_t>(stream_ptr)),
          scope(t.done_, stream) {}
    std::lock_guard<std::mutex> lock;
    DeviceGuard guard;
    cudaStream_t stream;
    CallScope scope;
  };

  uint64_t capacity_rows() const { return row::arena_capacity(chunks_, arena_.base_shift); }
  row::IndexRef index_ref() const {
    return row::IndexRef{index_.get<row::Slot>(), index_slots_ - 1};
  }
  DeviceCounters* device_counters() const { return counters_.get<DeviceCounters>(); }
  unsigned blocks_for(uint64_t threads) const {
    const uint64_t blocks = (threads + kBlock - 1) / kBlock;
    return static_cast<unsigned>(std::clamp<uint64_t>(blocks, 1, max_blocks_));
  }
  void check_batch(size_t n) const;
  char* scratch(size_t bytes, cudaStream_t stream);
  char* admission_buffer(size_t bytes, cudaStream_t stream);
  DeviceCounters read_counters(cudaStream_t stream);
  // lookup with insert on a table with admission: exact counts on the device, or counts on the
  // host (a Bloom filter's; exact ones with TableSpec::counts_on_host); both end in
  // insert_and_gather.
  void lookup_counting_on_device(const int64_t* keys, size_t n, float* values_out, uint64_t step,
                                 cudaStream_t stream);
  void lookup_counting_on_host(const int64_t* keys, size_t n, float* values_out, uint64_t step,
                               cudaStream_t stream);
  void count_admission_on_host(const int64_t* keys, size_t n, uint64_t step, cudaStream_t stream);
  void insert_and_gather(const int64_t* keys, size_t n, uint64_t step, const uint8_t* pending,
                         uint32_t* rows, uint8_t* created, float* values_out, cudaStream_t stream);
  void gather(const int64_t* keys, size_t n, const uint32_t* rows, const uint8_t* pending,
              float* values_out, cudaStream_t stream);
  bool reserve_rows_cheaply(uint64_t n);
  void reserve_rows(const int64_t* keys, size_t n, uint64_t step, const int64_t* call_keys,
                    size_t call_n, cudaStream_t stream);
  // With out: takes up to `need` rows out whole (as many as there are candidates) instead of
  // evicting them; with ages: lists them (their stamps and keys), removing nothing. Returns the
  // candidates' count. grow_to: the arena grows to that many rows once the rows are chosen and
  // before any goes (an insert's room after the eviction: a refused call grows nothing, and a
  // failure to grow evicts nothing).
  uint64_t make_room(uint64_t need, uint64_t step, const int64_t* call_keys, size_t call_n,
                     const DeviceCounters& d, cudaStream_t stream, MovedRows* out = nullptr,
                     std::vector<RowAge>* ages = nullptr, uint64_t grow_to = 0);
  template <typename Predicate>
  size_t select_bytes(Predicate predicate, uint64_t items, cudaStream_t stream) const;
  template <typename Predicate>
  uint64_t select(Predicate predicate, uint64_t items, uint32_t* out, void* temp, size_t temp_bytes,
                  cudaStream_t stream);
  void evict_rows(const uint32_t* victims, uint64_t n, int64_t* keys_out, const DeviceCounters& d,
                  cudaStream_t stream) {
    remove_rows(victims, n, keys_out, d, stream, nullptr);
  }
  // Removes victims[0, n) (distinct live rows, in device memory): a snapshot in progress gets
  // them first, then they join the free list and the index is rebuilt without them. Without
  // out an eviction (their keys become tombstones); with out their rows are appended to it whole
  // (cuda_moves.cu: gather_leaving) and no tombstone is left. keys_out: n keys of device
  // scratch. d: the counters, read after every earlier call. Synchronous.
  void remove_rows(const uint32_t* victims, uint64_t n, int64_t* keys_out, const DeviceCounters& d,
                   cudaStream_t stream, MovedRows* out);
  void check_gives_rows() const;
  // rows[0, n)'s stamps and keys into *out (host memory), through device scratch keys and steps
  // (n each). Synchronous.
  void list_ages(const uint32_t* rows, uint64_t n, int64_t* keys, uint64_t* steps,
                 cudaStream_t stream, std::vector<RowAge>* out);
  // Removes the rows of host keys[0, n) (those the table holds) as remove_rows does. Returns how
  // many.
  uint64_t remove_keys(const int64_t* keys, size_t n, MovedRows* out);
  // take_coldest (with out) and list_coldest (with ages): make_room's choice. Returns the
  // candidates' count.
  uint64_t choose_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                          size_t n_spare, MovedRows* out, std::vector<RowAge>* ages);
  uint64_t grow_for_put(uint64_t n, const DeviceCounters& d, cudaStream_t stream);
  // The rows victims[0, n) as they leave, appended to out (host memory). Synchronous.
  void gather_leaving(const uint32_t* victims, uint64_t n, MovedRows* out, cudaStream_t stream);
  // rows[i] for host keys[0, n): their rows (kNoRow: none), in host memory. Synchronous.
  void resolve_on_host(const int64_t* keys, size_t n, std::vector<uint32_t>* rows,
                       cudaStream_t stream);
  uint64_t count_new_keys(const int64_t* keys, size_t n, cudaStream_t stream);
  uint64_t mark_new_keys(const int64_t* keys, size_t n, uint32_t* keep, uint32_t* row,
                         cudaStream_t stream);
  void add_chunk(uint32_t chunk, row::ArenaRef* arena);
  uint32_t* wanted_generations(cudaStream_t stream);
  void grow(uint64_t need, uint64_t rows, cudaStream_t stream);
  void release() noexcept;
  char* stage(size_t bytes, cudaStream_t stream);
  uint64_t stage_rows() const {
    return std::max<uint64_t>(1, kStageBytes / row::record_bytes(arena_.stride));
  }
  char* drain_buffer(size_t bytes);
  DrainCounters read_drain_counters();
  uint64_t drain_piece(uint64_t want, char* out, bool* exhausted);
  void leave_captured(uint64_t rows);
  void copy_on_write(const uint32_t* rows, uint64_t n, uint32_t no_row, cudaStream_t stream);

  int device_;
  uint64_t max_blocks_ = 1;
  std::mutex mutex_;
  // Held by drain() for the whole call; taken after mutex_ by the calls that replace what the
  // drain uses (capture, end_snapshot, grow). drain() never waits for mutex_.
  std::mutex drain_mutex_;
  row::ArenaRef arena_{};
  uint32_t chunks_ = 0;
  // A chunk's values: rows below spec().device_rows in values_, the rest in host_values_
  // (device_rows == 0: all in values_); see add_chunk.
  std::array<DeviceBuffer, row::kMaxChunks> values_;
  std::array<MappedHostBuffer, row::kMaxChunks> host_values_;
  std::array<DeviceBuffer, row::kMaxChunks> meta_;
  DeviceBuffer index_;
  uint64_t index_slots_ = 0;
  DeviceBuffer dirty_;
  uint64_t dirty_words_ = 0;
  DeviceBuffer counters_;
  DeviceBuffer scratch_;
  cudaEvent_t done_ = nullptr;
  cudaStream_t own_stream_ = nullptr;  // counters() and setup; never the caller's work
  // >= the true row count: the count at the last synchronization plus every row an insert
  // enqueued since may have created. The insert path synchronizes only when this bound says
  // the table might have to grow or pass its limit (about every capacity/n insert calls).
  uint64_t rows_bound_ = 0;
  uint64_t loaded_rows_ = 0;  // by load_rows: inserted, but not admitted by training
  bool dirty_tracking_ = true;

  // Eviction (tables with a rule): the rows on the free list have their freed_ bit set;
  // free_list_ holds a row id per row of capacity, the first DeviceCounters::free_rows of them
  // free. evicted_keys_: where an eviction's keys arrive on the host.
  DeviceBuffer freed_;
  DeviceBuffer free_list_;
  // A stack's upper table (spec().gives_rows): by row id, rows put in that the snapshot in flight
  // held where they came from, marked dirty if it fails (cuda_moves.cu, end_snapshot).
  DeviceBuffer carried_;
  std::vector<int64_t> evicted_keys_;

  // Admission counts and tombstones. Exact counts are in device memory (device_counts_, owned
  // by the ledger), counted by the lookup's kernels in admission_buffer_'s arrays. A Bloom
  // filter's (and exact ones with TableSpec::counts_on_host: a stack's upper table at a row
  // limit) are in host memory as on the host backend: an inserting lookup copies the keys
  // without a row here and counts them in batch order: admit_keys_ (device copy admit_) get
  // rows, pending_pos_ read initial values. Tombstones are in host memory.
  KeyLedger ledger_;
  DeviceExactCounts* device_counts_ = nullptr;
  DeviceBuffer admission_buffer_;
  std::vector<uint32_t> missing_pos_, pending_pos_;
  std::vector<int64_t> missing_keys_, admit_keys_;
  DeviceBuffer admit_;

  // Snapshots. captured_ and snapshot_set_ (the captured bitmap as capture left it, for
  // end_snapshot(failed)) are allocated at the first capture and then kept at dirty_words_
  // words; stage_ is the grow-only device staging of records and of load_rows input.
  DeviceBuffer captured_;
  DeviceBuffer snapshot_set_;
  DeviceBuffer stage_;
  SnapshotSink* sink_ = nullptr;
  bool snapshot_active_ = false;  // written holding mutex_ and drain_mutex_: readable under either
  // >= the captured rows whose records are not in staging yet (exact unless a call failed
  // part-way); 0: no copy-on-write. Lowered by drain() and copy-on-write, each after its records
  // are in the sink.
  std::atomic<uint64_t> captured_left_{0};

  // The device tier (tables with device_rows; cuda_device_tier.cu): the latest step a call
  // gave, the device id where the next prefetch's search for idle rows starts, the generation
  // of the latest prefetch, and per row id the generation of the latest prefetch that wanted it
  // (uint32, grown on use to the capacity: wanted_generations).
  uint64_t last_step_ = 0;
  uint64_t tier_cursor_ = 0;
  uint32_t tier_generation_ = 0;
  DeviceBuffer wanted_;

  // The drain, under drain_mutex_: its stream, its device buffer (listing scratch and two
  // staging pieces of records, about 2 x kStageBytes, kept from the first snapshot on) and
  // result slots. It resumes at drain_word_ (every word before it is empty); captured rows lie
  // below drain_end_word_ (the live rows at capture).
  cudaStream_t drain_stream_ = nullptr;
  DeviceBuffer drain_buffer_;
  DeviceBuffer drain_counters_;
  uint64_t drain_word_ = 0;
  uint64_t drain_end_word_ = 0;
};

// Row selections (eviction, admission), here so that every file of the table can use them.
// cub::DeviceSelect::If's temporary storage for select(predicate, items).
template <typename Predicate>
inline size_t CudaTable::select_bytes(Predicate predicate, uint64_t items,
                                      cudaStream_t stream) const {
  size_t bytes = 0;
  check(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<uint32_t>(0),
                              static_cast<uint32_t*>(nullptr),
                              static_cast<unsigned long long*>(nullptr),
                              static_cast<int64_t>(items), predicate, stream),
        "cub::DeviceSelect::If");
  return bytes;
}

// The i of [0, items) for which predicate(i), in ascending order, to out; returns how many.
// Synchronous.
template <typename Predicate>
inline uint64_t CudaTable::select(Predicate predicate, uint64_t items, uint32_t* out, void* temp,
                                  size_t temp_bytes, cudaStream_t stream) {
  unsigned long long* selected = &device_counters()->selected;
  check(cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<uint32_t>(0), out,
                              selected, static_cast<int64_t>(items), predicate, stream),
        "cub::DeviceSelect::If");
  return read_counters(stream).selected;
}

}  // namespace embstore::cuda_backend
