// A fixed pool of worker threads for the host backend. parallel_for splits a range into
// contiguous parts; results must not depend on the split (every caller writes disjoint
// outputs), which is what keeps the host backend deterministic for any thread count.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace embstore {

class ThreadPool {
 public:
  // threads: total parallelism including the calling thread; 0 means one per core. Throws
  // OUT_OF_MEMORY, having joined the threads it started, when a thread cannot be created.
  explicit ThreadPool(unsigned threads);
  ~ThreadPool();

  // The most threads a store may ask for (its host_threads): 4 per core, at least 16.
  static unsigned max_threads();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  unsigned size() const { return size_; }

  // Runs f(begin, end) over parts of [0, n), each at least min_grain long, and waits; the
  // first exception thrown by a part is rethrown here.
  template <typename F>
  void parallel_for(size_t n, size_t min_grain, F&& f) {
    if (n == 0) return;
    const size_t grain = min_grain == 0 ? 1 : min_grain;
    size_t parts = (n + grain - 1) / grain;
    if (parts > size_) parts = size_;
    if (parts <= 1) {
      f(size_t{0}, n);
      return;
    }
    run(parts, [&](size_t part) { f(n * part / parts, n * (part + 1) / parts); });
  }

 private:
  void run(size_t parts, const std::function<void(size_t)>& body);
  void stop_workers() noexcept;
  void worker();
  void do_parts();

  unsigned size_;
  std::vector<std::thread> workers_;
  std::mutex submit_mutex_;  // one parallel_for at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(size_t)>* body_ = nullptr;
  size_t parts_ = 0, next_part_ = 0, finished_parts_ = 0;
  unsigned long generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace embstore
