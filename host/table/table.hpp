// The backend-neutral table interface. A backend (host/backend/host_table.*,
// cuda/backend/cuda_table.cu) implements it over the shared per-row logic in cuda/row/.
#pragma once

#include <embstore/embstore.h>

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"
#include "host/table/snapshot_sink.hpp"
#include "host/table/spill_file.hpp"
#include "io/codec/block_codec.hpp"
#include "io/format/admission_file.hpp"

namespace embstore {

// A validated, owning copy of embstore_table_config_t (see host/table/table_spec.cpp).
struct TableSpec {
  std::string name;
  uint32_t dim = 0;
  uint64_t initial_capacity = 0;
  uint64_t max_capacity = 0;  // 0: unbounded
  row::OptParams opt{};
  row::InitParams init{};
  uint32_t admit_after = 0;        // <= 1: every key at once
  uint64_t admit_bloom_bytes = 0;  // 0: exact counting
  uint64_t evict_idle_steps = 0;   // 0: never
  double evict_idle_seconds = 0;   // 0: never
  bool evict_when_full = false;
  // Where rows live (issue 34): not part of a checkpoint (manifests leave them out), so a table
  // a restore creates from a manifest has none.
  uint64_t device_rows = 0;  // CUDA: rows in device memory; 0: every row
  uint64_t memory_rows = 0;  // host: rows in memory; 0: every row (no SSD tier)
  std::string tier_dir;      // the store's, for a table with memory_rows
  // The upper table of a stack (host/table/stacked_table.hpp): rows leave it whole, so it keeps
  // freed row ids for reuse as a table that evicts does. Not part of a checkpoint.
  bool gives_rows = false;
  // Admission counted on the host even where the backend counts on its device (a CUDA table's
  // exact counts): a stack's upper table with max_capacity, whose counts the stack asks before
  // a call (Table::count_admission). Not part of a checkpoint (the counts' file is the same).
  bool counts_on_host = false;
  // How checkpoint files store the rows (issue 35): part of a checkpoint.
  io::Codec value_codec = io::Codec::kNone;
  io::Codec state_codec = io::Codec::kNone;
  io::Codec serving_codec = io::Codec::kNone;  // values-only files (serving_deltas, serving_dir)

  uint32_t state_dim() const { return row::state_dim(opt.kind, dim); }
  bool idle_rules() const { return evict_idle_steps != 0 || evict_idle_seconds != 0; }
  // Whether rows are ever evicted (an insert at max_capacity makes room when any rule is set).
  bool evicts() const { return idle_rules() || evict_when_full; }
  // Whether rows ever leave the table, by eviction or whole (a stack's upper table).
  bool frees_rows() const { return evicts() || gives_rows; }
  bool admits() const { return admit_after > 1; }
  bool tiered() const { return memory_rows != 0; }
  uint32_t stride() const { return dim + state_dim(); }
};

// Validates config (every field) and returns the spec; throws Error(INVALID_ARGUMENT or
// UNSUPPORTED) naming the field.
TableSpec make_table_spec(const embstore_table_config_t& config);
// Throws Error(INVALID_ARGUMENT) unless name is [A-Za-z0-9_.-]{1,128} and not "." or "..";
// what ("table", "attachment") starts the message.
void check_name(const char* what, const char* name);
// The inverse, for manifests: make_table_spec(to_config(s)) == s. name points into s.
embstore_table_config_t to_config(const TableSpec& s);

// CAPACITY_EXCEEDED: `added` rows (`what`: an insert's "new rows", a load's "rows to load") on
// top of the `live` ones would pass the table's row limit, and nothing was `undone` ("inserted",
// "loaded").
[[noreturn]] void fail_over_limit(const TableSpec& spec, uint64_t added, uint64_t live,
                                  const char* what, const char* undone);
// CAPACITY_EXCEEDED: an insert at the row limit needs `need` rows evicted, but only `candidates`
// may go at `step`; nothing was inserted or evicted.
[[noreturn]] void fail_no_room(const TableSpec& spec, uint64_t need, uint64_t candidates,
                               uint64_t step);

struct TableCounters {
  uint64_t rows = 0, capacity = 0, dirty_rows = 0, inserted = 0, evicted = 0, pending_admission = 0,
           skipped_keys = 0, admitted = 0;
  // Tiers: live rows per tier, rows moved, bytes of the SSD tier's file.
  uint64_t rows_in_device = 0, rows_in_memory = 0, rows_on_disk = 0, rows_moved_up = 0,
           rows_moved_down = 0, tier_bytes_read = 0, tier_bytes_written = 0;
};

// Whole rows moving between the tables of a stack (host/table/stacked_table.hpp), in host
// memory: each row's key, last-touched step, dirty bit, whether the snapshot in flight holds it
// (captured by the table it leaves, or carried there so from another: if that snapshot fails,
// the row must be dirty again wherever it is), and record (value then optimizer state, stride
// floats).
struct MovedRows {
  std::vector<int64_t> keys;
  std::vector<uint64_t> steps;
  std::vector<uint8_t> dirty, in_snapshot;
  std::vector<float> records;
  size_t size() const { return keys.size(); }
  void clear() { truncate(0, 0); }
  // Room for n more rows of `stride` floats, so that appending them cannot fail.
  void reserve_more(size_t n, uint32_t stride) {
    keys.reserve(keys.size() + n);
    steps.reserve(steps.size() + n);
    dirty.reserve(dirty.size() + n);
    in_snapshot.reserve(in_snapshot.size() + n);
    records.reserve(records.size() + n * size_t{stride});
  }
  // Sizes every array for n rows (a take fills them in place; a failed one gives back what it
  // appended).
  void truncate(size_t n, uint32_t stride) {
    keys.resize(n);
    steps.resize(n);
    dirty.resize(n);
    in_snapshot.resize(n);
    records.resize(n * size_t{stride});
  }
};

// A row's last-touched step and key: where it stands in the order of eviction
// (row::evicted_first).
struct RowAge {
  uint64_t step;
  int64_t key;
};

class Table {
 public:
  explicit Table(TableSpec spec) : spec_(std::move(spec)) {}
  virtual ~Table() = default;
  Table(const Table&) = delete;
  Table& operator=(const Table&) = delete;

  const TableSpec& spec() const { return spec_; }

  // Arguments are validated by the caller (host/api/api.cpp); pointers are backend pointers.
  virtual void lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
                      void* stream) = 0;
  virtual void apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                               void* stream) = 0;
  virtual TableCounters counters() = 0;
  // Brings the rows of keys up to the first tier (keys without a row are ignored); a backend or
  // table without tiers does nothing. Throws Error(IO_ERROR) when the tier's file fails.
  virtual void prefetch(const int64_t* /*keys*/, size_t /*n*/, void* /*stream*/) {}

  // Benchmarks only (embstore-perf optimizer): turns dirty marking in the fused update off to
  // measure what it costs. Not exposed in the C API: incremental checkpoints depend on it.
  virtual void set_dirty_tracking(bool on) = 0;

  // ---- snapshots (host/checkpoint/): one at a time per table, driven by the store --------
  // Captures after every earlier call on the table: every live row when full, else the dirty
  // rows; clears the dirty bitmap. No row is copied. From here on a mutating call that meets a
  // captured row writes the row to sink first (copy-on-write, waiting for room), and flushes
  // the sink before it returns, so no staging chunk stays with a table between calls. Returns
  // the rows captured, and the table's rows at the capture in *live_rows.
  virtual uint64_t capture(bool full, SnapshotSink* sink, uint64_t* live_rows) = 0;
  // The keys evicted between the previous capture and this one, repeats included, until
  // end_snapshot: a delta's tombstones, less the keys that have a row again (those are dirty, so
  // the delta holds them as rows).
  virtual const std::vector<int64_t>& evicted_at_capture() const = 0;
  // Moves up to max_rows captured rows into sink (reserve without waiting: stops early when
  // staging is full), then flushes it. sink is the drain's own, not the copy-on-write one, so
  // a backend may drain while training calls run. Returns the rows still captured; 0 once the
  // snapshot is written out, copy-on-write included.
  virtual uint64_t drain(SnapshotSink* sink, uint64_t max_rows) = 0;
  // The snapshot's admission counts as they were at its capture (all of them, or a delta's
  // changes); none when the table has no admission. Capture only shares the counts: the caller
  // (the checkpoint's worker) pays for gathering them. Until end_snapshot.
  virtual std::optional<io::AdmissionFile> admission_at_capture() const = 0;
  // Detaches the sink. After a failed snapshot (failed = true) every row it captured that is
  // still live is marked dirty again, and its tombstones are pending again, so the next
  // checkpoint still writes them.
  virtual void end_snapshot(bool failed) = 0;

  // ---- eviction (see "Eviction" in embstore.h) ----------------------------------------------
  // Evicts every live row whose last-touched step is below cutoff_step; returns how many. A
  // captured row is written to the snapshot first.
  virtual uint64_t evict_before(uint64_t cutoff_step) = 0;

  // ---- creation ---------------------------------------------------------------------------
  // Faults the rows allocated up front (initial_capacity) in behind the caller's back, where a
  // backend's memory arrives at its first touch (the host's; device memory is committed at
  // create). For a table a user creates; a restore's table reserve()s what it loads instead,
  // since its initial_capacity is read from a manifest.
  virtual void prefault_initial_capacity() {}

  // ---- restore ---------------------------------------------------------------------------
  // Loads whole saved admission counts (a chain's, merged), after the rows are loaded: keys
  // that have a row drop their counts. Returns false, with the reason in *why, when the table
  // cannot use them (no admission, another kind of counting).
  virtual bool load_admission(const io::AdmissionFile& counts, std::string* why) = 0;
  // Makes room for `rows` more rows at once (arena, bitmaps and index at their final size; no
  // more than the row limit allows), so a restore that knows its row count loads without
  // growing or rehashing.
  virtual void reserve(uint64_t rows) = 0;
  // Whether load_rows can skip the keys the table holds (else the caller must drop them).
  virtual bool skips_held_keys() const { return false; }
  // Inserts n rows with their values (n x dim) and optimizer state (n x state_dim) from host
  // memory, rows stamped with step, none dirty. For a table being restored, newest version
  // first: with skip_held (where skips_held_keys()), a row whose key the table already holds
  // (from a newer version) is left out; without, keys must be distinct and absent.
  // Throws Error(CAPACITY_EXCEEDED) past max_capacity. For a table being restored aside only:
  // after a throw the table may be inconsistent and must be dropped.
  virtual void load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                         uint64_t step, bool skip_held) = 0;

  // A restore short of memory (embstore_spill_t) parks the tables it replaces: spill() writes
  // the rows' memory (values, state, keys and steps) to file and gives it back to the system;
  // the index, bitmaps and counts stay. The table must not be used until unspill() has read it
  // back, or it is destroyed. Both throw Error(IO_ERROR) when the file fails: spill() then
  // leaves the table as it was; unspill() leaves rows not read back. Backends whose rows are
  // not in host memory (CUDA) do not spill.
  virtual bool can_spill() const { return false; }
  virtual void spill(SpillFile& /*file*/) {}
  virtual void unspill(SpillFile& /*file*/) {}

  // ---- rows moving whole between tables (a stack: host/table/stacked_table.hpp) --------------
  // None of these is an insert or an eviction: no counts change (inserted, admitted, evicted), no
  // tombstones. Keys are in host memory. The host and CUDA tables implement them; a stack does
  // not (stacks do not nest), and its calls of them would throw INTERNAL.
  // The table's live rows, exactly.
  virtual uint64_t live_rows();
  // held[i] = 1 where the table holds keys[i], else 0.
  virtual void find_held(const int64_t* keys, size_t n, uint8_t* held);
  // Takes the rows of keys (distinct; keys the table does not hold are skipped) out of the table
  // and appends them to *out. A row a snapshot in flight captured is written to it first
  // (copy-on-write). Throws with nothing taken (out as it was), but for a device error.
  virtual void take_rows(const int64_t* keys, size_t n, MovedRows* out);
  // Takes out up to `count` least recently used rows touched before `before_step` (the order of
  // eviction at max_capacity), sparing the rows of spare[0, n_spare); as take_rows.
  virtual void take_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                            size_t n_spare, MovedRows* out);
  // Makes room for a put_rows of up to n rows, so that it cannot fail but for a device error
  // (memory; a tiered table's frames, moving rows down). Throws (OUT_OF_MEMORY, IO_ERROR, ...)
  // with no row lost; until the put, the table must get no other call. On a table without tiers
  // the room (row ids, index) also serves the inserts of its next call.
  virtual void reserve_put(uint64_t n);
  // Puts rows (keys distinct, none held) in, as they were: stamps, dirty bits, records; none
  // captured. A row in_snapshot is marked dirty if the snapshot in flight fails (end_snapshot),
  // at once when none is. Throws with nothing put: CAPACITY_EXCEEDED past max_capacity, or what
  // making room throws where reserve_put did not make it.
  virtual void put_rows(const MovedRows& rows);
  // A stack's eviction at its row limit: it lists each table's candidates, then evicts its
  // choice among them from each.
  // Lists up to `count` of the least recently used rows touched before `before_step` (the order
  // of eviction at max_capacity, as take_coldest), sparing the rows of spare[0, n_spare), in no
  // order, into *out; returns how many rows are candidates in all. Changes nothing.
  virtual uint64_t list_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                                size_t n_spare, std::vector<RowAge>* out);
  // Evicts the rows of keys (distinct; keys the table does not hold are skipped): unlike the
  // moves above an eviction, counted, tombstones left; a captured row is written to the snapshot
  // first. Returns the rows evicted.
  virtual uint64_t evict_keys(const int64_t* keys, size_t n);
  // A stack's admission at its row limit, on a table that counts on the host (the host table;
  // a CUDA table with TableSpec::counts_on_host). keys[0, n): a call's occurrences of keys that
  // no table of the stack holds, in call order. Returns how many distinct keys an insert of them
  // admits. With `count`, counts them as an insert refused at the row limit does (they stay
  // counted, none is admitted); without, changes nothing.
  virtual uint64_t count_admission(const int64_t* keys, size_t n, uint64_t step, bool count);

 private:
  TableSpec spec_;
};

}  // namespace embstore
