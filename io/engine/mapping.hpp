// Anonymous memory for large buffers: a private mapping whose pages arrive zeroed on first
// touch, 2 MiB-aligned and advised onto huge pages where it holds at least one.
//
// Two users need huge pages for different reasons. The host backend's tables (HostBuffer) save
// TLB misses on random row access. The I/O engine's staging buffers (Channel) save segments: an
// O_DIRECT request is split where its buffer is not physically contiguous, and a virtio disk
// takes at most max_segments (254 here) per request, which 4 KiB pages cap at about 1 MiB; on 2
// MiB pages a 4 MiB read is one request (max_sectors_kb). A 10M-row restore went from 3.1 to 2.4 s
// with that alone (README, "How the restore is fast").
#pragma once

#include <sys/mman.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <utility>

namespace embstore::io {

class Mapping {
 public:
  static constexpr size_t kHugePage = size_t{2} << 20;

  Mapping() = default;
  ~Mapping() { reset(); }
  Mapping(Mapping&& o) noexcept
      : data_(std::exchange(o.data_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  Mapping& operator=(Mapping&& o) noexcept {
    std::swap(data_, o.data_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // Maps at least `bytes` (a multiple of kHugePage from kHugePage on). 0, or -ENOMEM (also for
  // bytes == 0); *out is left as it was on failure.
  static int map(size_t bytes, Mapping* out) {
    if (bytes == 0) return -ENOMEM;
    Mapping m;
    if (bytes < kHugePage) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return -ENOMEM;
      m.data_ = p;
      m.bytes_ = bytes;
      *out = std::move(m);
      return 0;
    }
    // Huge pages need 2 MiB alignment, which mmap does not promise: map more, trim the ends.
    if (bytes > SIZE_MAX - 2 * kHugePage) return -ENOMEM;
    const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
    const size_t mapped = rounded + kHugePage;
    void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return -ENOMEM;
    const auto base = reinterpret_cast<uintptr_t>(p);
    const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
    if (aligned > base) munmap(p, aligned - base);
    const uintptr_t tail = base + mapped - (aligned + rounded);
    if (tail > 0) munmap(reinterpret_cast<void*>(aligned + rounded), tail);
    m.data_ = reinterpret_cast<void*>(aligned);
    m.bytes_ = rounded;
    // Advice only: where the kernel has no transparent huge pages the mapping works the same.
    (void)madvise(m.data_, m.bytes_, MADV_HUGEPAGE);
    *out = std::move(m);
    return 0;
  }

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

  void reset() {
    if (data_ != nullptr) munmap(data_, bytes_);
    data_ = nullptr;
    bytes_ = 0;
  }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace embstore::io
