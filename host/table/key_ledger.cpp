#include "host/table/key_ledger.hpp"

namespace embstore {

KeyLedger::KeyLedger(const TableSpec& spec, std::unique_ptr<AdmissionCounts> counts) {
  if (counts) {
    counts_ = std::move(counts);
    return;
  }
  std::unique_ptr<AdmissionCounter> counter = AdmissionCounter::make(spec);
  counter_ = counter.get();
  counts_ = std::move(counter);
}

void KeyLedger::abort_capture() {
  if (frozen_) {
    counts_->end_freeze(false);
    frozen_.reset();
  }
}

void KeyLedger::end_snapshot(bool failed) {
  if (failed) {
    evicted_keys_.insert(evicted_keys_.end(), snapshot_evicted_keys_.begin(),
                         snapshot_evicted_keys_.end());
  }
  snapshot_evicted_keys_.clear();
  if (frozen_) {
    counts_->end_freeze(!failed);
    frozen_.reset();  // later counting stops copying what it changes
  }
}

bool KeyLedger::load_admission(const io::AdmissionFile& counts, std::string* why,
                               const std::function<bool(int64_t)>& has_row) {
  if (!counts_) {
    *why = "the table has no admission (admit_after <= 1)";
    return false;
  }
  if (!counts_->load(counts, why)) return false;
  counts_->drop_if(has_row);
  return true;
}

}  // namespace embstore
