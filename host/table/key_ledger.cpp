#include "host/table/key_ledger.hpp"

#include <vector>

#include "host/error.hpp"
#include "host/table/spill_file.hpp"

namespace embstore {

KeyLedger::KeyLedger(const TableSpec& spec, std::unique_ptr<AdmissionCounts> counts) {
  if (counts) {
    counts_ = std::move(counts);
    return;
  }
  // A Bloom filter is allocated whole, zeroed 64 KiB at a time: one larger than the memory
  // available would only fail after touching all of it.
  if (spec.admit_bloom_bytes != 0) {
    if (const uint64_t available = available_memory_bytes(); spec.admit_bloom_bytes > available) {
      fail(EMBSTORE_OUT_OF_MEMORY,
           "table '{}': a Bloom filter of {} bytes (admit_bloom_bytes), {} bytes of memory "
           "available",
           spec.name, spec.admit_bloom_bytes, available);
    }
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

uint64_t KeyLedger::count_admission(const int64_t* keys, size_t n, uint64_t step, bool count,
                                    const std::string& table) {
  if (counter_ == nullptr) {
    fail(EMBSTORE_INTERNAL,
         "table '{}': admission asked ahead of a call, but not counted on the host", table);
  }
  if (!count) return counter_->would_admit(keys, n);
  std::vector<int64_t> admitted;
  for (size_t i = 0; i < n; ++i) {
    if (counter_->count(keys[i], step)) admitted.push_back(keys[i]);
  }
  return distinct_keys(admitted);
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
