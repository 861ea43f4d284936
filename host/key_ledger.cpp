#include "host/key_ledger.hpp"

#include "host/error.hpp"
#include "io/admission_file.hpp"

namespace embstore {

void KeyLedger::abort_capture() {
  if (frozen_) {
    admission_->end_freeze(false);
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
    admission_->end_freeze(!failed);
    frozen_.reset();  // later counting stops copying what it changes
  }
}

bool KeyLedger::load_admission(const std::vector<std::string>& files, std::string* why,
                               const std::function<bool(int64_t)>& has_row) {
  if (!admission_) {
    *why = "the table has no admission (admit_after <= 1)";
    return false;
  }
  std::vector<char> merged;
  std::string detail;
  if (io::merge_admission_files(files, &merged, &detail) < 0) {
    fail(EMBSTORE_CORRUPT, "the admission counts do not merge: {}", detail);
  }
  if (!admission_->load(std::string(merged.begin(), merged.end()), why)) return false;
  admission_->drop_if(has_row);
  return true;
}

}  // namespace embstore
