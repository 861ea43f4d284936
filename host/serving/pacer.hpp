// The pace of a follower's polls (FollowerOptions::apply_bytes_per_second).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

#include "host/error.hpp"

namespace embstore::serving {

// Spreads a poll's reading over time: add(bytes) after that many bytes were read sleeps until
// bytes_per_second allows them (0: never sleeps). Lookups share the memory bandwidth and the
// caches with the poll; spreading its bytes leaves them more of both, for a longer lag.
// The sleep checks *cancel every few milliseconds and throws Error(BUSY) once it is set (a
// follower being closed does not wait out a slow pace).
class Pacer {
 public:
  explicit Pacer(uint64_t bytes_per_second, const std::atomic<bool>* cancel = nullptr)
      : rate_(bytes_per_second), cancel_(cancel), start_(std::chrono::steady_clock::now()) {}
  void add(uint64_t bytes);

 private:
  uint64_t rate_;
  const std::atomic<bool>* cancel_;
  std::chrono::steady_clock::time_point start_;
  double bytes_ = 0;
};

inline void Pacer::add(uint64_t bytes) {
  bytes_ += static_cast<double>(bytes);
  if (rate_ == 0) return;
  // In seconds as doubles: a small rate makes the due time far off, past what a clock's
  // 64-bit nanoseconds hold.
  const double due = bytes_ / static_cast<double>(rate_);
  for (;;) {
    if (cancel_ != nullptr && cancel_->load(std::memory_order_relaxed)) {
      fail(EMBSTORE_BUSY, "a paced poll was cancelled: the follower is being closed");
    }
    const double left =
        due - std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    if (left <= 0) return;
    std::this_thread::sleep_for(std::chrono::duration<double>(std::min(left, 0.02)));
  }
}

}  // namespace embstore::serving
