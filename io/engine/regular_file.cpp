#include "io/engine/regular_file.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstring>

namespace embstore::io {

int open_regular(const std::string& path, int extra_flags, int* fd, struct stat* st) {
  const int f = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK | extra_flags);
  // A socket cannot be opened at all (ENXIO): it is not a regular file either.
  if (f < 0) return errno == ENXIO ? kNotRegularFile : -errno;
  struct stat s;
  int r = ::fstat(f, &s) < 0 ? -errno : 0;
  if (r == 0 && !S_ISREG(s.st_mode)) r = kNotRegularFile;
  if (r == 0) {
    const int fl = ::fcntl(f, F_GETFL);
    if (fl < 0 || ::fcntl(f, F_SETFL, fl & ~O_NONBLOCK) < 0) r = -errno;
  }
  if (r < 0) {
    ::close(f);
    return r;
  }
  *fd = f;
  if (st != nullptr) *st = s;
  return 0;
}

int read_regular(const std::string& path, size_t max_bytes, std::string* out) {
  int fd = -1;
  struct stat st;
  if (int r = open_regular(path, 0, &fd, &st); r < 0) return r;
  int r = 0;
  std::string text;
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    r = -EFBIG;
  } else {
    try {
      text.reserve(static_cast<size_t>(st.st_size));
    } catch (...) {
      r = -ENOMEM;
    }
  }
  char buf[65536];
  while (r == 0) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      r = -errno;
      break;
    }
    if (n == 0) break;
    if (text.size() + static_cast<size_t>(n) > max_bytes) {
      r = -EFBIG;  // it grew past what was allowed while read
      break;
    }
    try {
      text.append(buf, static_cast<size_t>(n));
    } catch (...) {
      r = -ENOMEM;
    }
  }
  ::close(fd);
  if (r == 0) *out = std::move(text);
  return r;
}

std::string regular_file_error(int r) {
  if (r == kNotRegularFile) return "not a regular file";
  if (r == -ELOOP) return "a symbolic link, not a regular file";
  return std::strerror(-r);
}

}  // namespace embstore::io
