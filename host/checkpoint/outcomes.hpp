// What a store knows of the checkpoints it took: each one's outcome and figures
// (embstore_checkpoint_wait, embstore_checkpoint_info), whether a failure has been told, and
// the totals (embstore_checkpoint_stats). Not thread-safe: the checkpointer holds its lock
// around every call.
#pragma once

#include <embstore/embstore.h>

#include <cstdint>
#include <map>
#include <string>

#include "host/checkpoint/job.hpp"
#include "host/checkpoint/staging.hpp"

namespace embstore::checkpoint {

class Outcomes {
 public:
  static constexpr size_t kMax = 4096;  // the oldest are forgotten

  // job's figures so far; ring is the staging ring it drains through (null: none any more).
  // rows and bytes written count once committed.
  static embstore_checkpoint_info_t info_of(const Job& job, const StagingRing* ring,
                                            bool committed);

  // A job is about to start for version: an older outcome of that version is forgotten.
  void starting(uint64_t version) { outcomes_.erase(version); }
  // The job ended with status (its message for a failure); info is its final figures.
  void ended(const Job& job, embstore_status_t status, const std::string& message,
             const embstore_checkpoint_info_t& info);
  // A job that ended without its outcome (the checkpointer's own bookkeeping failed).
  void lost() { ++failed_; }

  // embstore_checkpoint_info of a version that ended; false when this store has none.
  bool info(uint64_t version, embstore_checkpoint_info_t* out) const;
  // embstore_checkpoint_wait: the outcome of version, which counts as told; false when this
  // store has none.
  bool take(uint64_t version, embstore_status_t* status, std::string* message);
  // The first failure nobody has been told of (only those of policy checkpoints when
  // policy_only), which then counts as told; false when there is none.
  bool take_untold(bool policy_only, embstore_status_t* status, std::string* message);

  // A checkpoint call waited for the one in flight (a training stall).
  void waited(double seconds);
  void captured(double seconds) { capture_seconds_last_ = seconds; }
  // The totals, with the staging rings' counters (those of rings replaced, and the current).
  embstore_checkpoint_stats_t stats(const StallStats& rings, bool in_flight,
                                    uint64_t deferred) const;

 private:
  struct Outcome {
    embstore_status_t status = EMBSTORE_OK;
    std::string message;
    bool told = false;
    bool from_policy = false;
    embstore_checkpoint_info_t info{};
  };

  std::map<uint64_t, Outcome> outcomes_;
  uint64_t committed_ = 0, failed_ = 0, rows_written_ = 0, bytes_written_ = 0;
  uint64_t deltas_committed_ = 0;
  uint64_t last_version_ = EMBSTORE_LATEST;
  double wait_stall_total_ = 0, wait_stall_max_ = 0, capture_seconds_last_ = 0;
};

}  // namespace embstore::checkpoint
