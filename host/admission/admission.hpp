// Feature admission: counts the occurrences of keys without a row until they reach the
// table's admit_after (see "Admission" in include/embstore/embstore.h). One per table, used
// under the table's lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "host/table.hpp"

namespace embstore {

class AdmissionCounter {
 public:
  // Exact counting, or a counting Bloom filter when spec.admit_bloom_bytes is set; null when
  // spec.admit_after <= 1 (every key is admitted at once).
  static std::unique_ptr<AdmissionCounter> make(const TableSpec& spec);
  virtual ~AdmissionCounter() = default;

  // Counts one occurrence of key at step; true once the key has reached admit_after (and at
  // every later occurrence until admitted() drops it).
  virtual bool count(int64_t key, uint64_t step) = 0;
  // The key got its row.
  virtual void admitted(int64_t key) = 0;
  // Drops the counts of keys last seen before step (exact counting only); returns how many.
  virtual uint64_t forget_before(uint64_t step) = 0;
  // Drops the counts of keys for which has_row(key) (exact counting only).
  virtual void drop_if(const std::function<bool(int64_t)>& has_row) = 0;
  // stats' pending_admission.
  virtual uint64_t pending() const = 0;

  // The counts as they are now, for a checkpoint: shares the counters' memory instead of
  // copying it (counting later copies the pieces it changes), so it costs the training thread
  // a pointer per 64 KiB. Its bytes() are the checkpoint's admission file:
  //   header: "EMBADMIT", u32 kind (0 exact, 1 Bloom), u32 format 1, u64 n
  //   exact:  n entries of {i64 key, u32 count, u32 zero, u64 last step seen}
  //   Bloom:  n one-byte counters
  class Frozen {
   public:
    virtual ~Frozen() = default;
    virtual std::vector<char> bytes() const = 0;
  };
  virtual std::unique_ptr<const Frozen> freeze() const = 0;
  std::vector<char> save() const { return freeze()->bytes(); }
  // Replaces the counts with saved ones. Returns false, loading nothing, with the reason in
  // *why, when they were saved by the other kind of counting or a filter of another size;
  // throws Error(CORRUPT) when the bytes do not parse.
  virtual bool load(const std::string& bytes, std::string* why) = 0;
};

}  // namespace embstore
