#include "host/table/spill_file.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

namespace embstore {

int SpillFile::open(const std::string& dir, std::unique_ptr<SpillFile>* out) {
  if (out == nullptr) return -EINVAL;
  int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE here: a named file, unlinked at once.
    std::string path = dir + "/.embstore-spill-XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back('\0');
    fd = ::mkostemp(name.data(), O_CLOEXEC);
    if (fd >= 0) ::unlink(name.data());
  }
  if (fd < 0) return -errno;
  std::unique_ptr<SpillFile> f(new SpillFile());
  f->fd_ = fd;
  const int flags = ::fcntl(fd, F_GETFL);
  f->direct_ = flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_DIRECT) == 0;
  *out = std::move(f);
  return 0;
}

SpillFile::~SpillFile() {
  if (fd_ >= 0) ::close(fd_);
}

namespace {

bool aligned(const void* data, size_t bytes) {
  return reinterpret_cast<uintptr_t>(data) % SpillFile::kAlignment == 0 &&
         bytes % SpillFile::kAlignment == 0;
}

}  // namespace

int SpillFile::append(const void* data, size_t bytes, uint64_t* offset) {
  if (!aligned(data, bytes)) return -EINVAL;
  *offset = end_;
  const char* p = static_cast<const char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t w = ::pwrite(fd_, p + done, bytes - done, static_cast<off_t>(end_ + done));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return -errno;
    if (w == 0) return -EIO;
    done += static_cast<size_t>(w);
  }
  end_ += bytes;
  return 0;
}

bool SpillFile::in_memory() const {
  struct statfs fs {};
  if (::fstatfs(fd_, &fs) != 0) return false;
  return fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC;
}

int SpillFile::settle() {
  if (direct_) return 0;  // nothing cached; a temporary file needs no flush to the device
  if (::fdatasync(fd_) != 0) return -errno;
  // Clean pages now: DONTNEED drops them.
  return -::posix_fadvise(fd_, 0, 0, POSIX_FADV_DONTNEED);
}

int SpillFile::read(void* data, size_t bytes, uint64_t offset) const {
  if (!aligned(data, bytes) || offset % kAlignment != 0) return -EINVAL;
  char* p = static_cast<char*>(data);
  for (size_t done = 0; done < bytes;) {
    const ssize_t r = ::pread(fd_, p + done, bytes - done, static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -errno;
    if (r == 0) return -EIO;
    done += static_cast<size_t>(r);
  }
  return 0;
}

namespace {

// The first number of a file ("max" and unreadable: UINT64_MAX).
uint64_t read_number(const std::string& path) {
  std::ifstream in(path);
  std::string word;
  if (!(in >> word) || word == "max") return UINT64_MAX;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(word.c_str(), &end, 10);
  return end != word.c_str() && *end == '\0' ? v : UINT64_MAX;
}

}  // namespace

uint64_t available_memory_bytes() {
  uint64_t available = UINT64_MAX;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    uint64_t kib = 0;
    std::string unit;
    while (in >> key >> kib) {
      std::getline(in, unit);
      if (key == "MemAvailable:") {
        available = kib * 1024;
        break;
      }
    }
  }
  // cgroup v2: "0::/path" in /proc/self/cgroup; a limit above binds as well as the leaf's.
  std::ifstream cgroup("/proc/self/cgroup");
  std::string line;
  while (std::getline(cgroup, line)) {
    if (line.rfind("0::", 0) != 0) continue;
    for (std::string path = line.substr(3); path.size() > 1;
         path = path.substr(0, std::max<size_t>(path.rfind('/'), 1))) {
      const std::string dir = "/sys/fs/cgroup" + path;
      const uint64_t max = read_number(dir + "/memory.max");
      const uint64_t current = read_number(dir + "/memory.current");
      if (max != UINT64_MAX && current != UINT64_MAX) {
        available = std::min(available, max > current ? max - current : 0);
      }
    }
  }
  return available;
}

}  // namespace embstore
