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

// Trivially copyable view of an arena; passed by value to kernels. A row's record is
// [value: dim floats][optimizer state: state_dim floats], `stride` floats in all.
struct ArenaRef {
  float* values[kMaxChunks];
  RowMeta* meta[kMaxChunks];
  uint32_t base_shift;
  uint32_t dim;
  uint32_t stride;

  EMBSTORE_HD float* row(uint64_t r) const {
    const ChunkPos p = chunk_of(r, base_shift);
    return values[p.chunk] + p.offset * stride;
  }
  EMBSTORE_HD RowMeta* row_meta(uint64_t r) const {
    const ChunkPos p = chunk_of(r, base_shift);
    return meta[p.chunk] + p.offset;
  }
};

}  // namespace embstore::row
