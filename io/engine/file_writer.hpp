// Sequential writer of one checkpoint data file, in liburing style: every call returns 0 or
// -errno and nothing throws.
//
//   std::unique_ptr<FileWriter> w;
//   if (int r = FileWriter::open(path, {}, &w); r < 0) return r;
//   void* buf;
//   while (more) {
//     if (int r = w->acquire(&buf); r < 0) { w->finish(); return r; }
//     size_t n = fill(buf, w->buffer_bytes());
//     if (int r = w->submit(buf, n); r < 0) { w->finish(); return r; }
//   }
//   return w->finish();  // durable (fsynced) only when this returns 0
//
// Every submit but the last must be a multiple of kAlignment bytes: under O_DIRECT the file
// offset of each write must stay aligned, and the rule holds for every engine so that callers
// behave the same wherever they run. The last write may be partial; under O_DIRECT it is
// padded to kAlignment and finish() truncates the padding away.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "io/engine/engine.hpp"

namespace embstore::io {

using WriterOptions = IoOptions;

class FileWriter {
 public:
  // Creates (or truncates) path, mode 0644. -ENOENT when the directory is missing, -EINVAL
  // for bad options, other -errno from open().
  static int open(const std::string& path, const WriterOptions& options,
                  std::unique_ptr<FileWriter>* out);
  // Without finish(): waits for the writes in flight and closes, without fsync.
  ~FileWriter();
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;

  // A free staging buffer of buffer_bytes(), kAlignment-aligned, waiting for a write to
  // complete when all are in flight. -ENOBUFS when the caller holds every buffer already; the
  // first write error once one has been seen.
  int acquire(void** buf);
  // Writes bytes of buf (from acquire) at the next file offset; the buffer goes back to the
  // writer in every case. Returns 0, or the first write error seen so far (this write's own
  // when it is known at once); -EINVAL for a foreign buffer, bytes > buffer_bytes(), or a
  // write after a partial one.
  int submit(void* buf, size_t bytes);
  // Waits for every write, truncates the O_DIRECT padding, fsyncs and closes. Returns the
  // first error of any write, ftruncate, fsync or close; the file is then incomplete and
  // must not be committed. Call once.
  int finish();

  // Bytes accepted by submit(): the file's size once finish() returned 0.
  uint64_t bytes_written() const { return next_offset_; }
  size_t buffer_bytes() const { return channel_.buffer_bytes(); }
  unsigned buffers() const { return channel_.buffer_count(); }
  // "io_uring+O_DIRECT", "io_uring", "pwrite+O_DIRECT" or "pwrite".
  const char* engine() const { return channel_.engine(); }

 private:
  enum class State : uint8_t { kFree, kHeld, kInFlight };
  struct Slot {
    State state = State::kFree;
    uint64_t offset = 0;  // file offset of the write
    size_t len = 0;       // bytes to write, padding included
    size_t done = 0;      // bytes written so far (short writes continue from here)
  };

  FileWriter() = default;
  void fail(int err) {
    if (error_ == 0) error_ = err;
  }
  void release(unsigned index);
  // Waits for one completion and handles it (a short write is continued). 0 or -errno of the
  // ring itself; write errors go to error_.
  int complete_one();

  detail::Channel channel_;
  std::vector<Slot> slots_;
  std::vector<unsigned> free_;
  uint64_t next_offset_ = 0;
  bool partial_tail_ = false;  // the last submit was not a multiple of kAlignment
  uint64_t allocated_ = 0;     // bytes fallocated at open (IoOptions::size_hint)
  bool finished_ = false;
  int error_ = 0;
};

}  // namespace embstore::io
