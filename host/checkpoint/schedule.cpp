#include "host/checkpoint/schedule.hpp"

#include <utility>

namespace embstore::checkpoint {

void Schedule::set(Policy policy, uint64_t step) {
  policy_ = std::move(policy);
  restart(step);
}

void Schedule::restart(uint64_t step) {
  full_step_ = incr_step_ = step;
  full_time_ = incr_time_ = Clock::now();
  full_due_ = incr_due_ = false;
}

std::optional<bool> Schedule::take(uint64_t step, bool in_flight) {
  if (policy_.dir.empty()) return std::nullopt;
  const auto now = Clock::now();
  auto crossed = [&](uint64_t every, uint64_t mark) {
    return every > 0 && step / every > mark / every;
  };
  auto elapsed = [&](double every, Clock::time_point mark) {
    return every > 0 && std::chrono::duration<double>(now - mark).count() >= every;
  };
  const bool due_full = full_due_ || crossed(policy_.full_every_steps, full_step_) ||
                        elapsed(policy_.full_every_seconds, full_time_);
  const bool due_incr = incr_due_ || crossed(policy_.incremental_every_steps, incr_step_) ||
                        elapsed(policy_.incremental_every_seconds, incr_time_);
  if (!due_full && !due_incr) return std::nullopt;
  if (in_flight) {
    // Deferred, never skipped: the rows stay dirty and go with a later one.
    full_due_ = due_full;
    incr_due_ = due_incr;
    ++deferred_;
    return std::nullopt;
  }
  full_due_ = incr_due_ = false;
  // A full checkpoint also holds every change an incremental one would.
  incr_step_ = step;
  incr_time_ = now;
  if (due_full) {
    full_step_ = step;
    full_time_ = now;
  }
  return due_full;
}

void Schedule::retry(bool full) { (full ? full_due_ : incr_due_) = true; }

}  // namespace embstore::checkpoint
