#include "io/engine/file_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <new>

namespace embstore::io {

int FileReader::open(const std::string& path, const ReaderOptions& options,
                     std::unique_ptr<FileReader>* out) {
  if (out == nullptr) return -EINVAL;
  std::unique_ptr<FileReader> r(new (std::nothrow) FileReader());
  if (!r) return -ENOMEM;
  // No more buffer than the file needs: pinning and registering 16 MiB to read a 4 KiB file
  // costs more than the read (7 ms a reader, measured).
  ReaderOptions sized = options;
  struct stat before;
  if (::stat(path.c_str(), &before) == 0 && S_ISREG(before.st_mode)) {
    const uint64_t size = std::max<uint64_t>(static_cast<uint64_t>(before.st_size), 1);
    const size_t chunk = detail::align_up(options.buffer_bytes);
    if (size < chunk) sized.buffer_bytes = detail::align_up(static_cast<size_t>(size));
    const uint64_t chunks = (size + sized.buffer_bytes - 1) / sized.buffer_bytes;
    const unsigned buffers = options.buffers != 0 ? options.buffers : options.queue_depth;
    if (chunks < buffers) sized.buffers = static_cast<unsigned>(chunks);
    if (chunks < sized.queue_depth) sized.queue_depth = static_cast<unsigned>(chunks);
  }
  if (const int e = r->channel_.open(path, O_RDONLY, 0, sized, false); e < 0) return e;
  struct stat st;
  if (::fstat(r->channel_.fd(), &st) != 0) return -errno;
  if (!S_ISREG(st.st_mode)) return -EINVAL;
  r->size_ = static_cast<uint64_t>(st.st_size);
  const size_t chunk = r->channel_.buffer_bytes();
  r->chunks_ = (r->size_ + chunk - 1) / chunk;
  r->slots_.resize(r->channel_.buffer_count());
  *out = std::move(r);
  return 0;
}

int FileReader::issue() {
  const unsigned n = channel_.buffer_count();
  const size_t chunk = channel_.buffer_bytes();
  // Slot of chunk c is c % n; the one the caller holds (deliver_) is not reused before the
  // next call, so chunks [deliver_, deliver_ + n) may be in buffers at once.
  while (issued_ < chunks_ && issued_ < deliver_ + n &&
         channel_.in_flight() < channel_.queue_depth()) {
    const unsigned index = static_cast<unsigned>(issued_ % n);
    Slot& s = slots_[index];
    s.chunk = issued_;
    s.want = static_cast<size_t>(std::min<uint64_t>(chunk, size_ - issued_ * chunk));
    s.len = channel_.direct() ? detail::align_up(s.want) : s.want;
    s.done = 0;
    s.complete = false;
    if (const int r = channel_.start(index, 0, s.len, s.chunk * chunk); r < 0) return r;
    ++issued_;
  }
  return 0;
}

int FileReader::complete_one() {
  unsigned index;
  int res;
  if (const int r = channel_.reap(true, &index, &res); r < 0) return r;
  Slot& s = slots_[index];
  if (res < 0) return res;
  s.done += static_cast<size_t>(res);
  if (s.done >= s.want) {
    s.complete = true;  // a file that grew since open() is read up to its old size
    return 0;
  }
  if (res == 0) return -EIO;  // the file shrank since open()
  // Short read before the end: continue where it stopped.
  return channel_.start(index, s.done, s.len - s.done, s.chunk * channel_.buffer_bytes() + s.done);
}

int FileReader::next(const void** data, size_t* bytes) {
  if (data == nullptr || bytes == nullptr) return -EINVAL;
  *data = nullptr;
  *bytes = 0;
  if (error_ != 0) return error_;
  if (holding_) {
    holding_ = false;
    ++deliver_;
  }
  if (deliver_ >= chunks_) return 0;

  const unsigned index = static_cast<unsigned>(deliver_ % channel_.buffer_count());
  Slot& s = slots_[index];
  if (!channel_.uring()) {
    const size_t chunk = channel_.buffer_bytes();
    s.want = static_cast<size_t>(std::min<uint64_t>(chunk, size_ - deliver_ * chunk));
    s.len = channel_.direct() ? detail::align_up(s.want) : s.want;
    const ssize_t r = channel_.transfer(index, 0, s.len, deliver_ * chunk);
    if (r < 0) {
      fail(static_cast<int>(r));
      return error_;
    }
    if (static_cast<size_t>(r) < s.want) {
      fail(-EIO);
      return error_;
    }
  } else {
    for (;;) {
      if (const int r = issue(); r < 0) {
        fail(r);
        return error_;
      }
      if (issued_ > deliver_ && s.chunk == deliver_ && s.complete) break;
      if (const int r = complete_one(); r < 0) {
        fail(r);
        return error_;
      }
    }
  }
  holding_ = true;
  *data = channel_.buffer(index);
  *bytes = s.want;
  return 0;
}

}  // namespace embstore::io
