// What a table keeps about keys beside its rows, the same on every backend (its memory is host
// memory on both): the admission counts, and the keys evicted since the last capture (the next
// delta's tombstones), each with the part that a snapshot in progress took over. Used under
// the table's lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/admission/admission.hpp"
#include "host/table/table.hpp"

namespace embstore {

class KeyLedger {
 public:
  // Admission counted on the host (AdmissionCounter::make), or, when counts is given, kept by
  // the backend (a CUDA table's device counts), which counts them itself.
  explicit KeyLedger(const TableSpec& spec, std::unique_ptr<AdmissionCounts> counts = nullptr);

  // The host counter; null when every key is admitted at once or the backend counts.
  AdmissionCounter* admission() const { return counter_; }
  bool has_admission() const { return counts_ != nullptr; }
  AdmissionCounts* counts() const { return counts_.get(); }
  uint64_t pending_admission() const { return counts_ ? counts_->pending() : 0; }
  // Table::count_admission, on the host counter (INTERNAL without one).
  uint64_t count_admission(const int64_t* keys, size_t n, uint64_t step, bool count,
                           const std::string& table);

  // Makes room for n tombstones, so that evicted() cannot fail for them: the caller evicts
  // between the two.
  void reserve_evicted(size_t n) { evicted_keys_.reserve(evicted_keys_.size() + n); }
  void evicted(const int64_t* keys, size_t n) {
    evicted_keys_.insert(evicted_keys_.end(), keys, keys + n);
    evicted_total_ += n;
  }
  uint64_t evicted_total() const { return evicted_total_; }
  // An idle pass at cutoff_step: counts of keys idle as long go too (otherwise they only grow).
  void forget_before(uint64_t cutoff_step) {
    if (counts_) counts_->forget_before(cutoff_step);
  }

  // ---- a snapshot: begin_capture before the table's bits move (it allocates; a failure
  // changes nothing), then commit_capture, or abort_capture where the capture failed; then
  // end_snapshot.
  void begin_capture(bool full) {
    if (counts_) frozen_ = counts_->freeze(full);
  }
  void abort_capture();
  // The tombstones go with the snapshot: the checkpoint's worker sorts them out, not the
  // training thread.
  void commit_capture() {
    snapshot_evicted_keys_.swap(evicted_keys_);
    evicted_keys_.clear();
  }
  // Failed: the tombstones are pending again and the counts' changes go into the next
  // checkpoint.
  void end_snapshot(bool failed);
  const std::vector<int64_t>& evicted_at_capture() const { return snapshot_evicted_keys_; }
  std::optional<io::AdmissionFile> admission_at_capture() const {
    if (!frozen_) return std::nullopt;
    return frozen_->counts();
  }

  // Table::load_admission: loads whole counts, then drops the counts of keys for which
  // has_row(key). Returns false, with the reason in *why, when the table cannot use them.
  bool load_admission(const io::AdmissionFile& counts, std::string* why,
                      const std::function<bool(int64_t)>& has_row);

 private:
  std::unique_ptr<AdmissionCounts> counts_;
  AdmissionCounter* counter_ = nullptr;                    // counts_, when counted on the host
  std::unique_ptr<const AdmissionCounts::Frozen> frozen_;  // shares the counts until they change
  std::vector<int64_t> evicted_keys_, snapshot_evicted_keys_;
  uint64_t evicted_total_ = 0;
};

}  // namespace embstore
