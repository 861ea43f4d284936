// The staging ring of the snapshot pipeline (docs/DESIGN.md, "Snapshot pipeline"): a
// bounded set of equal chunks of host memory (pinned on the CUDA backend), sized by the
// store's staging_bytes. Tables fill chunks with records (drain by the checkpoint worker,
// copy-on-write by training calls), one table per chunk; the worker writes full chunks to the
// table's row file and frees them. When every chunk is taken, copy-on-write waits: that wait
// is the training stall the pipeline reports.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "host/table/snapshot_sink.hpp"

namespace embstore::checkpoint {

struct StallStats {
  double seconds_total = 0;
  double seconds_max = 0;
  uint64_t waits = 0;
  uint64_t copy_on_write_rows = 0;
};

class StagingRing {
 public:
  // A chunk is the smaller of 1 MiB and an eighth of staging_bytes, and at least
  // min_chunk_bytes (one record of the widest table). Pinned for pin_device (a CUDA device
  // ordinal) unless it is -1.
  StagingRing(size_t staging_bytes, size_t min_chunk_bytes, int pin_device);
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  size_t chunk_bytes() const { return chunk_bytes_; }
  size_t chunks() const { return chunks_; }

  struct Full {
    uint32_t table = 0;  // the sink's table index
    unsigned chunk = 0;
    const char* data = nullptr;
    uint64_t rows = 0;
  };
  // The worker's side. Takes the oldest full chunk; false when there is none.
  bool pop(Full* out);
  // Gives a popped chunk back.
  void release(unsigned chunk);
  // Waits until a chunk is queued (or the ring aborted), or until timeout.
  void wait_for_change(std::chrono::milliseconds timeout);
  // Waits until drain may take a chunk (see take_free) or the ring aborted, or until timeout.
  void wait_for_free(std::chrono::milliseconds timeout);

  // After a failed write: every reserve() returns nullptr from now on, and waiters wake up.
  void abort();
  // After every table of a snapshot has ended: all chunks free, not aborted, stats kept.
  void reset();

  // One table's producer side: the SnapshotSink a table gets at capture.
  class Sink final : public SnapshotSink {
   public:
    Sink(StagingRing& ring, uint32_t table, uint64_t record_bytes)
        : ring_(ring), table_(table), record_bytes_(record_bytes) {}
    char* reserve(uint64_t rows, bool wait, uint64_t* granted) override;
    void commit(uint64_t rows) override { filled_ += rows; }
    void flush() override;
    void count_copy_on_write(uint64_t rows) override;

   private:
    StagingRing& ring_;
    uint32_t table_;
    uint64_t record_bytes_;
    int chunk_ = -1;  // the chunk being filled
    uint64_t filled_ = 0;
  };

  StallStats stats() const;

 private:
  // Both under mutex_. take_free: a free chunk or -1, waiting (and counting the wait) when
  // wait is set (copy-on-write); without wait (drain), only while more than cow_reserve_ are
  // free, so that drain running ahead does not make training calls wait. queue: hands a filled
  // chunk to the worker, or frees it when empty.
  int take_free(std::unique_lock<std::mutex>& lock, bool wait);
  void queue(uint32_t table, int chunk, uint64_t rows);

  size_t chunk_bytes_ = 0;
  size_t chunks_ = 0;
  size_t cow_reserve_ = 0;  // a quarter of the chunks
  char* base_ = nullptr;
  size_t mapped_ = 0;
  int pin_device_ = -1;

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<unsigned> free_;
  std::deque<Full> full_;
  bool aborted_ = false;
  StallStats stats_;
};

}  // namespace embstore::checkpoint
