// Host memory of the host backend's tables: anonymous mappings, 2 MiB-aligned where large, that
// can be faulted in ahead of use by several threads.
#pragma once

#include <sys/mman.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <new>
#include <utility>

#include "host/store/thread_pool.hpp"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

namespace embstore {

// Anonymous mapping: pages arrive zeroed on first touch, large ones as huge pages where the
// kernel allows, which saves TLB misses on random row access.
class HostBuffer {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  HostBuffer() = default;
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes < kHugePage) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
      data_ = p;
      return;
    }
    // Huge pages need 2 MiB alignment, which mmap does not promise: map more, trim the ends.
    bytes_ = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const size_t mapped = bytes_ + kHugePage;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    const auto base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > base) munmap(p, aligned - base);
    const uintptr_t tail = base + mapped - (aligned + bytes_);
    if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes_), tail);
    data_ = reinterpret_cast<void*>(aligned);
    madvise(data_, bytes_, MADV_HUGEPAGE);
  }
  ~HostBuffer() {
    if (data_) munmap(data_, bytes_);
  }
  HostBuffer(HostBuffer&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

  // Faults in [offset, offset + bytes) now, in slices over the pool's threads, so that the
  // writes that fill it later (a restore's copies) take no page fault each: the kernel zeroes
  // pages on first touch, which is most of a restore's time when one thread does it. For
  // memory no other thread uses meanwhile. MADV_POPULATE_WRITE (Linux 5.14) where the kernel
  // has it, else every 4 KiB page of the range written with the byte it holds.
  void populate(ThreadPool& pool, size_t offset, size_t bytes) const {
    if (data_ == nullptr || offset >= bytes_) return;
    bytes = std::min(bytes, bytes_ - offset);
    constexpr size_t kSlice = kHugePage;
    const size_t first = offset / kSlice, end = (offset + bytes + kSlice - 1) / kSlice;
    char* base = static_cast<char*>(data_);
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
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace embstore
