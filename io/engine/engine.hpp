// What FileWriter and FileReader share: their options and the I/O channel under them (a file
// descriptor, aligned staging buffers and, where the kernel allows, an io_uring with those
// buffers registered). The engine is chosen at run time: io_uring when io_uring_queue_init
// succeeds, else pwrite/pread; O_DIRECT when open() accepts it, else buffered. Every function
// returns 0 (or a count) or -errno; nothing throws.
#pragma once

#include <liburing.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "io/engine/mapping.hpp"

namespace embstore::io {

// O_DIRECT needs buffers, offsets and lengths aligned to the logical block size; 4096 covers
// every device we expect (512e and 4Kn disks, NVMe).
inline constexpr size_t kAlignment = 4096;
// The most requests in flight a channel takes (IoOptions::queue_depth).
inline constexpr unsigned kMaxQueueDepth = 4096;

struct IoOptions {
  unsigned queue_depth = 16;       // the most reads/writes in flight at once
  size_t buffer_bytes = 1u << 20;  // one staging buffer; rounded up to kAlignment
  unsigned buffers = 0;            // staging buffers; 0: queue_depth
  bool direct = true;              // try O_DIRECT (falls back to buffered on EINVAL)
  bool allow_uring = true;         // try io_uring (falls back to pwrite/pread)
  // Writers: the file's expected size, 0 if unknown. The space is allocated up front
  // (fallocate), so that writes land inside the file instead of extending it one by one,
  // which file systems serialize; finish() trims what was not written. Ignored where the file
  // system cannot allocate.
  uint64_t size_hint = 0;
};

namespace detail {

inline size_t align_up(size_t n) { return (n + kAlignment - 1) & ~(kAlignment - 1); }

// The fault hook of fault.hpp: 0, or the -errno the write at [offset, offset + bytes) reports.
int injected_fault(uint64_t offset, size_t bytes);
// set_read_fault_injection's hook for a read at offset (0 when none is set).
int injected_read_fault(uint64_t offset, size_t bytes);

// An io_uring over a set of staging buffers: the requests, their completions and the rules
// both users keep (Channel below, and the SSD tier's PageFile). Not thread-safe.
class Ring {
 public:
  Ring() = default;
  ~Ring() { exit(); }
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  // A ring of depth entries over count buffers of bytes each from base, registered where the
  // kernel allows (registration pins the pages once instead of per request; it can fail on the
  // memlock limit, and plain requests work the same, a little slower: *note then says so).
  // Returns 0, or io_uring_queue_init's -errno: the ring is not usable and callers fall back.
  int init(unsigned depth, char* base, unsigned count, size_t bytes, std::string* note);
  bool ok() const { return ok_; }
  bool fixed() const { return fixed_; }
  unsigned in_flight() const { return in_flight_; }
  // A submit or a wait failed: requests may still own buffers, and the ring takes no more.
  bool broken() const { return broken_; }

  // Queues and submits one read or write of [p, p + len) at file offset off of fd; p lies in
  // buffer index, which user_data carries. Callers keep in_flight() below the depth. Returns
  // 0, or -errno: after a failed submit the ring refuses every later request (-EIO).
  int start(int fd, bool write, unsigned index, char* p, size_t len, uint64_t off);
  // The same without the submit, for many small requests at once: submit() sends every queued
  // one in one system call (they count in in_flight() once sent), and must come before a reap
  // that waits. A submit that fails or sends nothing breaks the ring.
  int queue(int fd, bool write, unsigned index, char* p, size_t len, uint64_t off);
  int submit();
  // One completion. Waits when wait; returns -EAGAIN when none is ready and !wait.
  int reap(bool wait, unsigned* index, int* result);
  // Waits for every request in flight, dropping their results; a wait that fails leaves the
  // ring refusing requests (exit still cancels and waits).
  void drain();
  // Drains and tears the ring down.
  void exit();

 private:
  io_uring ring_{};
  bool ok_ = false;
  bool fixed_ = false;   // buffers registered: io_uring_prep_{write,read}_fixed
  bool broken_ = false;  // a submit or a wait failed
  unsigned in_flight_ = 0;
  unsigned unsubmitted_ = 0;  // queued, not yet taken by the kernel
};

// One file and its buffers. Not thread-safe: one producer (writer) or consumer (reader).
class Channel {
 public:
  Channel() = default;
  ~Channel();
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // Opens path with flags (O_DIRECT added when options.direct and accepted), allocates the
  // buffers and sets up the ring. write selects the engine names and the log line.
  int open(const std::string& path, int flags, mode_t mode, const IoOptions& options, bool write);

  bool uring() const { return ring_.ok(); }
  bool direct() const { return direct_; }
  const char* engine() const { return engine_; }
  int fd() const { return fd_; }
  unsigned queue_depth() const { return queue_depth_; }
  unsigned buffer_count() const { return buffer_count_; }
  size_t buffer_bytes() const { return buffer_bytes_; }
  char* buffer(unsigned index) const { return base() + index * buffer_bytes_; }
  // The index of the buffer that starts at p, or -1.
  int index_of(const void* p) const;
  unsigned in_flight() const { return ring_.in_flight(); }

  // io_uring: queues and submits one read/write of buffer(index)[at, at + len) at file offset
  // off; user_data carries index. Returns 0 or -errno (the channel is then unusable).
  int start(unsigned index, size_t at, size_t len, uint64_t off);
  // io_uring: one completion. Waits when wait; returns -EAGAIN when none is ready and !wait.
  int reap(bool wait, unsigned* index, int* result);
  // Drains every request in flight, dropping their results.
  void drain();

  // pwrite/pread: the whole range or -errno; a zero-length transfer (end of file or a full
  // device that reports no error) stops the loop and returns the bytes moved so far.
  ssize_t transfer(unsigned index, size_t at, size_t len, uint64_t off);

  // Closes the descriptor; returns close()'s error, if any.
  int close_fd();

 private:
  char* base() const { return static_cast<char*>(buffers_.data()); }

  int fd_ = -1;
  bool write_ = false;
  bool direct_ = false;
  const char* engine_ = "";
  unsigned queue_depth_ = 0;
  unsigned buffer_count_ = 0;
  size_t buffer_bytes_ = 0;
  Mapping buffers_;  // buffer_count_ buffers of buffer_bytes_, one after another
  Ring ring_;        // after buffers_: torn down (and drained) before they are unmapped
};

// Logs "embstore: io engine <name>[ (<notes>)]" to stderr, once per distinct line per process.
void log_engine(const std::string& line);

// "-EPERM" for -1; readable in logs without a lookup table.
std::string errno_name(int negative_errno);
// "No space left on device (-ENOSPC)": for messages that users read.
std::string errno_text(int negative_errno);

}  // namespace detail
}  // namespace embstore::io
