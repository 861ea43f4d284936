#include "io/tier/page_file.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>

namespace embstore::io {

using detail::errno_name;
using detail::errno_text;

namespace {

// A ring request's length is 32 bits; a larger page would only cost staging memory anyway.
constexpr size_t kMaxPageBytes = size_t{1} << 30;

void set_detail(std::string* detail, std::string message) {
  if (detail != nullptr) *detail = std::move(message);
}

// Why a transfer that returned 0 bytes (no progress, no error) failed the page.
std::string no_progress(bool write, size_t done) {
  return write ? fmt::format(" after {} bytes: the device took no more", done)
               : fmt::format(" after {} bytes: the file ends there", done);
}

}  // namespace

int PageFile::create(const std::string& dir, const PageFileOptions& options,
                     std::unique_ptr<PageFile>* out, std::string* detail) {
  if (out == nullptr) return -EINVAL;
  if (options.page_bytes == 0 || options.page_bytes % kAlignment != 0 ||
      options.page_bytes > kMaxPageBytes) {
    set_detail(detail, fmt::format("tier page size {} is not a multiple of {} up to {}",
                                   options.page_bytes, kAlignment, kMaxPageBytes));
    return -EINVAL;
  }
  if (options.queue_depth == 0 || options.queue_depth > kMaxQueueDepth) {
    set_detail(detail, fmt::format("tier queue depth {} is not within 1 to {}", options.queue_depth,
                                   kMaxQueueDepth));
    return -EINVAL;
  }

  // The directory first, so that the message names what is wrong with it rather than what
  // open() made of it.
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) {
    const int r = -errno;
    set_detail(detail, r == -ENOENT ? fmt::format("tier directory {} does not exist", dir)
                                    : fmt::format("tier directory {}: {}", dir, errno_text(r)));
    return r;
  }
  if (!S_ISDIR(st.st_mode)) {
    set_detail(detail, fmt::format("tier directory {} is not a directory", dir));
    return -ENOTDIR;
  }
  struct statfs fs {};
  if (::statfs(dir.c_str(), &fs) != 0) {
    const int r = -errno;
    set_detail(detail, fmt::format("tier directory {}: {}", dir, errno_text(r)));
    return r;
  }
  if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) {
    set_detail(detail,
               fmt::format("tier directory {} is on {}: its pages would be memory, not disk", dir,
                           fs.f_type == TMPFS_MAGIC ? "tmpfs" : "ramfs"));
    return -EINVAL;
  }

  std::unique_ptr<PageFile> f(new (std::nothrow) PageFile());
  if (!f) return -ENOMEM;
  f->dir_ = dir;
  f->page_bytes_ = options.page_bytes;
  f->queue_depth_ = options.queue_depth;
  std::string notes;
  if (const int r = f->open_file(options, &notes, detail); r < 0) return r;
  if (const int r = f->setup_engine(options, &notes, detail); r < 0) return r;
  *out = std::move(f);
  return 0;
}

int PageFile::open_file(const PageFileOptions& options, std::string* notes, std::string* detail) {
  auto note = [notes](const std::string& s) { *notes += (notes->empty() ? "" : "; ") + s; };
  if (options.unnamed) {
    // O_EXCL: the file can never be linked into the directory later.
    fd_ = ::open(dir_.c_str(), O_TMPFILE | O_RDWR | O_EXCL | O_CLOEXEC, 0600);
    if (fd_ >= 0) {
      unnamed_ = true;
    } else if (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL) {
      // EISDIR: a kernel before 3.11 reads O_TMPFILE as O_DIRECTORY; EINVAL: some file systems
      // of FUSE and older overlayfs. A real problem with the directory shows at mkostemp.
      note("O_TMPFILE refused (" + errno_name(-errno) + "): named file, unlinked");
    } else {
      const int r = -errno;
      set_detail(detail,
                 fmt::format("tier directory {}: cannot create a file: {}", dir_, errno_text(r)));
      return r;
    }
  } else {
    note("O_TMPFILE off by option: named file, unlinked");
  }
  if (fd_ < 0) {
    const std::string path = dir_ + "/embstore-tier-XXXXXX";
    std::vector<char> name(path.begin(), path.end());
    name.push_back('\0');
    fd_ = ::mkostemp(name.data(), O_CLOEXEC);  // O_EXCL, mode 0600
    if (fd_ < 0) {
      const int r = -errno;
      set_detail(detail,
                 fmt::format("tier directory {}: cannot create a file: {}", dir_, errno_text(r)));
      return r;
    }
    if (::unlink(name.data()) != 0) {
      // Left named, the file would outlive a crash: refuse rather than leak disk space.
      const int r = -errno;
      set_detail(detail, fmt::format("tier directory {}: cannot unlink {}: {}", dir_, name.data(),
                                     errno_text(r)));
      return r;
    }
  }

  // O_DIRECT through fcntl, the same for both kinds of file: the page cache would hold a second
  // copy of rows that are on disk precisely because memory is short.
  if (options.direct) {
    const int flags = ::fcntl(fd_, F_GETFL);
    if (flags < 0) {
      const int r = -errno;
      set_detail(detail, fmt::format("tier file in {}: fcntl: {}", dir_, errno_text(r)));
      return r;
    }
    if (::fcntl(fd_, F_SETFL, flags | O_DIRECT) == 0) {
      direct_ = true;
    } else {
      note("O_DIRECT refused (" + errno_name(-errno) + "): buffered");
    }
  } else {
    note("O_DIRECT off by option");
  }
  return 0;
}

int PageFile::setup_engine(const PageFileOptions& options, std::string* notes,
                           std::string* detail) {
  auto note = [notes](const std::string& s) { *notes += (notes->empty() ? "" : "; ") + s; };
  run_pages_ =
      std::max<size_t>(1, std::min(kReadRunBytes, kStagingBytes / queue_depth_) / page_bytes_);
  const size_t buffer_bytes = run_pages_ * page_bytes_;
  if (const int r = Mapping::map(size_t{queue_depth_} * buffer_bytes, &buffers_); r < 0) {
    set_detail(detail, fmt::format("tier staging buffers ({} x {} bytes): {}", queue_depth_,
                                   buffer_bytes, errno_text(r)));
    return r;
  }
  slots_.resize(queue_depth_);
  spare_.reserve(queue_depth_);

  if (options.allow_uring) {
    std::string refused;
    const int r = ring_.init(queue_depth_, buffer(0), queue_depth_, buffer_bytes, &refused);
    if (r < 0) note("io_uring refused (" + errno_name(r) + "): pread/pwrite fallback");
    if (!refused.empty()) note(refused);
  } else {
    note("io_uring off by option: pread/pwrite");
  }
  if (ring_.ok()) {
    engine_ = direct_ ? "io_uring+O_DIRECT" : "io_uring";
  } else {
    engine_ = direct_ ? "pread/pwrite+O_DIRECT" : "pread/pwrite";
  }
  detail::log_engine(std::string(engine_) + " (tier page file" +
                     (notes->empty() ? "" : "; " + *notes) + ")");
  return 0;
}

PageFile::~PageFile() {
  // The kernel may still own a staging buffer (only after a failed wait): wait before freeing.
  ring_.exit();
  if (fd_ >= 0) ::close(fd_);
}

int PageFile::allocate(size_t n, std::vector<uint64_t>* pages, std::string* detail) {
  if (pages == nullptr) return -EINVAL;
  const uint64_t reused = std::min<uint64_t>(n, free_.size());
  const uint64_t grow = n - reused;
  if (grow > 0) {
    const uint64_t max_pages = static_cast<uint64_t>(LLONG_MAX) / page_bytes_;
    if (grow > max_pages - file_pages_) {
      set_detail(detail, fmt::format("tier file in {}: {} more pages of {} bytes are past the "
                                     "largest file offset",
                                     dir_, grow, page_bytes_));
      return -EFBIG;
    }
    const off_t old_size = static_cast<off_t>(file_pages_ * page_bytes_);
    const off_t add = static_cast<off_t>(grow * page_bytes_);
    // The space now, so that a full disk fails here, where nothing is lost, rather than at a
    // write of rows that were evicted from memory.
    if (::fallocate(fd_, 0, old_size, add) != 0) {
      const int r = -errno;
      if (r == -EOPNOTSUPP) {
        // Only extended: reads of unwritten pages see zeros, and a full disk shows at write.
        if (::ftruncate(fd_, old_size + add) != 0) {
          const int t = -errno;
          set_detail(detail, fmt::format("tier file in {}: cannot grow by {} bytes: {}", dir_, add,
                                         errno_text(t)));
          return t;
        }
      } else {
        // A refused fallocate may have allocated (and on ext4, shown in the size) part of the
        // range: cut back so that nothing half-allocated stays.
        (void)!::ftruncate(fd_, old_size);
        if (r == -ENOSPC || r == -EDQUOT) {
          set_detail(detail, fmt::format("tier directory {} has no room for {} more bytes ({} "
                                         "pages of {}): {}",
                                         dir_, add, grow, page_bytes_, errno_text(r)));
        } else {
          set_detail(detail, fmt::format("tier file in {}: cannot allocate {} more bytes: {}", dir_,
                                         add, errno_text(r)));
        }
        return r;
      }
    }
  }

  // Nothing can fail from here on: the pages are handed out.
  pages->clear();
  pages->reserve(n);
  for (uint64_t i = 0; i < reused; ++i) {
    pages->push_back(free_.top());
    in_use_[free_.top()] = true;
    free_.pop();
  }
  for (uint64_t i = 0; i < grow; ++i) pages->push_back(file_pages_ + i);
  file_pages_ += grow;
  in_use_.resize(file_pages_, true);
  return 0;
}

void PageFile::release(const std::vector<uint64_t>& pages) {
  for (const uint64_t p : pages) {
    if (p >= file_pages_ || !in_use_[p]) continue;
    in_use_[p] = false;
    free_.push(p);
  }
}

int PageFile::check_pages(bool write, const std::vector<uint64_t>& pages,
                          std::string* detail) const {
  if (ring_.broken()) {
    set_detail(detail,
               fmt::format("tier file in {}: the io_uring failed earlier; no more I/O", dir_));
    return -EIO;
  }
  for (const uint64_t p : pages) {
    if (p >= file_pages_ || !in_use_[p]) {
      set_detail(detail,
                 fmt::format("tier {}: page {} is not allocated", write ? "write" : "read", p));
      return -EINVAL;
    }
  }
  return 0;
}

int PageFile::check_buffers(bool write, const std::vector<uint64_t>& pages, const char* const* data,
                            std::string* detail) const {
  const char* what = write ? "write" : "read";
  if (!pages.empty() && data == nullptr) {
    set_detail(detail, fmt::format("tier {} of {} pages without buffers", what, pages.size()));
    return -EINVAL;
  }
  for (size_t i = 0; i < pages.size(); ++i) {
    if (data[i] == nullptr) {
      set_detail(detail, fmt::format("tier {}: no buffer for page {}", what, pages[i]));
      return -EINVAL;
    }
  }
  return 0;
}

int PageFile::no_callback(bool write, size_t pages, std::string* detail) const {
  set_detail(detail, fmt::format("tier {} of {} pages without a callback", write ? "write" : "read",
                                 pages));
  return -EINVAL;
}

int PageFile::write_with(const std::vector<uint64_t>& pages, const PageFill& fill,
                         std::string* detail) {
  if (!fill) return no_callback(true, pages.size(), detail);
  if (const int r = check_pages(true, pages, detail); r < 0) return r;
  return transfer(true, pages, fill, nullptr, detail);
}

int PageFile::read_with(const std::vector<uint64_t>& pages, const PageTake& take,
                        std::string* detail) {
  if (!take) return no_callback(false, pages.size(), detail);
  if (const int r = check_pages(false, pages, detail); r < 0) return r;
  return transfer(false, pages, nullptr, take, detail);
}

int PageFile::write(const std::vector<uint64_t>& pages, const char* const* data,
                    std::string* detail) {
  if (const int r = check_pages(true, pages, detail); r < 0) return r;
  if (const int r = check_buffers(true, pages, data, detail); r < 0) return r;
  return transfer(
      true, pages, [&](size_t i, char* page) { std::memcpy(page, data[i], page_bytes_); }, nullptr,
      detail);
}

int PageFile::read(const std::vector<uint64_t>& pages, char* const* data, std::string* detail) {
  if (const int r = check_pages(false, pages, detail); r < 0) return r;
  if (const int r = check_buffers(false, pages, data, detail); r < 0) return r;
  return transfer(
      false, pages, nullptr,
      [&](size_t i, const char* page) { std::memcpy(data[i], page, page_bytes_); }, detail);
}

std::string PageFile::describe(bool write, uint64_t page, int err) const {
  return fmt::format("tier file in {}: {} of page {} (offset {}, {} bytes): {}", dir_,
                     write ? "write" : "read", page, page * page_bytes_, page_bytes_,
                     errno_text(err));
}

int PageFile::transfer(bool write, const std::vector<uint64_t>& pages, const PageFill& fill,
                       const PageTake& take, std::string* detail) {
  if (pages.empty()) return 0;
  return ring_.ok() ? transfer_uring(write, pages, fill, take, detail)
                    : transfer_sync(write, pages, fill, take, detail);
}

size_t PageFile::run_at(bool write, const std::vector<uint64_t>& pages, size_t first) const {
  size_t count = 1;
  if (write) return count;
  while (count < run_pages_ && first + count < pages.size() &&
         pages[first + count] == pages[first] + count) {
    ++count;
  }
  return count;
}

int PageFile::transfer_sync(bool write, const std::vector<uint64_t>& pages, const PageFill& fill,
                            const PageTake& take, std::string* detail) {
  char* staged = buffer(0);  // aligned, as O_DIRECT needs; one request at a time
  for (size_t i = 0; i < pages.size();) {
    const size_t count = run_at(write, pages, i);
    const size_t len = count * page_bytes_;
    const uint64_t off = pages[i] * page_bytes_;
    if (const int fault =
            write ? detail::injected_fault(off, len) : detail::injected_read_fault(off, len);
        fault != 0) {
      set_detail(detail, describe(write, pages[i], fault));
      return fault;
    }
    if (write) fill(i, staged);
    size_t done = 0;
    while (done < len) {
      const ssize_t r =
          write ? ::pwrite(fd_, staged + done, len - done, static_cast<off_t>(off + done))
                : ::pread(fd_, staged + done, len - done, static_cast<off_t>(off + done));
      if (r < 0 && errno == EINTR) continue;
      const uint64_t page = pages[i + done / page_bytes_];  // where it stopped
      if (r < 0) {
        const int err = -errno;
        set_detail(detail, describe(write, page, err));
        return err;
      }
      if (r == 0) {
        // No progress and no error: the end of the file for a read, a device that stopped
        // for a write. Either way the page is not there.
        set_detail(detail, describe(write, page, -EIO) + no_progress(write, done % page_bytes_));
        return -EIO;
      }
      done += static_cast<size_t>(r);
    }
    if (write) {
      bytes_written_ += len;
    } else {
      for (size_t j = 0; j < count; ++j) take(i + j, staged + j * page_bytes_);
      bytes_read_ += len;
    }
    i += count;
  }
  return 0;
}

int PageFile::transfer_uring(bool write, const std::vector<uint64_t>& pages, const PageFill& fill,
                             const PageTake& take, std::string* detail) {
  spare_.clear();
  // Lowest index on top: small batches touch the first buffers only.
  for (unsigned i = queue_depth_; i-- > 0;) spare_.push_back(i);
  int error = 0;
  auto fail = [&](int err, uint64_t page, const std::string& more) {
    if (error != 0) return;
    error = err;
    set_detail(detail, describe(write, page, err) + more);
  };

  size_t next = 0;
  for (;;) {
    // Every staging buffer is in flight or spare, so in flight <= queue_depth_ and the ring
    // (queue_depth_ entries) always has a free one. Requests of a round go out in one submit:
    // pages are small, and a system call each would cost more than the I/O.
    bool queued = false;
    while (error == 0 && next < pages.size() && !spare_.empty()) {
      const unsigned index = spare_.back();
      const size_t count = run_at(write, pages, next);
      const size_t len = count * page_bytes_;
      const uint64_t off = pages[next] * page_bytes_;
      if (const int fault =
              write ? detail::injected_fault(off, len) : detail::injected_read_fault(off, len);
          fault != 0) {
        fail(fault, pages[next], "");
        break;
      }
      if (write) fill(next, buffer(index));
      if (const int r = ring_.queue(fd_, write, index, buffer(index), len, off); r < 0) {
        fail(r, pages[next], " (io_uring queue)");
        break;
      }
      slots_[index] = {next, count, 0};
      spare_.pop_back();
      next += count;
      queued = true;
    }
    if (queued) {
      if (const int r = ring_.submit(); r < 0) {
        // Broken: the queued requests may or may not have gone out; the destructor's
        // queue_exit cancels and waits.
        if (error == 0) {
          error = r;
          set_detail(detail,
                     fmt::format("tier file in {}: io_uring submit: {}", dir_, errno_text(r)));
        }
        return error;
      }
    }
    if (ring_.in_flight() == 0) break;

    // The first completion waited for, then every other one already there, before refilling.
    unsigned index = 0;
    int res = 0;
    bool reaped = false;
    for (;;) {
      if (const int r = ring_.reap(!reaped, &index, &res); r < 0) {
        if (reaped && r == -EAGAIN) break;
        // The ring cannot be waited on (it is broken now): its requests may still own buffers, so
        // no more I/O here; the destructor's queue_exit cancels and waits.
        if (error == 0) {
          error = r;
          set_detail(detail,
                     fmt::format("tier file in {}: io_uring wait: {}", dir_, errno_text(r)));
        }
        return error;
      }
      Slot& s = slots_[index];
      const size_t len = s.count * page_bytes_;
      const uint64_t first_page = pages[s.item];
      const uint64_t page = pages[s.item + s.done / page_bytes_];  // where it stopped
      if (res < 0) {
        fail(res, page, "");
      } else if (res == 0) {
        fail(-EIO, page, no_progress(write, s.done % page_bytes_));
      } else {
        s.done += static_cast<size_t>(res);
        if (s.done < len) {
          // Short transfer: continue where it stopped (on a block boundary under O_DIRECT).
          const int r = ring_.start(fd_, write, index, buffer(index) + s.done, len - s.done,
                                    first_page * page_bytes_ + s.done);
          if (r == 0) continue;
          fail(r, pages[s.item + s.done / page_bytes_], " (io_uring submit)");
        } else if (write) {
          bytes_written_ += len;
        } else {
          for (size_t j = 0; j < s.count; ++j) take(s.item + j, buffer(index) + j * page_bytes_);
          bytes_read_ += len;
        }
      }
      spare_.push_back(index);
      reaped = true;
    }
  }
  return error;
}

}  // namespace embstore::io
