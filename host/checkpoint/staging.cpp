#include "host/checkpoint/staging.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <new>

#include "host/backend/backends.hpp"

namespace embstore::checkpoint {

namespace {
// Small enough that a drain holds a table only briefly (a 1 MiB copy), large enough that the
// ring's bookkeeping stays negligible.
constexpr size_t kMaxChunkBytes = size_t{1} << 20;
constexpr size_t kPage = 4096;
}  // namespace

StagingRing::StagingRing(size_t staging_bytes, size_t min_chunk_bytes, int pin_device) {
  chunk_bytes_ = std::min(kMaxChunkBytes, staging_bytes / 8);
  chunk_bytes_ = std::max(chunk_bytes_, min_chunk_bytes);
  chunk_bytes_ = (chunk_bytes_ + kPage - 1) / kPage * kPage;
  chunks_ = std::max<size_t>(2, staging_bytes / chunk_bytes_);
  cow_reserve_ = chunks_ / 4;
  mapped_ = chunks_ * chunk_bytes_;
  void* p = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  base_ = static_cast<char*>(p);
  if (pin_device >= 0) {
    pin_host_memory(base_, mapped_, pin_device);
    pin_device_ = pin_device;
  }
  for (size_t i = chunks_; i-- > 0;) free_.push_back(static_cast<unsigned>(i));
}

StagingRing::~StagingRing() {
  if (pin_device_ >= 0) unpin_host_memory(base_, pin_device_);
  munmap(base_, mapped_);
}

bool StagingRing::pop(Full* out) {
  std::lock_guard lock(mutex_);
  if (full_.empty()) return false;
  *out = full_.front();
  full_.pop_front();
  return true;
}

void StagingRing::release(unsigned chunk) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(chunk);
  }
  changed_.notify_all();
}

void StagingRing::wait_for_change(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return !full_.empty() || aborted_; });
}

void StagingRing::wait_for_free(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  changed_.wait_for(lock, timeout, [&] { return free_.size() > cow_reserve_ || aborted_; });
}

void StagingRing::abort() {
  {
    std::lock_guard lock(mutex_);
    aborted_ = true;
  }
  changed_.notify_all();
}

void StagingRing::reset() {
  std::lock_guard lock(mutex_);
  aborted_ = false;
  full_.clear();
  free_.clear();
  for (size_t i = chunks_; i-- > 0;) free_.push_back(static_cast<unsigned>(i));
}

StallStats StagingRing::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

int StagingRing::take_free(std::unique_lock<std::mutex>& lock, bool wait) {
  if (free_.empty() && wait && !aborted_) {
    const auto start = std::chrono::steady_clock::now();
    changed_.wait(lock, [&] { return !free_.empty() || aborted_; });
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    stats_.seconds_total += s;
    stats_.seconds_max = std::max(stats_.seconds_max, s);
    ++stats_.waits;
  }
  if (aborted_ || free_.empty() || (!wait && free_.size() <= cow_reserve_)) return -1;
  const unsigned c = free_.back();
  free_.pop_back();
  return static_cast<int>(c);
}

void StagingRing::queue(uint32_t table, int chunk, uint64_t rows) {
  if (rows == 0 || aborted_) {
    free_.push_back(static_cast<unsigned>(chunk));
  } else {
    full_.push_back({table, static_cast<unsigned>(chunk), base_ + chunk * chunk_bytes_, rows});
  }
  changed_.notify_all();
}

char* StagingRing::Sink::reserve(uint64_t rows, bool wait, uint64_t* granted) {
  const uint64_t capacity = ring_.chunk_bytes_ / record_bytes_;
  if (chunk_ < 0 || filled_ == capacity) {
    std::unique_lock lock(ring_.mutex_);
    if (chunk_ >= 0) ring_.queue(table_, chunk_, filled_);
    filled_ = 0;
    chunk_ = ring_.take_free(lock, wait);
    if (chunk_ < 0) return nullptr;
  }
  *granted = std::min(rows, capacity - filled_);
  return ring_.base_ + chunk_ * ring_.chunk_bytes_ + filled_ * record_bytes_;
}

void StagingRing::Sink::flush() {
  if (chunk_ < 0) return;
  {
    std::lock_guard lock(ring_.mutex_);
    ring_.queue(table_, chunk_, filled_);
  }
  chunk_ = -1;
  filled_ = 0;
}

void StagingRing::Sink::count_copy_on_write(uint64_t rows) {
  std::lock_guard lock(ring_.mutex_);
  ring_.stats_.copy_on_write_rows += rows;
}

}  // namespace embstore::checkpoint
