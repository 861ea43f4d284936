// When rows count as idle (embstore.h, "Eviction"): the step rule compares a row's last-touched
// step with the current one; the seconds rule needs the time at which a step began, so the
// store notes (step, time) marks as steps go by, a few per idle period rather than one per
// step, and a row is idle for longer than T seconds when its step is older than the newest
// mark taken at least T seconds ago. The clock can be replaced (tests).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <vector>

#include "host/table/table.hpp"

namespace embstore {

class IdleClock {
 public:
  using Source = std::function<double()>;  // seconds, monotonic

  IdleClock();
  void set_source(Source source);
  double now() const;

  // Notes that `step` begins at `now`. resolution: the finest that a table needs (its idle
  // seconds / 64); horizon: the longest idle seconds of any table.
  void mark(uint64_t step, double now, double resolution, double horizon);
  // Forgets every mark: after a restore, whose rows all count as touched at its version.
  void clear();
  // Rows with a last-touched step below this have been idle for longer than `seconds`; 0 while
  // no mark is that old.
  uint64_t seconds_cutoff(double seconds, double now) const;

 private:
  struct Mark {
    uint64_t step;
    double time;
  };
  mutable std::mutex mutex_;
  Source source_;
  std::deque<Mark> marks_;  // oldest first
};

// The idle rules of one table at `step` and `now`: rows whose last-touched step is below the
// result are evicted. 0 when neither rule applies yet.
uint64_t idle_cutoff(const TableSpec& spec, uint64_t step, double now, const IdleClock& clock);

// Whether embstore_step runs the idle rules of a table when the step moves from `previous` to
// `step` (every ceil(N/8) steps: when a multiple is crossed, so the passes fall on the same
// steps after a restore), or `now` is an eighth of the idle seconds past the last pass.
bool idle_pass_due(const TableSpec& spec, uint64_t previous, uint64_t step, double now,
                   double last_pass_time);

}  // namespace embstore
