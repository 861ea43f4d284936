// Row arena: rows live in chunks whose sizes double (base, 2*base, 4*base, ...), so a table
// grows without moving a row, and row -> chunk is two bit operations.
#pragma once

#include "cuda/row/hd.h"

namespace embstore::row {

inline constexpr int kMaxChunks = 32;

// Per-row metadata kept beside the values: the reverse map row -> key (checkpoint drain,
// eviction, index rebuild) and the last step that touched the row.
struct RowMeta {
  int64_t key;
  uint64_t step;
};

struct ChunkPos {
  uint32_t chunk;
  uint64_t offset;
};

EMBSTORE_HD ChunkPos chunk_of(uint64_t row, uint32_t base_shift) {
  const uint64_t q = row + (uint64_t{1} << base_shift);
  const int top = msb64(q);
  return {static_cast<uint32_t>(top - static_cast<int>(base_shift)), q - (uint64_t{1} << top)};
}

// log2 of chunk 0's rows: at least initial_capacity, and at least 64 (one bitmap word).
EMBSTORE_HD uint32_t base_shift_for(uint64_t initial_capacity) {
  uint32_t shift = 6;
  while ((uint64_t{1} << shift) < initial_capacity) ++shift;
  return shift;
}

EMBSTORE_HD uint64_t chunk_rows(uint32_t chunk, uint32_t base_shift) {
  return uint64_t{1} << (base_shift + chunk);
}

// Rows held by the first `chunks` chunks.
EMBSTORE_HD uint64_t arena_capacity(uint32_t chunks, uint32_t base_shift) {
  return ((uint64_t{1} << chunks) - 1) << base_shift;
}

// Where a device budget puts a chunk's rows: the arena's rows below device_rows in device
// memory, the rest in host memory (the CUDA backend's device tier); device_rows == 0: every row
// in device memory. A chunk the budget cuts has rows of both kinds.
struct ChunkPlacement {
  uint64_t device_rows;  // the chunk's first rows
  uint64_t host_rows;    // the rows after them
};

EMBSTORE_HD ChunkPlacement place_chunk(uint32_t chunk, uint32_t base_shift, uint64_t device_rows) {
  const uint64_t rows = chunk_rows(chunk, base_shift);
  if (device_rows == 0) return {rows, 0};
  const uint64_t first = arena_capacity(chunk, base_shift);
  const uint64_t on_device =
      device_rows <= first ? 0 : (device_rows - first < rows ? device_rows - first : rows);
  return {on_device, rows - on_device};
}

// Trivially copyable view of an arena; passed by value to kernels. A row's record is
// [value: dim floats][optimizer state: state_dim floats], `stride` floats in all.
//
// One chunk's values may lie in two allocations: the CUDA backend's device tier keeps the rows
// below a budget in device memory and the rest in host memory, and the budget need not fall on
// a chunk's edge. Rows of chunk split_chunk from split_offset on are at split_values;
// split_chunk == kMaxChunks (the default): no chunk is split.
struct ArenaRef {
  float* values[kMaxChunks];
  RowMeta* meta[kMaxChunks];
  uint32_t base_shift;
  uint32_t dim;
  uint32_t stride;
  uint32_t split_chunk = kMaxChunks;
  uint64_t split_offset = 0;
  float* split_values = nullptr;

  EMBSTORE_HD float* row(uint64_t r) const {
    const ChunkPos p = chunk_of(r, base_shift);
    if (p.chunk == split_chunk && p.offset >= split_offset) {
      return split_values + (p.offset - split_offset) * stride;
    }
    return values[p.chunk] + p.offset * stride;
  }
  EMBSTORE_HD RowMeta* row_meta(uint64_t r) const {
    const ChunkPos p = chunk_of(r, base_shift);
    return meta[p.chunk] + p.offset;
  }
};

}  // namespace embstore::row
