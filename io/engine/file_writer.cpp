#include "io/engine/file_writer.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

namespace embstore::io {

int FileWriter::open(const std::string& path, const WriterOptions& options,
                     std::unique_ptr<FileWriter>* out) {
  if (out == nullptr) return -EINVAL;
  std::unique_ptr<FileWriter> w(new (std::nothrow) FileWriter());
  if (!w) return -ENOMEM;
  const int r = w->channel_.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, options, true);
  if (r < 0) return r;
  if (options.size_hint > 0) {
    const off_t size =
        static_cast<off_t>((options.size_hint + kAlignment - 1) / kAlignment * kAlignment);
    // EOPNOTSUPP (and other refusals) leave the file as it was: only speed is lost.
    if (::fallocate(w->channel_.fd(), 0, 0, size) == 0) w->allocated_ = static_cast<uint64_t>(size);
  }
  const unsigned n = w->channel_.buffer_count();
  w->slots_.resize(n);
  w->free_.reserve(n);
  // Lowest index on top: the first writes use the first buffers.
  for (unsigned i = n; i-- > 0;) w->free_.push_back(i);
  *out = std::move(w);
  return 0;
}

FileWriter::~FileWriter() {
  // The channel waits for the kernel before it frees the buffers.
  if (!finished_) channel_.drain();
}

void FileWriter::release(unsigned index) {
  slots_[index].state = State::kFree;
  free_.push_back(index);
}

int FileWriter::complete_one() {
  unsigned index;
  int res;
  const int r = channel_.reap(true, &index, &res);
  if (r < 0) return r;
  Slot& s = slots_[index];
  if (res < 0) {
    fail(res);
  } else if (res == 0) {
    fail(-EIO);  // no progress and no error: would loop forever
  } else {
    s.done += static_cast<size_t>(res);
    if (s.done < s.len) {
      // Short write: continue from where it stopped. Under O_DIRECT the kernel stops on
      // block boundaries, so the rest stays aligned.
      const int again = channel_.start(index, s.done, s.len - s.done, s.offset + s.done);
      if (again == 0) return 0;
      fail(again);
    }
  }
  release(index);
  return 0;
}

int FileWriter::acquire(void** buf) {
  if (buf == nullptr || finished_) return -EINVAL;
  if (error_ != 0) return error_;
  while (free_.empty()) {
    if (channel_.in_flight() == 0) return -ENOBUFS;
    const int r = complete_one();
    if (r < 0) {
      fail(r);
      return r;
    }
  }
  if (error_ != 0) return error_;
  const unsigned index = free_.back();
  free_.pop_back();
  slots_[index].state = State::kHeld;
  *buf = channel_.buffer(index);
  return 0;
}

int FileWriter::submit(void* buf, size_t bytes) {
  if (finished_) return -EINVAL;
  const int found = channel_.index_of(buf);
  if (found < 0 || slots_[found].state != State::kHeld) return -EINVAL;
  const unsigned index = static_cast<unsigned>(found);
  if (bytes > channel_.buffer_bytes() || partial_tail_) {
    release(index);
    return -EINVAL;
  }
  if (error_ != 0 || bytes == 0) {
    release(index);
    return error_;
  }

  Slot& s = slots_[index];
  s.offset = next_offset_;
  s.len = bytes;
  s.done = 0;
  next_offset_ += bytes;
  if (bytes % kAlignment != 0) {
    partial_tail_ = true;
    if (channel_.direct()) {
      // O_DIRECT writes whole blocks; zeros keep the padding deterministic until finish()
      // truncates it.
      s.len = detail::align_up(bytes);
      std::memset(channel_.buffer(index) + bytes, 0, s.len - bytes);
    }
  }

  if (const int fault = detail::injected_fault(s.offset, bytes); fault != 0) {
    fail(fault);
    release(index);
    return error_;
  }

  if (!channel_.uring()) {
    const ssize_t r = channel_.transfer(index, 0, s.len, s.offset);
    if (r < 0) {
      fail(static_cast<int>(r));
    } else if (static_cast<size_t>(r) < s.len) {
      fail(-EIO);
    }
    release(index);
    return error_;
  }

  while (channel_.in_flight() >= channel_.queue_depth()) {
    const int r = complete_one();
    if (r < 0) {
      fail(r);
      release(index);
      return error_;
    }
  }
  if (error_ != 0) {
    release(index);
    return error_;
  }
  s.state = State::kInFlight;
  const int r = channel_.start(index, 0, s.len, s.offset);
  if (r < 0) {
    fail(r);
    release(index);
  }
  return error_;
}

int FileWriter::finish() {
  if (finished_) return -EINVAL;
  finished_ = true;
  while (channel_.in_flight() > 0) {
    const int r = complete_one();
    if (r < 0) {
      fail(r);
      channel_.drain();
      break;
    }
  }
  const int fd = channel_.fd();
  if (error_ == 0 &&
      (allocated_ > next_offset_ || (channel_.direct() && next_offset_ % kAlignment != 0))) {
    if (::ftruncate(fd, static_cast<off_t>(next_offset_)) != 0) fail(-errno);
  }
  // fsync, not fdatasync: the size set by the last write or ftruncate must be durable too.
  if (error_ == 0 && ::fsync(fd) != 0) fail(-errno);
  if (const int r = channel_.close_fd(); r < 0) fail(r);
  return error_;
}

}  // namespace embstore::io
