// The host table's setup and growth (the arena's chunks, its dirty bits and its index), the
// find-or-add of a key's row that every insert goes through, its counters, and the factory.
// The class is declared in host_table.hpp.
#include "host/backend/host_table.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/index.h"
#include "host/error.hpp"

namespace embstore::host_backend {

HostTable::HostTable(TableSpec spec, ThreadPool& pool)
    : Table(std::move(spec)), pool_(pool), ledger_(this->spec()) {
  arena_.base_shift = row::base_shift_for(this->spec().initial_capacity);
  arena_.dim = this->spec().dim;
  arena_.stride = this->spec().stride();
  tiered_ = this->spec().tiered();
  home_.base_shift = arena_.base_shift;
  heat_.base_shift = arena_.base_shift;
  reserve_rows(this->spec().initial_capacity);
  if (tiered_) open_tier();
}

HostTable::~HostTable() {
  if (!prefetch_thread_.joinable()) return;
  {
    std::lock_guard lock(prefetch_mutex_);
    prefetch_stop_ = true;
  }
  prefetch_cv_.notify_all();
  prefetch_thread_.join();  // after the read in flight, if any
}

TableCounters HostTable::counters() {
  std::lock_guard lock(mutex_);
  TableCounters c;
  c.rows = rows_;
  c.capacity = row::arena_capacity(chunks_, arena_.base_shift);
  c.dirty_rows = row::bitmap_count(dirty_.data(), 0, dirty_.size());
  c.inserted = inserted_;
  c.evicted = ledger_.evicted_total();
  c.skipped_keys = skipped_;
  c.admitted = admitted_;
  c.pending_admission = ledger_.pending_admission();
  c.rows_in_memory = tiered_ ? resident_ : rows_;
  c.rows_on_disk = rows_ - c.rows_in_memory;
  c.rows_moved_up = moved_up_;
  c.rows_moved_down = moved_down_;
  if (disk_ != nullptr) {
    std::lock_guard disk_lock(disk_mutex_);
    c.tier_bytes_read = disk_->bytes_read();
    c.tier_bytes_written = disk_->bytes_written();
  }
  return c;
}

void HostTable::set_dirty_tracking(bool on) {
  std::lock_guard lock(mutex_);
  dirty_tracking_ = on;
}

// The key's row, or a new one (a freed row first, else the next fresh one; *fresh tells
// which) placed in the index. The caller fills a new row.
uint32_t HostTable::find_or_add_row(int64_t key, bool* added) {
  const bool reuse = !free_rows_.empty();
  if (!reuse && next_row_ == room_) reserve_rows(next_row_ + 1);  // doubles arena or index
  const uint32_t candidate = reuse ? free_rows_.back() : static_cast<uint32_t>(next_row_);
  bool inserted = false;
  const uint32_t r = index_.find_or_insert_serial(key, candidate, &inserted);
  if (inserted) {
    if (reuse) {
      free_rows_.pop_back();
      row::bitmap_clear<false>(freed_.data(), r);
    } else {
      ++next_row_;
    }
    ++rows_;
    arena_.row_meta(r)->key = key;
  }
  if (added != nullptr) *added = inserted;
  return r;
}

// Makes room for `rows` rows: arena chunks (rows never move), dirty bits, and an index that
// stays at most half full (rebuilt at the new size).
void HostTable::reserve_rows(uint64_t rows) {
  while (row::arena_capacity(chunks_, arena_.base_shift) < rows) {
    if (chunks_ == row::kMaxChunks) fail(EMBSTORE_OUT_OF_MEMORY, "row arena is at its limit");
    const uint64_t n = row::chunk_rows(chunks_, arena_.base_shift);
    HostBuffer meta(n * sizeof(row::RowMeta));
    if (tiered_) {  // values live in frames (reserve_frames); each row gets its home and heat
      HostBuffer homes(n * (sizeof(uint32_t) + sizeof(uint8_t)));
      home_.chunks[chunks_] = homes.as<uint32_t>();
      heat_.chunks[chunks_] = reinterpret_cast<uint8_t*>(homes.as<uint32_t>() + n);
      home_chunks_.push_back(std::move(homes));
    } else {
      HostBuffer values(n * arena_.stride * sizeof(float));
      arena_.values[chunks_] = values.as<float>();
      value_chunks_.push_back(std::move(values));
    }
    arena_.meta[chunks_] = meta.as<row::RowMeta>();
    meta_chunks_.push_back(std::move(meta));
    ++chunks_;
  }
  const uint64_t words = row::bitmap_words(row::arena_capacity(chunks_, arena_.base_shift));
  dirty_.resize(words, 0);
  if (!carried_.empty()) carried_.resize(words, 0);
  if (tiered_) moving_.resize(words, 0);
  freed_.resize(words, 0);
  // New rows are never captured: the bitmaps of a snapshot in progress keep their size
  // (drain reads captured_ without the lock).
  // The index stays at most half full; a tiered table's, at most three quarters: it holds an
  // entry for every row wherever the row lives, and with most rows on disk it is most of the
  // table's memory (a 20M-row table's: 512 MiB instead of 1 GiB; linear probing at 3/4 still
  // finds a key in about 2.5 slots on average).
  const uint64_t slots = row::index_slots_for(tiered_ ? rows - rows / 3 : rows);
  if (index_.slots == nullptr || slots > index_.mask + 1) rebuild_index(slots);
  const uint64_t index_room = tiered_ ? (index_.mask + 1) / 4 * 3 : (index_.mask + 1) / 2;
  room_ = std::min(row::arena_capacity(chunks_, arena_.base_shift), index_room);
}

void HostTable::rebuild_index(uint64_t slots) {
  HostBuffer buffer(slots * sizeof(row::Slot));
  row::IndexRef index{buffer.as<row::Slot>(), slots - 1};
  // Every row = kEmptyRow; in parallel, as this is the index's first touch.
  pool_.parallel_for(slots, size_t{1} << 16, [&](size_t begin, size_t end) {
    std::memset(index.slots + begin, 0xFF, (end - begin) * sizeof(row::Slot));
  });
  if (index_.slots != nullptr) {
    for (uint64_t s = 0; s <= index_.mask; ++s) {
      const row::Slot& old = index_.slots[s];
      if (old.row < row::kMaxRows) index.insert_absent(old.key, old.row);
    }
  }
  index_buffer_ = std::move(buffer);
  index_ = index;
}

}  // namespace embstore::host_backend

namespace embstore {

std::unique_ptr<Table> make_host_table(TableSpec spec, ThreadPool& pool) {
  return std::make_unique<host_backend::HostTable>(std::move(spec), pool);
}

}  // namespace embstore
