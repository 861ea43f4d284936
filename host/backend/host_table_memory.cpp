// The host table's memory: the arena faulted in ahead of use (the rows asked for at create, or
// those a restore loads), and the rows spilled to a restore's spill file and read back.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "cuda/row/arena.h"
#include "host/backend/host_table.hpp"
#include "host/error.hpp"
#include "io/format/xxh3.hpp"

namespace embstore::host_backend {
namespace {

// prefault_initial_capacity() starts a thread only for more rows up front than this.
constexpr uint64_t kPrefaultAtCreateRows = 1 << 16;

}  // namespace

// On a thread of its own while training starts: the kernel zeroes each page at its first
// touch, which otherwise lands in the inserting lookups of the first steps (bench-peers' DLRM
// step on 2 cores, 4 tables of 1M rows up front: 10-15% more steps/s over 120 steps after 20
// of warm-up). Where the kernel cannot (before Linux 5.14), pages arrive on first touch.
void HostTable::prefault_initial_capacity() {
  std::lock_guard lock(mutex_);
  // A tiered table's memory is its frames, filled as rows come: nothing to fault in ahead.
  if (!tiered_ && spec().initial_capacity > kPrefaultAtCreateRows) {
    (void)prefaulter_.start(row_ranges(0, spec().initial_capacity));
  }
}

// The arena of rows [first, end), values and metadata, as ranges in row order (a few
// thousand rows each, so the two kinds advance together).
std::vector<Prefaulter::Range> HostTable::row_ranges(uint64_t first, uint64_t end) const {
  constexpr uint64_t kRowsPerRange = 1 << 14;
  const uint64_t stride_bytes = uint64_t{arena_.stride} * sizeof(float);
  std::vector<Prefaulter::Range> ranges;
  uint64_t chunk_first = 0;
  for (uint32_t c = 0; c < chunks_ && chunk_first < end; ++c) {
    const uint64_t chunk_end = chunk_first + row::chunk_rows(c, arena_.base_shift);
    for (uint64_t lo = std::max(first, chunk_first); lo < std::min(end, chunk_end);) {
      const uint64_t hi = std::min({end, chunk_end, lo + kRowsPerRange});
      ranges.push_back({value_chunks_[c].as<char>() + (lo - chunk_first) * stride_bytes,
                        (hi - lo) * stride_bytes});
      ranges.push_back({meta_chunks_[c].as<char>() + (lo - chunk_first) * sizeof(row::RowMeta),
                        (hi - lo) * sizeof(row::RowMeta)});
      lo = hi;
    }
    chunk_first = chunk_end;
  }
  return ranges;
}

// Faults in the arena of rows [first, end) (values and metadata) on the pool's threads.
void HostTable::populate_rows(uint64_t first, uint64_t end) {
  const uint64_t stride_bytes = uint64_t{arena_.stride} * sizeof(float);
  uint64_t chunk_first = 0;
  for (uint32_t c = 0; c < chunks_ && chunk_first < end; ++c) {
    const uint64_t chunk_end = chunk_first + row::chunk_rows(c, arena_.base_shift);
    const uint64_t lo = std::max(first, chunk_first), hi = std::min(end, chunk_end);
    if (lo < hi) {
      value_chunks_[c].populate(pool_, (lo - chunk_first) * stride_bytes, (hi - lo) * stride_bytes);
      meta_chunks_[c].populate(pool_, (lo - chunk_first) * sizeof(row::RowMeta),
                               (hi - lo) * sizeof(row::RowMeta));
    }
    chunk_first = chunk_end;
  }
}

// A tiered table's rows are mostly in its tier's file already (and its frames are not laid out
// by row): it stays as it is while a restore replaces it.
bool HostTable::can_spill() const { return !tiered_; }

void HostTable::spill(SpillFile& file) {
  std::lock_guard lock(mutex_);
  prefaulter_.stop();
  // The rows in use of each chunk (rows never move: an arena chunk's rows start at its
  // start), values then metadata; memory given back only once all of it is on the disk.
  std::vector<SpilledChunk> parts;
  const uint64_t stride_bytes = uint64_t{arena_.stride} * sizeof(float);
  uint64_t chunk_first = 0;
  for (uint32_t c = 0; c < chunks_ && chunk_first < next_row_; ++c) {
    const uint64_t chunk_rows = row::chunk_rows(c, arena_.base_shift);
    const uint64_t rows = std::min(next_row_ - chunk_first, chunk_rows);
    SpilledChunk part{c,
                      spill_span(value_chunks_[c], rows * stride_bytes),
                      spill_span(meta_chunks_[c], rows * sizeof(row::RowMeta)),
                      0,
                      0,
                      0,
                      0};
    part.values_xxh3 = io::xxh3_64(value_chunks_[c].as<char>(), part.value_bytes);
    part.meta_xxh3 = io::xxh3_64(meta_chunks_[c].as<char>(), part.meta_bytes);
    check_spill(file.append(value_chunks_[c].as<char>(), part.value_bytes, &part.values_at),
                "write");
    check_spill(file.append(meta_chunks_[c].as<char>(), part.meta_bytes, &part.meta_at), "write");
    parts.push_back(part);
    chunk_first += chunk_rows;
  }
  check_spill(file.settle(), "write");
  for (const SpilledChunk& p : parts) {
    value_chunks_[p.chunk].discard();
    meta_chunks_[p.chunk].discard();
  }
  spilled_ = std::move(parts);
}

void HostTable::unspill(SpillFile& file) {
  std::lock_guard lock(mutex_);
  for (const SpilledChunk& p : spilled_) {
    check_spill(file.read(value_chunks_[p.chunk].as<char>(), p.value_bytes, p.values_at),
                "read back");
    check_spill(file.read(meta_chunks_[p.chunk].as<char>(), p.meta_bytes, p.meta_at), "read back");
    // The disk gave back what it was given, or the restore says the rows are lost.
    if (io::xxh3_64(value_chunks_[p.chunk].as<char>(), p.value_bytes) != p.values_xxh3 ||
        io::xxh3_64(meta_chunks_[p.chunk].as<char>(), p.meta_bytes) != p.meta_xxh3) {
      check_spill(-EBADMSG, "read back (checksum mismatch)");
    }
  }
  spilled_.clear();
}

// `used` bytes at the start of buffer, rounded up to the spill file's alignment: within its
// mapping, which has whole pages.
uint64_t HostTable::spill_span(const HostBuffer& buffer, uint64_t used) {
  constexpr uint64_t a = SpillFile::kAlignment;
  return std::min((used + a - 1) / a * a, (uint64_t{buffer.bytes()} + a - 1) / a * a);
}

void HostTable::check_spill(int r, const char* what) const {
  if (r < 0) {
    fail(EMBSTORE_IO_ERROR, "table '{}': could not {} its rows in the restore's spill file: {}",
         spec().name, what, std::strerror(-r));
  }
}

}  // namespace embstore::host_backend
