// Threads that work on a file's blocks out of order while their owner hands them out (or
// writes them) in order: the row file's encoders and decoders (row_file.hpp). The owner adds
// blocks in file order and waits for the oldest; a block no thread has started by then is done
// on the owner's thread, so the owner never idles while a block it needs waits in the queue.
//
// Item: has `bool done`, written under the workers' mutex (read it through done()). State: one
// per thread (a codec and its scratch), default-constructible; the owner passes its own to wait.
// Work must not throw. With 0 threads the owner does every item in wait().
// The destructor stops the threads after the blocks they have started; blocks still queued are
// left undone.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

namespace embstore::io::detail {

template <typename Item, typename State>
class BlockWorkers {
 public:
  using Work = std::function<void(Item&, State&)>;

  // Throws what std::thread does (std::system_error) or std::bad_alloc.
  BlockWorkers(unsigned threads, Work work) : work_(std::move(work)) {
    try {
      for (unsigned i = 0; i < threads; ++i) threads_.emplace_back([this] { run(); });
    } catch (...) {
      stop();
      throw;
    }
  }
  ~BlockWorkers() { stop(); }
  BlockWorkers(const BlockWorkers&) = delete;
  BlockWorkers& operator=(const BlockWorkers&) = delete;

  // Throws std::bad_alloc (the item is then not queued).
  void add(Item* item) {
    {
      std::lock_guard lock(mutex_);
      queue_.push_back(item);
    }
    work_ready_.notify_one();
  }
  bool done(const Item* item) {
    std::lock_guard lock(mutex_);
    return item->done;
  }
  // Until item is done: by the caller, with its own state, when no thread has started it.
  void wait(Item* item, State& caller) {
    std::unique_lock lock(mutex_);
    if (const auto it = std::find(queue_.begin(), queue_.end(), item); it != queue_.end()) {
      queue_.erase(it);
      lock.unlock();
      work_(*item, caller);
      lock.lock();
      item->done = true;
      return;
    }
    finished_.wait(lock, [&] { return item->done; });
  }

 private:
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    work_ready_.notify_all();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  // work_ never throws (the items carry their errors); a thread whose state cannot be made
  // ends, and the owner does what it would have (wait() takes queued items itself).
  void run() {
    std::optional<State> made;
    try {
      made.emplace();
    } catch (...) {
      return;
    }
    State& state = *made;
    std::unique_lock lock(mutex_);
    for (;;) {
      work_ready_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      Item* item = queue_.front();
      queue_.pop_front();
      lock.unlock();
      work_(*item, state);
      lock.lock();
      item->done = true;
      finished_.notify_all();
    }
  }

  Work work_;
  std::mutex mutex_;
  std::condition_variable work_ready_, finished_;
  std::deque<Item*> queue_;
  bool stop_ = false;
  std::vector<std::thread> threads_;  // last: they start once the rest is set up
};

}  // namespace embstore::io::detail
