#include "host/store/thread_pool.hpp"

#include <algorithm>

#include "host/error.hpp"

namespace embstore {

ThreadPool::ThreadPool(unsigned threads) {
  if (threads == 0) threads = std::thread::hardware_concurrency();
  size_ = threads == 0 ? 1 : threads;
  try {
    workers_.reserve(size_ - 1);
    for (unsigned i = 1; i < size_; ++i) workers_.emplace_back([this] { worker(); });
  } catch (const std::exception& e) {
    // The workers started wait on this pool's condition variable: stop and join them before
    // it goes (the destructor does not run for a constructor that throws).
    const size_t started = workers_.size();
    stop_workers();
    fail(EMBSTORE_OUT_OF_MEMORY, "host_threads {}: started {} worker threads, then: {}", size_,
         started, e.what());
  }
}

ThreadPool::~ThreadPool() { stop_workers(); }

void ThreadPool::stop_workers() noexcept {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
}

unsigned ThreadPool::max_threads() {
  return std::max(16u, 4 * std::thread::hardware_concurrency());
}

void ThreadPool::do_parts() {
  std::unique_lock lock(mutex_);
  while (next_part_ < parts_) {
    const size_t part = next_part_++;
    const auto* body = body_;
    lock.unlock();
    try {
      (*body)(part);
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    if (++finished_parts_ == parts_) done_.notify_all();
  }
}

void ThreadPool::worker() {
  unsigned long seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    do_parts();
  }
}

void ThreadPool::run(size_t parts, const std::function<void(size_t)>& body) {
  std::lock_guard submit(submit_mutex_);
  {
    std::lock_guard lock(mutex_);
    body_ = &body;
    parts_ = parts;
    next_part_ = 0;
    finished_parts_ = 0;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  do_parts();
  std::exception_ptr error;
  {
    std::unique_lock lock(mutex_);
    done_.wait(lock, [&] { return finished_parts_ == parts_; });
    body_ = nullptr;
    parts_ = 0;
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace embstore
