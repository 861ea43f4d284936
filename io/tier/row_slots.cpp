#include "io/tier/row_slots.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <numeric>

namespace embstore::io {

namespace {

// PageFile's largest page: a row must fit one.
constexpr size_t kMaxRowBytes = size_t{1} << 30;

void set_detail(std::string* detail, std::string message) {
  if (detail != nullptr) *detail = std::move(message);
}

}  // namespace

int RowSlots::create(const std::string& dir, size_t row_bytes, const RowSlotsOptions& options,
                     std::unique_ptr<RowSlots>* out, std::string* detail) {
  if (out == nullptr) return -EINVAL;
  if (row_bytes == 0 || row_bytes > kMaxRowBytes) {
    set_detail(detail,
               fmt::format("tier row size {} is not within 1 to {}", row_bytes, kMaxRowBytes));
    return -EINVAL;
  }
  // Written this way round so that NaN fails too.
  if (!(options.compact_dead_fraction >= 0 && options.compact_dead_fraction <= 1)) {
    set_detail(detail, fmt::format("tier compaction fraction {} is not within 0 to 1",
                                   options.compact_dead_fraction));
    return -EINVAL;
  }
  if (options.compact_max_pages == 0) {
    set_detail(detail, "tier compaction of at most 0 pages");
    return -EINVAL;
  }

  std::unique_ptr<RowSlots> s(new (std::nothrow) RowSlots());
  if (!s) return -ENOMEM;
  PageFileOptions po;
  po.page_bytes = detail::align_up(row_bytes);
  po.queue_depth = options.queue_depth;
  po.direct = options.direct;
  po.allow_uring = options.allow_uring;
  if (const int r = PageFile::create(dir, po, &s->file_, detail); r < 0) return r;
  s->row_bytes_ = row_bytes;
  s->rows_per_page_ = po.page_bytes / row_bytes;
  s->compact_dead_fraction_ = options.compact_dead_fraction;
  s->compact_max_pages_ = options.compact_max_pages;
  *out = std::move(s);
  return 0;
}

uint64_t RowSlots::mark_live(const std::vector<uint64_t>& pages, size_t i) {
  const uint64_t page = pages[i / rows_per_page_];
  const uint64_t handle = page * rows_per_page_ + i % rows_per_page_;
  live_[handle] = true;
  ++page_live_[page];
  ++live_rows_;
  return handle;
}

void RowSlots::kill(uint64_t handle, std::vector<uint64_t>* emptied) {
  const uint64_t page = handle / rows_per_page_;
  live_[handle] = false;
  --live_rows_;
  if (--page_live_[page] == 0) emptied->push_back(page);
}

int RowSlots::write_rows(size_t n, const char* const* rows, std::vector<uint64_t>* pages,
                         std::string* detail) {
  const size_t page_bytes = file_->page_bytes();
  const size_t count = (n + rows_per_page_ - 1) / rows_per_page_;
  if (const int r = file_->allocate(count, pages, detail); r < 0) return r;
  // The bookkeeping follows the file's size; harmless if the write fails below.
  live_.resize(file_->file_pages() * rows_per_page_, false);
  page_live_.resize(file_->file_pages(), 0);

  // Each page's image is built in the buffer its write goes from: the rows, then zeros (not
  // bytes of an earlier batch).
  const auto fill = [&](size_t j, char* image) {
    const size_t row0 = j * rows_per_page_;
    const size_t k = std::min(rows_per_page_, n - row0);
    for (size_t s = 0; s < k; ++s) std::memcpy(image + s * row_bytes_, rows[row0 + s], row_bytes_);
    std::memset(image + k * row_bytes_, 0, page_bytes - k * row_bytes_);
  };
  if (const int r = file_->write_with(*pages, fill, detail); r < 0) {
    file_->release(*pages);
    pages->clear();
    return r;
  }
  return 0;
}

int RowSlots::read_rows(size_t n, const uint64_t* handles, char* const* rows, std::string* detail) {
  // By handle, so that the rows of a page are next to each other and the pages go in file order
  // (the page file reads neighbouring pages together).
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(),
            [handles](size_t a, size_t b) { return handles[a] < handles[b]; });
  // The distinct pages, and where each one's rows start in `order`.
  std::vector<uint64_t> pages;
  std::vector<size_t> first;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t page = handles[order[i]] / rows_per_page_;
    if (pages.empty() || pages.back() != page) {
      pages.push_back(page);
      first.push_back(i);
    }
  }
  first.push_back(n);
  // Each row straight from the buffer its page landed in.
  const auto take = [&](size_t j, const char* image) {
    for (size_t i = first[j]; i < first[j + 1]; ++i) {
      const uint64_t h = handles[order[i]];
      std::memcpy(rows[order[i]], image + (h % rows_per_page_) * row_bytes_, row_bytes_);
    }
  };
  return file_->read_with(pages, take, detail);
}

int RowSlots::put(size_t n, const char* const* rows, uint64_t* handles, std::string* detail) {
  if (n == 0) return 0;
  if (rows == nullptr || handles == nullptr) {
    set_detail(detail, fmt::format("tier put of {} rows without rows or handles", n));
    return -EINVAL;
  }
  for (size_t i = 0; i < n; ++i) {
    if (rows[i] == nullptr) {
      set_detail(detail, fmt::format("tier put: row {} of {} is null", i, n));
      return -EINVAL;
    }
  }
  std::vector<uint64_t> pages;
  if (const int r = write_rows(n, rows, &pages, detail); r < 0) return r;
  // Every page is on disk: only now do the rows exist.
  for (size_t i = 0; i < n; ++i) handles[i] = mark_live(pages, i);
  return 0;
}

int RowSlots::get(size_t n, const uint64_t* handles, char* const* rows, std::string* detail) {
  if (n == 0) return 0;
  if (handles == nullptr || rows == nullptr) {
    set_detail(detail, fmt::format("tier get of {} rows without handles or rows", n));
    return -EINVAL;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!live(handles[i])) {
      set_detail(detail, fmt::format("tier get: handle {} (entry {}) is not live", handles[i], i));
      return -EINVAL;
    }
    if (rows[i] == nullptr) {
      set_detail(detail, fmt::format("tier get: no buffer for entry {}", i));
      return -EINVAL;
    }
  }
  return read_rows(n, handles, rows, detail);
}

void RowSlots::free(size_t n, const uint64_t* handles) {
  if (handles == nullptr) return;
  std::vector<uint64_t> emptied;
  for (size_t i = 0; i < n; ++i) {
    if (live(handles[i])) kill(handles[i], &emptied);
  }
  file_->release(emptied);
}

int RowSlots::compact(std::vector<std::pair<uint64_t, uint64_t>>* moved, std::string* detail) {
  if (moved == nullptr) return -EINVAL;
  moved->clear();
  const uint64_t slots = file_->pages_in_use() * rows_per_page_;
  const uint64_t dead = slots - live_rows_;
  if (dead == 0 || static_cast<double>(dead) <= compact_dead_fraction_ * slots) return 0;

  // The pages with dead slots, sparsest first (then lowest, for a stable choice). A page in use
  // has at least one live row: free() releases it with its last.
  std::vector<uint64_t> sparse;
  for (uint64_t p = 0; p < page_live_.size(); ++p) {
    if (page_live_[p] > 0 && page_live_[p] < rows_per_page_) sparse.push_back(p);
  }
  std::sort(sparse.begin(), sparse.end(), [this](uint64_t a, uint64_t b) {
    return page_live_[a] != page_live_[b] ? page_live_[a] < page_live_[b] : a < b;
  });
  // Taking one more page saves one page or none (it holds under a page of rows), so the pages
  // saved never fall as k grows: take the fewest pages that save the most, and stop early
  // once the dead slots left are at most half the fraction, so that the next compact() is far
  // off rather than one free() away.
  size_t take = 0;
  uint64_t saved = 0;
  uint64_t rows = 0;
  for (size_t k = 1; k <= std::min(sparse.size(), compact_max_pages_); ++k) {
    rows += page_live_[sparse[k - 1]];
    const uint64_t s = k - (rows + rows_per_page_ - 1) / rows_per_page_;
    if (s > saved) {
      saved = s;
      take = k;
    }
    const uint64_t slots_after = slots - s * rows_per_page_;
    if (static_cast<double>(dead - s * rows_per_page_) <=
        compact_dead_fraction_ / 2 * slots_after) {
      break;
    }
  }
  if (saved == 0) return 0;

  std::vector<uint64_t> old;
  for (size_t k = 0; k < take; ++k) {
    const uint64_t first = sparse[k] * rows_per_page_;
    for (uint64_t h = first; h < first + rows_per_page_; ++h) {
      if (live_[h]) old.push_back(h);
    }
  }
  std::vector<char> bytes(old.size() * row_bytes_);
  std::vector<char*> out(old.size());
  for (size_t i = 0; i < old.size(); ++i) out[i] = bytes.data() + i * row_bytes_;
  if (const int r = read_rows(old.size(), old.data(), out.data(), detail); r < 0) return r;
  std::vector<uint64_t> pages;
  const std::vector<const char*> in(out.begin(), out.end());
  if (const int r = write_rows(old.size(), in.data(), &pages, detail); r < 0) return r;

  // The new copies are on disk: only now do the old ones die and their pages go back.
  moved->reserve(old.size());
  std::vector<uint64_t> emptied;
  for (size_t i = 0; i < old.size(); ++i) {
    moved->emplace_back(old[i], mark_live(pages, i));
    kill(old[i], &emptied);
  }
  file_->release(emptied);
  return 0;
}

}  // namespace embstore::io
