// Sequential reader of one checkpoint data file, in liburing style (0 or -errno, no
// exceptions). With io_uring it keeps up to queue_depth reads ahead of the caller, into the
// staging buffers, and hands the chunks out in file order:
//
//   std::unique_ptr<FileReader> r;
//   if (int e = FileReader::open(path, {}, &r); e < 0) return e;
//   const void* data;
//   size_t n;
//   while ((e = r->next(&data, &n)) == 0 && n > 0) consume(data, n);
//   return e;
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/engine/engine.hpp"

namespace embstore::io {

using ReaderOptions = IoOptions;

class FileReader {
 public:
  // -ENOENT for a missing file, -EINVAL for bad options, other -errno from open()/fstat().
  static int open(const std::string& path, const ReaderOptions& options,
                  std::unique_ptr<FileReader>* out);
  ~FileReader() = default;  // the channel waits for reads in flight
  FileReader(const FileReader&) = delete;
  FileReader& operator=(const FileReader&) = delete;

  // The next chunk of the file (buffer_bytes() except the last), valid until the next call;
  // *bytes == 0 at the end. -EIO when the file ends before the size it had at open(); the
  // first error is returned again by every later call.
  int next(const void** data, size_t* bytes);

  // The file's size at open().
  uint64_t size() const { return size_; }
  size_t buffer_bytes() const { return channel_.buffer_bytes(); }
  // "io_uring+O_DIRECT", "io_uring", "pread+O_DIRECT" or "pread".
  const char* engine() const { return channel_.engine(); }

 private:
  struct Slot {
    uint64_t chunk = 0;
    size_t want = 0;  // bytes of the file in this chunk
    size_t len = 0;   // bytes requested: want, rounded up to kAlignment under O_DIRECT
    size_t done = 0;
    bool complete = false;
  };

  FileReader() = default;
  void fail(int err) {
    if (error_ == 0) error_ = err;
  }
  // Queues reads of the following chunks while buffers and queue depth allow.
  int issue();
  int complete_one();

  detail::Channel channel_;
  std::vector<Slot> slots_;
  uint64_t size_ = 0;
  uint64_t chunks_ = 0;
  uint64_t deliver_ = 0;  // the chunk next() hands out next
  uint64_t issued_ = 0;   // chunks whose read has been queued
  bool holding_ = false;  // the caller holds chunk deliver_ (its buffer is not reused yet)
  int error_ = 0;
};

}  // namespace embstore::io
