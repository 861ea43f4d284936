// A restore's spill file: where the host tables a restore replaces park their rows while it
// loads, so it needs about one table's worth of memory beside the store (embstore_spill_t).
// Unnamed (O_TMPFILE; where the file system lacks it, created and unlinked at once), so it
// goes with its descriptor whatever happens to the process. liburing style: every call returns
// 0 or -errno; nothing throws.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace embstore {

class SpillFile {
 public:
  // A new, empty spill file in dir. -errno from open() (ENOENT, EACCES, ...).
  static int open(const std::string& dir, std::unique_ptr<SpillFile>* out);
  ~SpillFile();
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  // Data, lengths and offsets are multiples of this: the file is written with O_DIRECT where
  // the file system takes it (no copy through the page cache, which would need the memory the
  // spill is there to free).
  static constexpr size_t kAlignment = 4096;

  // Appends bytes from data (both kAlignment-aligned; else -EINVAL); *offset is where they
  // went. -ENOSPC, -EIO, ...
  int append(const void* data, size_t bytes, uint64_t* offset);
  // Frees what the file holds in memory: nothing with O_DIRECT; else everything appended is
  // written (fdatasync) and dropped from the page cache (POSIX_FADV_DONTNEED).
  int settle();
  // Reads bytes at offset (appended before; all kAlignment-aligned, else -EINVAL). -EIO when the
  // file is shorter.
  int read(void* data, size_t bytes, uint64_t offset) const;

  uint64_t bytes() const { return end_; }
  // Whether the file lives in memory (tmpfs, ramfs): parking rows there frees nothing.
  bool in_memory() const;

 private:
  SpillFile() = default;
  int fd_ = -1;
  uint64_t end_ = 0;
  bool direct_ = false;
};

// Bytes of memory this process may still take: the kernel's MemAvailable, and below the
// memory.max of its cgroup and of every cgroup above it (cgroup v2) where they have one.
// UINT64_MAX where none can be read.
uint64_t available_memory_bytes();

}  // namespace embstore
