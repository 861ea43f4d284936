// Feature admission: counts the occurrences of keys without a row until they reach the
// table's admit_after (see "Admission" in include/embstore/embstore.h). One per table, used
// under the table's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host/table/table.hpp"
#include "io/format/admission_file.hpp"

namespace embstore {

// The counts of keys pending admission as the table's ledger and its checkpoints see them,
// wherever they are counted: on the host (AdmissionCounter, one occurrence at a time), or in a
// CUDA table's device memory (cuda/backend/device_admission.cuh, a batch at a time).
class AdmissionCounts {
 public:
  virtual ~AdmissionCounts() = default;

  // Drops the counts of keys last seen before step (exact counting only); returns how many.
  virtual uint64_t forget_before(uint64_t step) = 0;
  // Drops the counts of keys for which has_row(key) (exact counting only).
  virtual void drop_if(const std::function<bool(int64_t)>& has_row) = 0;
  // stats' pending_admission.
  virtual uint64_t pending() const = 0;

  // The counts for a checkpoint, as they are now: every count (full), or what changed since
  // the last checkpoint that committed (delta: removed keys and changed counts; a Bloom
  // filter always goes whole). Shares the counters' memory instead of copying it (counting
  // later copies the 64 KiB pieces it changes; device counts: one device-to-device copy), so
  // it costs the training thread little; counts() is the checkpoint worker's to pay. One at a
  // time: end_freeze() tells its outcome.
  class Frozen {
   public:
    virtual ~Frozen() = default;
    // Structured; io/format/admission_file.hpp turns them into a file.
    virtual io::AdmissionFile counts() const = 0;
  };
  virtual std::unique_ptr<const Frozen> freeze(bool full) = 0;
  // Committed: the frozen counts are the base of the next delta. Failed: the next checkpoint
  // carries their changes again.
  virtual void end_freeze(bool committed) = 0;
  // Every count now (tests, tools).
  io::AdmissionFile save() {
    const std::unique_ptr<const Frozen> frozen = freeze(true);
    end_freeze(false);
    return frozen->counts();
  }

  // Replaces the counts with whole saved ones (a chain's files merged by
  // io::merge_admission_files). Returns false, loading nothing, with the reason in *why, when
  // they are a delta, were counted the other way, or by a filter of another size.
  virtual bool load(const io::AdmissionFile& counts, std::string* why) = 0;
};

// Counts kept and counted on the host, one occurrence at a time in batch order.
class AdmissionCounter : public AdmissionCounts {
 public:
  // Exact counting, or a counting Bloom filter when spec.admit_bloom_bytes is set; null when
  // spec.admit_after <= 1 (every key is admitted at once).
  static std::unique_ptr<AdmissionCounter> make(const TableSpec& spec);

  // Counts one occurrence of key at step; true once the key has reached admit_after (and at
  // every later occurrence until admitted() drops it). Counts saturate at
  // row::kAdmitMaxCount, as on the device.
  virtual bool count(int64_t key, uint64_t step) = 0;
  // The key got its row.
  virtual void admitted(int64_t key) = 0;
  // How many distinct keys counting the occurrences keys[0, n) (keys without a row, in batch
  // order) would admit, as count() would, changing nothing: a stack of tables at its row limit
  // must know before the call how many rows it inserts (host/table/stacked_table.hpp).
  virtual uint64_t would_admit(const int64_t* keys, size_t n) const = 0;
};

// How many distinct keys `keys` holds (sorts it): the admitted keys of a batch, each counted once
// however many of its occurrences reached admit_after.
uint64_t distinct_keys(std::vector<int64_t>& keys);

}  // namespace embstore
