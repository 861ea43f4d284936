// Anonymous memory for large buffers: a private mapping whose pages arrive zeroed on first
// touch, 2 MiB-aligned and advised onto huge pages where it holds at least one.
//
// Two users need huge pages for different reasons. The host backend's tables (HostBuffer) save
// TLB misses on random row access. The I/O engine's staging buffers (Channel) save segments: an
// O_DIRECT request is split where its buffer is not physically contiguous, and a virtio disk
// takes at most max_segments (254 here) per request, which 4 KiB pages cap at about 1 MiB; on 2
// MiB pages (where the kernel gives them) a 4 MiB read is one request (max_sectors_kb). A 10M-row
// restore went from 3.1 to 2.4 s with that alone (README, "How the restore is fast").
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
    if (this != &o) {
      reset();
      data_ = std::exchange(o.data_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // Where in a mapping of `mapped` bytes at `base` (mapped = rounded + kHugePage) the
  // 2 MiB-aligned span of `rounded` bytes starts, and how much to unmap before and after it.
  struct Trim {
    uintptr_t start;
    size_t head, tail;
  };
  static Trim trim(uintptr_t base, size_t mapped, size_t rounded) {
    const uintptr_t start = (base + kHugePage - 1) / kHugePage * kHugePage;
    return {start, static_cast<size_t>(start - base),
            static_cast<size_t>(base + mapped - (start + rounded))};
  }

  // Maps at least `bytes` (from kHugePage on, whole huge pages). 0, -ENOMEM for 0 bytes or a
  // size past the address space, or mmap's -errno; *out is left as it was on failure. With
  // huge pages, buffers registered with io_uring are charged to the locked-memory limit by the
  // whole huge page.
  static int map(size_t bytes, Mapping* out) {
    if (bytes == 0) return -ENOMEM;
    Mapping m;
    if (bytes < kHugePage) {
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p == MAP_FAILED) return -errno;
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
    if (p == MAP_FAILED) return -errno;
    const Trim t = trim(reinterpret_cast<uintptr_t>(p), mapped, rounded);
    if (t.head > 0) munmap(p, t.head);
    if (t.tail > 0) munmap(reinterpret_cast<void*>(t.start + rounded), t.tail);
    m.data_ = reinterpret_cast<void*>(t.start);
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
