// A file of fixed-size pages: the bottom of the SSD tier (issue 34), where rows beyond a table's
// memory budget live, packed into pages by the layer above. The file is a cache, never a
// checkpoint: it is unnamed where the kernel allows (O_TMPFILE), else named and unlinked at once,
// so it goes with its descriptor whatever happens to the process, and a crash leaves nothing to
// clean up (the table comes back from its checkpoint).
//
//   std::unique_ptr<PageFile> f;
//   std::string detail;
//   if (int r = PageFile::create(tier_dir, {}, &f, &detail); r < 0) return r;  // detail says why
//   std::vector<uint64_t> pages;
//   if (int r = f->allocate(2, &pages, &detail); r < 0) return r;
//   const char* from[] = {a, b};  // page_bytes() each, any alignment
//   if (int r = f->write(pages, from, &detail); r < 0) return r;
//   char* to[] = {x, y};
//   if (int r = f->read(pages, to, &detail); r < 0) return r;
//   f->release(pages);  // reused by the next allocate
//
// The engine is chosen as FileWriter's (io/engine/engine.hpp): io_uring when
// io_uring_queue_init succeeds, else pread/pwrite; O_DIRECT when the file system takes it, else
// buffered; logged once per process. detail::Channel does not fit (one direction per channel, and
// it opens by path, which an unnamed file shared by reads and writes has not): the file keeps its
// own staging pages over the engine's detail::Ring.
//
// liburing style: every call returns 0 or -errno, with a message in *detail (may be null) where
// one helps; nothing throws. Not thread-safe: one caller at a time, reads included (the staging
// buffers and the ring are shared).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <queue>
#include <string>
#include <vector>

#include "io/engine/engine.hpp"
#include "io/engine/mapping.hpp"

namespace embstore::io {

// The most bytes one read of a page file takes (pages next to each other), and the most its
// staging buffers (queue_depth of them, registered and so resident) take together: a deep queue
// gets shorter runs. A buffer holds at least one page.
inline constexpr size_t kReadRunBytes = size_t{64} << 10;
inline constexpr size_t kStagingBytes = size_t{4} << 20;

struct PageFileOptions {
  size_t page_bytes = kAlignment;  // a multiple of kAlignment, at most 1 GiB
  unsigned queue_depth = 32;       // reads/writes in flight at once; a staging buffer each
  bool direct = true;              // try O_DIRECT (falls back to buffered on EINVAL)
  bool allow_uring = true;         // try io_uring (falls back to pwrite/pread)
  bool unnamed = true;             // try O_TMPFILE (falls back to a named file, unlinked at once)
};

class PageFile {
 public:
  // An empty page file in dir. The directory is checked first, and *detail names it with what is
  // wrong: -ENOENT (missing), -ENOTDIR (not a directory), -EINVAL (on tmpfs or ramfs: its pages
  // would be memory, not disk), -EACCES or -EROFS (no file can be created there, as open()
  // reports it); -EINVAL for bad options; other -errno from open, mmap or fcntl.
  static int create(const std::string& dir, const PageFileOptions& options,
                    std::unique_ptr<PageFile>* out, std::string* detail);
  // Waits for anything in flight (nothing, unless a ring failed mid-batch), then closes: the
  // file and its space go with the descriptor.
  ~PageFile();
  PageFile(const PageFile&) = delete;
  PageFile& operator=(const PageFile&) = delete;

  // n page numbers in *pages (replacing what it held): released pages first, lowest first, then
  // new pages at the end of the file, whose space is allocated now (fallocate; where the file
  // system cannot, the file is only extended, and a full disk shows at write). All or nothing:
  // on failure *pages is left as it was and no page is handed out. -ENOSPC or -EDQUOT naming the
  // directory and the bytes asked for; -EFBIG past the largest file offset.
  int allocate(size_t n, std::vector<uint64_t>* pages, std::string* detail);
  // Hands pages back for reuse. Pages not in use (never allocated, or released already) are
  // ignored. Their space stays with the file, which never shrinks.
  void release(const std::vector<uint64_t>& pages);

  // Where write_with() gets page i's image and read_with() hands page i's bytes: page is a
  // staging buffer of the file's (page_bytes(), aligned), valid during the call only. Called on
  // the calling thread, in no particular order: fill at most once a page, before its write
  // (a batch that fails may leave pages filled and not written); take exactly once for each page
  // read whole, never for one whose read failed. They must not throw (requests may be in flight).
  using PageFill = std::function<void(size_t i, char* page)>;
  using PageTake = std::function<void(size_t i, const char* page)>;

  // Writes fill's image of pages[i] to pages[i], for every i, queue_depth() at a time, the image
  // built straight into the buffer the write goes from (no copy of the caller's). A page at most
  // once per call (else which write lands is not known). Returns 0, or the first error: -EINVAL
  // before any I/O for a page not in use or an empty fill; -ENOSPC, -EIO, ... of a write (the fault
  // hook of io/engine/fault.hpp is asked before each one, as for FileWriter). After an error no
  // further write starts, and the call returns only once those in flight are done; the pages of a
  // failed call hold old or new contents.
  int write_with(const std::vector<uint64_t>& pages, const PageFill& fill, std::string* detail);
  // Reads pages[i] and hands its bytes to take(i, page), for every i, the same way (the read
  // fault hook of io/engine/fault.hpp is asked before each read), except that pages next to
  // each other in the file and in `pages` (p, p + 1, ...) are one read of up to
  // run_pages() pages: a caller that sorts its pages reads adjacent ones at the disk's
  // bandwidth rather than a request each. A page that was allocated but never written reads as
  // zeros. -EIO when the file is shorter than the page
  // (it was cut behind this object's back): a short read is never handed out as data. -EINVAL
  // for an empty take. On an error some pages may have been handed to take already.
  int read_with(const std::vector<uint64_t>& pages, const PageTake& take, std::string* detail);
  // write_with and read_with over caller memory: page_bytes() from or to data[i] (any
  // alignment); -EINVAL before any I/O for a null pointer.
  int write(const std::vector<uint64_t>& pages, const char* const* data, std::string* detail);
  int read(const std::vector<uint64_t>& pages, char* const* data, std::string* detail);

  uint64_t pages_in_use() const { return file_pages_ - free_.size(); }
  // The file's size in pages: pages in use plus released ones waiting for reuse.
  uint64_t file_pages() const { return file_pages_; }
  size_t page_bytes() const { return page_bytes_; }
  unsigned queue_depth() const { return queue_depth_; }
  // The most pages one read takes: min(kReadRunBytes, kStagingBytes / queue_depth()) of them,
  // at least one.
  size_t run_pages() const { return run_pages_; }
  // Bytes of pages written and read successfully, since creation.
  uint64_t bytes_written() const { return bytes_written_; }
  uint64_t bytes_read() const { return bytes_read_; }
  // "io_uring+O_DIRECT", "io_uring", "pread/pwrite+O_DIRECT" or "pread/pwrite".
  const char* engine() const { return engine_; }
  // False when the file is named (and unlinked): the file system has no O_TMPFILE, or the
  // options said so.
  bool unnamed() const { return unnamed_; }
  const std::string& dir() const { return dir_; }

 private:
  // One staging buffer's request: which entries of the call's pages (count of them from item,
  // consecutive pages), and how many bytes of them are done.
  struct Slot {
    size_t item = 0;
    size_t count = 1;
    size_t done = 0;
  };

  PageFile() = default;
  int open_file(const PageFileOptions& options, std::string* notes, std::string* detail);
  int setup_engine(const PageFileOptions& options, std::string* notes, std::string* detail);
  char* buffer(unsigned index) const {
    return static_cast<char*>(buffers_.data()) + size_t{index} * run_pages_ * page_bytes_;
  }
  // How many of pages[first..] one request takes: 1 for a write, else the run of consecutive
  // pages there, at most run_pages_.
  size_t run_at(bool write, const std::vector<uint64_t>& pages, size_t first) const;
  // Refuses a batch with a page not in use, or any batch once the ring broke, before any I/O.
  int check_pages(bool write, const std::vector<uint64_t>& pages, std::string* detail) const;
  // -EINVAL for write_with() or read_with() without a callback.
  int no_callback(bool write, size_t pages, std::string* detail) const;
  // Refuses null buffers in the caller memory of write() and read().
  int check_buffers(bool write, const std::vector<uint64_t>& pages, const char* const* data,
                    std::string* detail) const;
  // The batch behind write_with() and read_with(): fill for writes, take for reads.
  int transfer(bool write, const std::vector<uint64_t>& pages, const PageFill& fill,
               const PageTake& take, std::string* detail);
  int transfer_uring(bool write, const std::vector<uint64_t>& pages, const PageFill& fill,
                     const PageTake& take, std::string* detail);
  int transfer_sync(bool write, const std::vector<uint64_t>& pages, const PageFill& fill,
                    const PageTake& take, std::string* detail);
  std::string describe(bool write, uint64_t page, int err) const;

  std::string dir_;
  int fd_ = -1;
  size_t page_bytes_ = 0;
  unsigned queue_depth_ = 0;
  bool direct_ = false;
  bool unnamed_ = false;
  const char* engine_ = "";
  size_t run_pages_ = 1;
  Mapping buffers_;              // queue_depth_ staging buffers of run_pages_ pages each
  detail::Ring ring_;            // after buffers_: torn down (and drained) before they are unmapped
  std::vector<Slot> slots_;      // one per staging buffer
  std::vector<unsigned> spare_;  // staging buffers not in flight
  uint64_t file_pages_ = 0;
  std::vector<bool> in_use_;  // file_pages_ bits
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<uint64_t>> free_;
  uint64_t bytes_written_ = 0;
  uint64_t bytes_read_ = 0;
};

}  // namespace embstore::io
