#include "host/eviction/idle_clock.hpp"

#include <algorithm>
#include <chrono>

namespace embstore {

IdleClock::IdleClock() {
  set_source([] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  });
}

void IdleClock::set_source(Source source) {
  std::lock_guard lock(mutex_);
  source_ = std::move(source);
  marks_.clear();  // times of another clock
}

double IdleClock::now() const {
  std::lock_guard lock(mutex_);
  return source_();
}

void IdleClock::mark(uint64_t step, double now, double resolution, double horizon) {
  std::lock_guard lock(mutex_);
  // A restore may move the step back: marks of later steps describe another history.
  while (!marks_.empty() && marks_.back().step > step) marks_.pop_back();
  if (marks_.empty() || now - marks_.back().time >= resolution) marks_.push_back({step, now});
  // The oldest mark is never the answer once the next one is older than the horizon too.
  while (marks_.size() >= 2 && marks_[1].time <= now - horizon) marks_.pop_front();
}

void IdleClock::clear() {
  std::lock_guard lock(mutex_);
  marks_.clear();
}

uint64_t IdleClock::seconds_cutoff(double seconds, double now) const {
  std::lock_guard lock(mutex_);
  uint64_t cutoff = 0;
  for (const Mark& m : marks_) {
    if (m.time > now - seconds) break;
    cutoff = m.step;
  }
  return cutoff;
}

uint64_t idle_cutoff(const TableSpec& spec, uint64_t step, double now, const IdleClock& clock) {
  uint64_t cutoff = 0;
  if (spec.evict_idle_steps != 0 && step > spec.evict_idle_steps) {
    cutoff = step - spec.evict_idle_steps;
  }
  if (spec.evict_idle_seconds != 0) {
    cutoff = std::max(cutoff, clock.seconds_cutoff(spec.evict_idle_seconds, now));
  }
  return cutoff;
}

bool idle_pass_due(const TableSpec& spec, uint64_t previous, uint64_t step, double now,
                   double last_pass_time) {
  if (spec.evict_idle_steps != 0) {
    const uint64_t every = (spec.evict_idle_steps + 7) / 8;
    if (step / every != previous / every) return true;
  }
  return spec.evict_idle_seconds != 0 && now - last_pass_time >= spec.evict_idle_seconds / 8;
}

}  // namespace embstore
