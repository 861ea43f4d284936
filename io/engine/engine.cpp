#include "io/engine/engine.hpp"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <set>

#include "io/engine/fault.hpp"
#include "io/engine/regular_file.hpp"

// ThreadSanitizer does not see liburing map and unmap its rings (raw system calls), so when a
// ring is unmapped on one thread and a new one mapped at the same address on another, the new
// ring's first writes look like a race with the old one's. A release when a ring goes and an
// acquire when one comes order them, as the kernel does.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
namespace {
char g_ring_handover;
void ring_mapped() { __tsan_acquire(&g_ring_handover); }
void ring_unmapped() { __tsan_release(&g_ring_handover); }
}  // namespace
#else
namespace {
void ring_mapped() {}
void ring_unmapped() {}
}  // namespace
#endif

namespace embstore::io {
namespace {

std::mutex g_fault_mutex;
std::function<int(uint64_t, size_t)> g_fault, g_read_fault;
// Read under the mutex; the hooks are test-only, so no fast path.
bool g_fault_set = false, g_read_fault_set = false;

std::mutex g_log_mutex;

// Largest buffer_bytes accepted: a ring request's length is 32 bits, and staging beyond this
// only costs memory.
constexpr size_t kMaxBufferBytes = size_t{1} << 30;

}  // namespace

void set_fault_injection(std::function<int(uint64_t offset, size_t bytes)> hook) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  g_fault = std::move(hook);
  g_fault_set = static_cast<bool>(g_fault);
}

void set_read_fault_injection(std::function<int(uint64_t offset, size_t bytes)> hook) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  g_read_fault = std::move(hook);
  g_read_fault_set = static_cast<bool>(g_read_fault);
}

namespace detail {

int injected_fault(uint64_t offset, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  if (!g_fault_set) return 0;
  const int r = g_fault(offset, bytes);
  return r > 0 ? -r : r;  // a positive errno by mistake still fails the write
}

int injected_read_fault(uint64_t offset, size_t bytes) {
  std::lock_guard<std::mutex> lock(g_fault_mutex);
  if (!g_read_fault_set) return 0;
  const int r = g_read_fault(offset, bytes);
  return r > 0 ? -r : r;
}

std::string errno_name(int negative_errno) {
  const char* name = strerrorname_np(-negative_errno);
  return name != nullptr ? std::string("-") + name : std::to_string(negative_errno);
}

std::string errno_text(int negative_errno) {
  return std::string(std::strerror(-negative_errno)) + " (" + errno_name(negative_errno) + ")";
}

void log_engine(const std::string& line) {
  static std::set<std::string> logged;
  std::lock_guard<std::mutex> lock(g_log_mutex);
  if (!logged.insert(line).second) return;
  std::fprintf(stderr, "embstore: io engine %s\n", line.c_str());
}

int Ring::init(unsigned depth, char* base, unsigned count, size_t bytes, std::string* note) {
  const int r = io_uring_queue_init(depth, &ring_, 0);
  if (r < 0) return r;
  ring_mapped();
  ok_ = true;
  std::vector<iovec> iov(count);
  for (unsigned i = 0; i < count; ++i) iov[i] = {base + size_t{i} * bytes, bytes};
  const int reg = io_uring_register_buffers(&ring_, iov.data(), count);
  if (reg == 0) {
    fixed_ = true;
  } else if (note != nullptr) {
    *note = "buffer registration refused (" + errno_name(reg) + "): unregistered buffers";
  }
  return 0;
}

int Ring::start(int fd, bool write, unsigned index, char* p, size_t len, uint64_t off) {
  if (const int r = queue(fd, write, index, p, len, off); r < 0) return r;
  return submit();
}

int Ring::queue(int fd, bool write, unsigned index, char* p, size_t len, uint64_t off) {
  if (broken_ || !ok_) return -EIO;
  io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
  // Callers keep in_flight below the depth and submit each request at once, so a free entry
  // exists; a missing one means the bookkeeping is wrong.
  if (sqe == nullptr) return -EBUSY;
  const unsigned n = static_cast<unsigned>(len);
  const int buf = static_cast<int>(index);
  if (write) {
    if (fixed_) {
      io_uring_prep_write_fixed(sqe, fd, p, n, off, buf);
    } else {
      io_uring_prep_write(sqe, fd, p, n, off);
    }
  } else {
    if (fixed_) {
      io_uring_prep_read_fixed(sqe, fd, p, n, off, buf);
    } else {
      io_uring_prep_read(sqe, fd, p, n, off);
    }
  }
  io_uring_sqe_set_data64(sqe, index);
  ++unsubmitted_;
  return 0;
}

// Requests count in flight once the kernel took them: a wait for one never submitted would
// never end.
int Ring::submit() {
  if (broken_ || !ok_) return -EIO;
  while (unsubmitted_ > 0) {
    int r;
    do {
      r = io_uring_submit(&ring_);
    } while (r == -EINTR);
    if (r <= 0) {
      // Entries may still sit in the submission queue and go out with a later submit, after
      // their buffers were reused: refuse all further requests instead.
      broken_ = true;
      unsubmitted_ = 0;
      return r < 0 ? r : -EBUSY;
    }
    const unsigned taken = std::min(static_cast<unsigned>(r), unsubmitted_);
    unsubmitted_ -= taken;
    in_flight_ += taken;
  }
  return 0;
}

int Ring::reap(bool wait, unsigned* index, int* result) {
  if (in_flight_ == 0) return wait ? -EINVAL : -EAGAIN;
  io_uring_cqe* cqe = nullptr;
  int r;
  do {
    r = wait ? io_uring_wait_cqe(&ring_, &cqe) : io_uring_peek_cqe(&ring_, &cqe);
  } while (r == -EINTR);
  if (r < 0) {
    if (wait) broken_ = true;  // requests may still own buffers: no more I/O on this ring
    return r;
  }
  *index = static_cast<unsigned>(io_uring_cqe_get_data64(cqe));
  *result = cqe->res;
  io_uring_cqe_seen(&ring_, cqe);
  --in_flight_;
  return 0;
}

void Ring::drain() {
  unsigned index;
  int result;
  while (in_flight_ > 0) {
    if (reap(true, &index, &result) < 0) break;  // exit's queue_exit still cancels and waits
  }
}

void Ring::exit() {
  if (!ok_) return;
  // The kernel may still write into (or read from) the buffers: wait before they are freed.
  drain();
  ring_unmapped();
  io_uring_queue_exit(&ring_);
  ok_ = false;
  fixed_ = false;
  in_flight_ = 0;
}

Channel::~Channel() {
  ring_.exit();
  close_fd();
}

int Channel::open(const std::string& path, int flags, mode_t mode, const IoOptions& options,
                  bool write) {
  write_ = write;
  if (options.queue_depth == 0 || options.queue_depth > kMaxQueueDepth ||
      options.buffer_bytes == 0 || options.buffer_bytes > kMaxBufferBytes ||
      options.buffers > kMaxQueueDepth) {
    return -EINVAL;
  }
  queue_depth_ = options.queue_depth;
  buffer_count_ = options.buffers != 0 ? options.buffers : options.queue_depth;
  buffer_bytes_ = align_up(options.buffer_bytes);

  std::string notes;
  auto note = [&notes](const std::string& s) { notes += (notes.empty() ? "" : "; ") + s; };

  flags |= O_CLOEXEC;
  // A reader opens only a regular file (a FIFO planted in a checkpoint directory would block
  // the open): regular_file.hpp. Returns the descriptor or -errno.
  auto open_file = [&](int extra) {
    if (write) {
      const int fd = ::open(path.c_str(), flags | extra, mode);
      return fd >= 0 ? fd : -errno;
    }
    int fd = -1;
    const int r = open_regular(path, extra, &fd);
    return r < 0 ? r : fd;
  };
  if (options.direct) {
    const int fd = open_file(O_DIRECT);
    if (fd >= 0) {
      fd_ = fd;
      direct_ = true;
    } else if (fd == -EINVAL) {
      note("O_DIRECT refused (-EINVAL): buffered");
    } else {
      return fd;
    }
  } else {
    note("O_DIRECT off by option");
  }
  if (fd_ < 0) {
    const int fd = open_file(0);
    if (fd < 0) return fd;
    fd_ = fd;
  }

  // On huge pages (mapping.hpp): an O_DIRECT request then needs few segments.
  if (const int r = Mapping::map(buffer_count_ * buffer_bytes_, &buffers_); r < 0) return r;

  const char* sync_name = write ? "pwrite" : "pread";
  if (options.allow_uring) {
    std::string refused;
    const int r = ring_.init(queue_depth_, base(), buffer_count_, buffer_bytes_, &refused);
    if (r < 0) note("io_uring refused (" + errno_name(r) + "): " + sync_name + " fallback");
    if (!refused.empty()) note(refused);
  } else {
    note(std::string("io_uring off by option: ") + sync_name);
  }

  if (ring_.ok()) {
    engine_ = direct_ ? "io_uring+O_DIRECT" : "io_uring";
  } else if (write) {
    engine_ = direct_ ? "pwrite+O_DIRECT" : "pwrite";
  } else {
    engine_ = direct_ ? "pread+O_DIRECT" : "pread";
  }
  log_engine(std::string(engine_) + " (" + (write ? "writer" : "reader") +
             (notes.empty() ? "" : "; " + notes) + ")");
  return 0;
}

int Channel::index_of(const void* p) const {
  const char* c = static_cast<const char*>(p);
  const char* base = this->base();
  if (base == nullptr || c < base || c >= base + buffer_count_ * buffer_bytes_) return -1;
  const size_t delta = static_cast<size_t>(c - base);
  if (delta % buffer_bytes_ != 0) return -1;
  return static_cast<int>(delta / buffer_bytes_);
}

int Channel::start(unsigned index, size_t at, size_t len, uint64_t off) {
  return ring_.start(fd_, write_, index, buffer(index) + at, len, off);
}

int Channel::reap(bool wait, unsigned* index, int* result) {
  return ring_.reap(wait, index, result);
}

void Channel::drain() { ring_.drain(); }

ssize_t Channel::transfer(unsigned index, size_t at, size_t len, uint64_t off) {
  char* p = buffer(index) + at;
  size_t done = 0;
  while (done < len) {
    const ssize_t r = write_ ? ::pwrite(fd_, p + done, len - done, static_cast<off_t>(off + done))
                             : ::pread(fd_, p + done, len - done, static_cast<off_t>(off + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return -errno;
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return static_cast<ssize_t>(done);
}

int Channel::close_fd() {
  if (fd_ < 0) return 0;
  const int r = ::close(fd_);
  fd_ = -1;
  return r == 0 ? 0 : -errno;
}

}  // namespace detail
}  // namespace embstore::io
