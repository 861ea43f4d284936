// Fixed-size row records in the SSD tier's page file (issue 34, second layer): a table moves rows
// beyond its memory budget down here in batches and brings them up in batches. A row is opaque
// bytes (row_bytes each: the table puts a row's value and optimizer state there) and has one
// home on disk, named by a 64-bit handle that the table keeps in its index.
//
//   std::unique_ptr<RowSlots> s;
//   std::string detail;
//   if (int r = RowSlots::create(tier_dir, row_bytes, {}, &s, &detail); r < 0) return r;
//   const char* rows[] = {a, b};  // row_bytes each, any alignment
//   uint64_t h[2];
//   if (int r = s->put(2, rows, h, &detail); r < 0) return r;  // nothing handed out
//   char* back[] = {x, y};
//   if (int r = s->get(2, h, back, &detail); r < 0) return r;
//   s->free(2, h);  // the rows are gone; their page is reused once all its rows are
//   std::vector<std::pair<uint64_t, uint64_t>> moved;  // (old handle, new handle)
//   if (int r = s->compact(&moved, &detail); r < 0) return r;  // every old handle still valid
//
// Layout: a page is the smallest multiple of kAlignment that holds a row, so a row never
// straddles pages and a get reads the fewest bytes; rows_per_page() = page_bytes() / row_bytes()
// rows sit at the front of each page, slot after slot. handle = page * rows_per_page() + slot.
//
// Pages are written once and never rewritten in place: put() and compact() write fresh pages
// only, so a failed or torn write can never damage rows already there (a page holding live rows
// is only ever read). The price is that a put of fewer rows than a page holds leaves the rest of
// its last page unused (dead) until compaction: the table should move rows down in batches.
//
// Handles: valid from put() (or compact(), which reports the new one) until free() or compact()
// moves the row. After that the number may be handed out again for another row, when its page is
// reused: the table must drop a handle it freed and apply every move compact() reports.
//
// liburing style: every call returns 0 or -errno, with a message in *detail (may be null) where
// one helps; nothing throws. Not thread-safe: one caller at a time, reads included (they share
// the page file's ring and buffers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/tier/page_file.hpp"

namespace embstore::io {

struct RowSlotsOptions {
  unsigned queue_depth = 32;  // passed to PageFile
  bool direct = true;         // passed to PageFile
  bool allow_uring = true;    // passed to PageFile
  // compact() works only when the dead slots (freed, moved, or never filled) are more than this
  // fraction of the slots in the pages in use; within [0, 1]. 0: whenever a page can be saved;
  // 1: never.
  double compact_dead_fraction = 0.5;
  // The most pages one compact() call reads (and so the most rows it holds in memory); the
  // sparsest go first. The table calls again while dead_slots() stays high.
  size_t compact_max_pages = 1024;
};

class RowSlots {
 public:
  // Row slots of row_bytes (1 to 1 GiB) in a new page file in dir. -EINVAL for bad options;
  // else what PageFile::create returns, with its message naming the directory.
  static int create(const std::string& dir, size_t row_bytes, const RowSlotsOptions& options,
                    std::unique_ptr<RowSlots>* out, std::string* detail);
  RowSlots(const RowSlots&) = delete;
  RowSlots& operator=(const RowSlots&) = delete;

  // Writes rows[0..n) (row_bytes each, any alignment) into fresh pages and sets handles[i] to
  // row i's handle; rows of one call share pages. All or nothing: on error no handle is written
  // or becomes live, and the pages taken for the batch are released. -EINVAL before any I/O for
  // null arrays or a null row; allocate's -ENOSPC, -EDQUOT, -EFBIG; a write's -errno.
  int put(size_t n, const char* const* rows, uint64_t* handles, std::string* detail);
  // Copies the rows of handles[0..n) into rows[i] (row_bytes each, any alignment). A page is read
  // once per call however many of its rows are asked for, repeats included. -EINVAL before any
  // I/O for a handle that is not live (never handed out, freed, or moved) or a null pointer; a
  // read's -errno (then rows[] hold some rows, not all).
  int get(size_t n, const uint64_t* handles, char* const* rows, std::string* detail);
  // The rows of handles[0..n) are dead; a page left without live rows goes back to the page file
  // for reuse. Handles not live are ignored, as PageFile::release ignores pages not in use (a
  // repeat in one call frees once): no I/O, so nothing to fail.
  void free(size_t n, const uint64_t* handles);

  // When dead slots are more than compact_dead_fraction of the slots in use, rewrites the live
  // rows of the sparsest pages (up to compact_max_pages, stopping once the dead slots left are at
  // most half the fraction) into fresh pages, then releases the old pages. *moved is set to one
  // (old handle, new handle) pair per moved row: the old handle is dead, the new one holds the
  // same bytes. Below the fraction, or when no page would be saved, *moved is empty and nothing
  // is read. All or nothing: on error *moved is empty, every old handle stays valid and the
  // fresh pages are released (a read's or a write's -errno, allocate's -ENOSPC...). The fresh
  // pages are taken before the old ones go back: compaction needs that much room in the file.
  int compact(std::vector<std::pair<uint64_t, uint64_t>>* moved, std::string* detail);

  size_t row_bytes() const { return row_bytes_; }
  size_t page_bytes() const { return file_->page_bytes(); }
  size_t rows_per_page() const { return rows_per_page_; }
  uint64_t live_rows() const { return live_rows_; }
  // Slots in the pages in use that hold no live row.
  uint64_t dead_slots() const { return file_->pages_in_use() * rows_per_page_ - live_rows_; }
  uint64_t pages_in_use() const { return file_->pages_in_use(); }
  uint64_t file_pages() const { return file_->file_pages(); }
  uint64_t bytes_read() const { return file_->bytes_read(); }
  uint64_t bytes_written() const { return file_->bytes_written(); }
  const char* engine() const { return file_->engine(); }

 private:
  RowSlots() = default;
  bool live(uint64_t handle) const { return handle < live_.size() && live_[handle]; }
  // Writes rows[0..n) into fresh pages, *pages (replaced) the pages in order: row i lands in
  // (*pages)[i / rows_per_page_], slot i % rows_per_page_. Marks nothing live. On error *pages is
  // empty and the pages it took are released.
  int write_rows(size_t n, const char* const* rows, std::vector<uint64_t>* pages,
                 std::string* detail);
  // Copies live handles[0..n) out to rows[i], each from the page file's buffer its page landed
  // in. On error some rows may have been copied.
  int read_rows(size_t n, const uint64_t* handles, char* const* rows, std::string* detail);
  // Makes row i of write_rows' pages live and returns its handle.
  uint64_t mark_live(const std::vector<uint64_t>& pages, size_t i);
  // Kills a live handle; adds its page to *emptied when that was the page's last live row (the
  // caller releases them together).
  void kill(uint64_t handle, std::vector<uint64_t>* emptied);

  std::unique_ptr<PageFile> file_;
  size_t row_bytes_ = 0;
  size_t rows_per_page_ = 0;
  double compact_dead_fraction_ = 0;
  size_t compact_max_pages_ = 0;
  std::vector<bool> live_;  // by handle; grows with the file
  // Live rows by page; grows with the file. A page holds at most 4096 rows (of one byte: a row
  // over kAlignment gets a page of its own), so 16 bits do, at 2 bytes per 4 KiB of disk.
  std::vector<uint16_t> page_live_;
  uint64_t live_rows_ = 0;
};

}  // namespace embstore::io
