// Where a table puts the rows of a snapshot: the staging ring of the checkpoint pipeline
// (host/checkpoint/staging.*). A table writes records laid out by row::write_record
// (cuda/row/snapshot.h): key, value, optimizer state.
#pragma once

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

}  // namespace embstore
