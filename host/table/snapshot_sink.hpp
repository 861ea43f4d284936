// Where a table puts the rows of a snapshot: the staging ring of the checkpoint pipeline
// (host/checkpoint/staging.*). A table writes records laid out by row::write_record
// (cuda/row/snapshot.h): key, value, optimizer state.
#pragma once

#include <chrono>
#include <cstdint>

namespace embstore {

class SnapshotSink {
 public:
  virtual ~SnapshotSink() = default;
  // Host memory for up to `rows` records (at least 1 when it succeeds), in *granted; page-
  // aligned and, on the CUDA backend, pinned. With wait, blocks while staging is full (the wait
  // is counted as a training stall); without (drain), returns nullptr when no room is free,
  // and may keep some room for the callers that wait. nullptr with wait: the snapshot was
  // aborted, nothing needs writing any more.
  virtual char* reserve(uint64_t rows, bool wait, uint64_t* granted) = 0;
  // The first `rows` records of the last reserve() are filled.
  virtual void commit(uint64_t rows) = 0;
  // Hands every committed record to the writer. Called by drain() before it returns.
  virtual void flush() = 0;
  // Rows copied out by copy-on-write (statistics).
  virtual void count_copy_on_write(uint64_t rows) = 0;
};

// When a drain() that needs the table's lock gives way to training calls (the CUDA backend's,
// which shares the table's stream order; the host backend drains beside training). It gives
// way while calls want the table, but not for longer than kPatience in a row: two threads
// training one table keep it wanted nearly all the time, and rows that training does not touch
// must get written all the same. Only the drain thread uses it.
class DrainTurn {
 public:
  static constexpr std::chrono::microseconds kPatience{2000};

  // busy: a call holds or wants the table. True: skip this drain.
  bool give_way(bool busy) {
    if (!busy) {
      waiting_ = false;
      return false;
    }
    const auto now = std::chrono::steady_clock::now();
    if (!waiting_) {
      waiting_ = true;
      since_ = now;
      return true;
    }
    if (now - since_ < kPatience) return true;
    waiting_ = false;
    return false;
  }

 private:
  bool waiting_ = false;
  std::chrono::steady_clock::time_point since_;
};

}  // namespace embstore
