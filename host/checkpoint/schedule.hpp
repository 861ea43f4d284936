// The checkpoint policy (embstore_checkpoint_set_policy) and when its checkpoints fall due at
// embstore_step: by steps crossed or seconds passed since the last one it took, a full one
// winning over an incremental one due at the same step, and one due while another is in
// flight deferred to a later step, never skipped. Not thread-safe: the checkpointer holds its
// lock around every call.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace embstore::checkpoint {

struct Policy {
  std::string dir;
  uint64_t full_every_steps = 0, incremental_every_steps = 0;
  double full_every_seconds = 0, incremental_every_seconds = 0;
  uint32_t keep_full = 0;
  // Rebaseline: an incremental checkpoint is taken as a full one once the chain since the
  // last full has this many deltas, or its deltas' bytes exceed this fraction of the full's.
  uint32_t max_chain_length = 32;
  double rebaseline_fraction = 0.5;
  // Every delta also gets values-only files in each table's serving codec, for followers.
  bool serving_deltas = false;
  // A serving-only directory each checkpoint of dir is published to (publish.hpp); empty: none.
  std::string serving_dir;
};

class Schedule {
 public:
  const Policy& policy() const { return policy_; }
  // A new policy; its schedule starts at step.
  void set(Policy policy, uint64_t step);
  // After a restore: the schedule goes on from the restored step.
  void restart(uint64_t step);

  // At step: the kind of checkpoint due now (true: full), marked as taken; none when nothing
  // is due, or when one is due but in_flight (then it is deferred and counted).
  std::optional<bool> take(uint64_t step, bool in_flight);
  // A checkpoint take() gave could not start: due again at the next step.
  void retry(bool full);
  // Policy checkpoints deferred so far.
  uint64_t deferred() const { return deferred_; }

 private:
  using Clock = std::chrono::steady_clock;

  Policy policy_;
  // Where each schedule last fired (or set / restart); due but deferred while another
  // checkpoint was in flight.
  uint64_t full_step_ = 0, incr_step_ = 0;
  Clock::time_point full_time_, incr_time_;
  bool full_due_ = false, incr_due_ = false;
  uint64_t deferred_ = 0;
};

}  // namespace embstore::checkpoint
