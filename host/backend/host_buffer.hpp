// Host memory of the host backend's tables: anonymous mappings, 2 MiB-aligned where large, that
// can be faulted in ahead of use by several threads.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <new>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "host/store/thread_pool.hpp"
#include "io/engine/mapping.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace embstore {

// Test-only fault injection: fault(bytes) is asked before each HostBuffer is mapped; true fails
// it as a kernel out of memory would (std::bad_alloc). An empty function turns it off. Global
// to the process; tests reset it when done.
void set_host_alloc_fault(std::function<bool(size_t bytes)> fault);
bool host_alloc_fault(size_t bytes);

// A table's memory (io::Mapping): pages arrive zeroed on first touch, large ones as huge pages
// where the kernel allows, which saves TLB misses on random row access.
class HostBuffer {
 public:
  static constexpr size_t kHugePage = io::Mapping::kHugePage;

  HostBuffer() = default;
  // Throws std::bad_alloc where the memory cannot be mapped.
  explicit HostBuffer(size_t bytes) {
    if (host_alloc_fault(bytes)) throw std::bad_alloc();
    if (io::Mapping::map(bytes, &mapping_) < 0) throw std::bad_alloc();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(mapping_.data());
  }
  size_t bytes() const { return mapping_.bytes(); }

  // Gives the memory back to the system: it reads as zeros until written again (a spilled
  // table's, written back from its spill file before use).
  void discard() const {
    if (mapping_.data() != nullptr) madvise(mapping_.data(), mapping_.bytes(), MADV_DONTNEED);
  }

  // Whether the kernel has MADV_POPULATE_WRITE (asked once).
  static bool can_populate() {
    static const bool has = [] {
      // A zero length is accepted exactly where the advice is known.
      alignas(4096) static char probe[4096];
      return madvise(probe, 0, MADV_POPULATE_WRITE) == 0;
    }();
    return has;
  }

  // Faults in [offset, offset + bytes) now, in slices over the pool's threads, so that the
  // writes that fill it later (a restore's copies) take no page fault each: the kernel zeroes
  // pages on first touch, which is most of a restore's time when one thread does it. For
  // memory no other thread uses meanwhile. MADV_POPULATE_WRITE (Linux 5.14) where the kernel
  // has it, else every 4 KiB page of the range written with the byte it holds.
  void populate(ThreadPool& pool, size_t offset, size_t bytes) const {
    if (mapping_.data() == nullptr || offset >= mapping_.bytes()) return;
    bytes = std::min(bytes, mapping_.bytes() - offset);
    constexpr size_t kSlice = kHugePage;
    const size_t first = offset / kSlice, end = (offset + bytes + kSlice - 1) / kSlice;
    char* base = as<char>();
    pool.parallel_for(end - first, 1, [&](size_t begin, size_t stop) {
      const size_t from = std::max(offset, (first + begin) * kSlice);
      const size_t to = std::min(offset + bytes, (first + stop) * kSlice);
      const size_t page = 4096;
      const size_t aligned = from / page * page;
      if (madvise(base + aligned, to - aligned, MADV_POPULATE_WRITE) == 0) return;
      volatile char* bytes_at = base;
      for (size_t at = from; at < to; at = (at / page + 1) * page) bytes_at[at] = bytes_at[at];
    });
  }

 private:
  io::Mapping mapping_;
};

// Faults in ranges of memory, in order, on a thread of its own while its owner goes on using
// them: a restore's reads start at once instead of after the whole table is faulted in, and
// the copies into rows find their pages there when the prefault runs ahead of them. Only with
// MADV_POPULATE_WRITE, which never changes a byte a concurrent writer wrote (a page already
// there is left alone); without it, callers populate() before use instead. The memory must
// stay mapped until stop() or the destructor, which stop early and join.
class Prefaulter {
 public:
  struct Range {
    char* data;
    size_t bytes;
  };

  Prefaulter() = default;
  ~Prefaulter() { stop(); }
  Prefaulter(const Prefaulter&) = delete;
  Prefaulter& operator=(const Prefaulter&) = delete;

  // Starts faulting in ranges, in order, after stopping any earlier run. False where the
  // kernel cannot (HostBuffer::can_populate()) or no thread can be started: then nothing runs.
  bool start(std::vector<Range> ranges) {
    stop();
    if (!HostBuffer::can_populate()) return false;
    stop_.store(false);
    try {
      thread_ = std::thread([this, ranges = std::move(ranges)] {
        for (const Range& r : ranges) {
          for (size_t at = 0; at < r.bytes && !stop_.load(std::memory_order_relaxed);
               at += HostBuffer::kHugePage) {
            const size_t n = std::min(HostBuffer::kHugePage, r.bytes - at);
            // Rows are used from the start of a page: round the slice out to whole pages.
            const uintptr_t from = reinterpret_cast<uintptr_t>(r.data + at) / 4096 * 4096;
            const uintptr_t to = reinterpret_cast<uintptr_t>(r.data + at + n);
            (void)madvise(reinterpret_cast<void*>(from), to - from, MADV_POPULATE_WRITE);
          }
        }
      });
    } catch (const std::system_error&) {
      return false;
    }
    return true;
  }

  // Stops the run (between 2 MiB slices) and waits for it.
  void stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace embstore
