// A table stacked on another (issue 34): the rows beyond the upper table's budget live in a
// lower table. The CUDA backend's SSD tier is built so: the upper table is a CUDA table (its
// device tier over mapped host memory), the lower a host table whose own SSD tier holds all but a
// few of its rows. Each row lives in exactly one of the two, whole (value, optimizer state, stamp,
// dirty bit). A call brings the rows it needs up from the lower table first, making room in the
// upper one by moving its least recently used rows down, then runs on the upper table alone, so
// that it computes exactly what the upper table alone computes.
//
// Checkpoints see one table: capture, drain and end_snapshot go to both, at the same call
// boundary (the stack's lock). A row that leaves a table after a capture is written to the
// snapshot on its way out (copy-on-write, Table::take_rows), and carries its place in the
// snapshot to the other table (MovedRows::in_snapshot), which marks it dirty if the snapshot
// fails: the next delta holds what an untiered table's would, whether the snapshot succeeds
// or fails.
//
// Stages of a call (bring_up): which keys the upper table lacks, which of those the lower holds,
// room made above (make_room_above), the rows moved up (move_up); then the call itself.
// A move makes room where the rows go before it takes them (Table::reserve_put), so that only a
// device error can fail its second half; the rows then go back where they came from.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "host/table/table.hpp"

namespace embstore {

// A stack's two tables, for a table whose spec has memory_rows: the upper one holds device_rows
// rows on the device (a CUDA table's device tier) and most of memory_rows in host memory, the
// lower one an eighth of memory_rows (at least one row) in host memory and the rest on its SSD
// tier. Neither has a row limit: max_capacity is the stack's (StackedTable::choose_victims).
// Admission counts live above, where every key is first met (on the host, with a row limit).
struct StackSpecs {
  TableSpec upper, lower;
  uint64_t upper_rows = 0;
};
StackSpecs stack_specs(const TableSpec& spec);

class StackedTable final : public Table {
 public:
  // A call's keys in host memory (the CUDA backend's are in device memory); the output's
  // contents are the n keys.
  using KeysToHost =
      std::function<void(const int64_t* keys, size_t n, void* stream, std::vector<int64_t>* out)>;

  // spec: the table's as the user gave it. upper_rows: the most rows the upper table holds
  // between calls (a call on more distinct rows than that holds them all until it ends).
  StackedTable(TableSpec spec, std::unique_ptr<Table> upper, std::unique_ptr<Table> lower,
               uint64_t upper_rows, KeysToHost keys_to_host);

  void lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
              void* stream) override;
  void apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                       void* stream) override;
  TableCounters counters() override;
  void prefetch(const int64_t* keys, size_t n, void* stream) override;
  void set_dirty_tracking(bool on) override;

  uint64_t capture(bool full, SnapshotSink* sink, uint64_t* live_rows) override;
  const std::vector<int64_t>& evicted_at_capture() const override { return evicted_; }
  uint64_t drain(SnapshotSink* sink, uint64_t max_rows) override;
  std::optional<io::AdmissionFile> admission_at_capture() const override {
    return upper_->admission_at_capture();
  }
  void end_snapshot(bool failed) override;

  uint64_t evict_before(uint64_t cutoff_step) override;

  // To the upper table, where keys are counted, less the exact counts of keys with a row below
  // (a key with a row has none).
  bool load_admission(const io::AdmissionFile& counts, std::string* why) override;
  void reserve(uint64_t rows) override;
  bool skips_held_keys() const override { return true; }
  void load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                 uint64_t step, bool skip_held) override;

 private:
  // The stack's live rows (its row limit's count).
  uint64_t live_in_both();
  // held[i] = 1 where either table holds keys[i] (tombstones at capture, a restore's skipping).
  void held_in_either(const int64_t* keys, size_t n, uint8_t* held);
  // missing_ = the keys of keys[0, n) that the upper table lacks, in call order, repeats kept.
  void list_missing(const int64_t* keys, size_t n);
  // Brings the rows of the n keys (host memory) that the lower table holds up, first making room
  // for them, and with `insert` for the keys neither holds (rows an insert may add).
  void bring_up(const int64_t* keys, size_t n, bool insert, uint64_t step);
  // At max_capacity, before a call that may insert `fresh` rows (distinct keys neither table
  // holds): returns how many it inserts (with admission, those the upper table's counts admit),
  // and victims_ = the stack's least recently used rows to evict for them, sparing the call's
  // keys; or throws CAPACITY_EXCEEDED with nothing changed but the keys counted, as an untiered
  // table does.
  uint64_t choose_victims(uint64_t fresh, uint64_t step);
  void list_fresh_calls();
  void count_refused(uint64_t step);
  // Evicts victims_ (after the call's moves), first making room above for the call's new rows.
  void evict_victims(uint64_t fresh);
  // Moves `count` of the upper table's least recently used rows touched at `step` or before down,
  // with spare_calls sparing the keys of this call and the one before (a prefetch of batch i + 1
  // comes between batch i's lookup and its update).
  // Returns the rows moved.
  uint64_t make_room_above(uint64_t count, uint64_t step, bool spare_calls);
  // Moves the rows of keys (all held below) up.
  void move_up(const std::vector<int64_t>& keys);
  // Puts moved_ into `to`, or back into `from` (and rethrows) when that fails.
  void put_or_return(Table& to, Table& from);
  // After a call, whether it succeeded or not: moves the upper table's rows beyond its budget
  // down, those of this call and the one before last, and keeps this call's keys as the one
  // before. A failure leaves the rows above (the next call that needs room meets it again).
  void end_call() noexcept;
  struct EndCall {
    StackedTable* stack;
    ~EndCall() { stack->end_call(); }
  };
  const std::vector<int64_t>& host_keys(const int64_t* keys, size_t n, void* stream);

  std::mutex mutex_;  // one call at a time (drain() goes without it: each table's is safe)
  std::unique_ptr<Table> upper_, lower_;
  uint64_t upper_rows_;
  // A move down takes the upper table below its budget by this much, so that the next calls'
  // rows fit without a move of their own: each move chooses among every row above (a pass over
  // them; on CUDA an index rebuild too), so one serves several calls.
  static constexpr uint64_t kSlackShare = 16;
  uint64_t slack_;
  KeysToHost keys_to_host_;
  // Scratch kept between calls.
  // keys_: this call's keys in host memory; previous_: the call before's.
  std::vector<int64_t> keys_, previous_, spare_, missing_, ups_;
  std::vector<uint8_t> held_;
  MovedRows moved_;
  // The row limit's: candidates listed by the tables, the keys chosen to go.
  std::vector<RowAge> ages_, ages_below_;
  std::vector<int64_t> victims_;
  // With admission: the call's keys neither table holds (sorted), and their occurrences in call
  // order (what the upper table counts).
  std::vector<int64_t> fresh_, fresh_calls_;
  // Rows moved between the tables, each way; the keys evicted at the capture, from both tables,
  // less those that have a row in either.
  uint64_t moved_up_ = 0, moved_down_ = 0;
  uint64_t last_step_ = 0;  // the latest step a call gave (a prefetch gives none)
  std::vector<int64_t> evicted_;
};

}  // namespace embstore
