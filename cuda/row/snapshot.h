// Snapshot bit operations (docs/DESIGN.md, "Snapshot pipeline"): capture turns the active
// dirty bitmap (or every live row) into the captured bitmap, drain and copy-on-write take rows
// out of it exactly once, and each taken row becomes one staging record.
#pragma once

#include "cuda/row/bitmap.h"
#include "cuda/row/hd.h"

namespace embstore::row {

// Bits of word `word` that belong to rows below `rows` (the rows ever handed out).
EMBSTORE_HD uint64_t live_mask(uint64_t word, uint64_t rows) {
  const uint64_t first = word * 64;
  if (rows <= first) return 0;
  if (rows - first >= 64) return ~uint64_t{0};
  return (uint64_t{1} << (rows - first)) - 1;
}

// Capture of one bitmap word: the rows a checkpoint must write (every live row for a full one,
// the dirty rows for an incremental one). The active bits are cleared: changes from here on
// belong to the next checkpoint. `freed`: the word's rows that were evicted and not reused
// (they hold no key). Returns the captured word.
EMBSTORE_HD uint64_t capture_word(bool full, uint64_t* dirty, uint64_t* captured, uint64_t word,
                                  uint64_t rows, uint64_t freed = 0) {
  const uint64_t taken = (full ? live_mask(word, rows) : dirty[word]) & ~freed;
  captured[word] = taken;
  dirty[word] = 0;
  return taken;
}

// After a failed snapshot, word `word` of dirty gets back the rows the snapshot captured that
// are still live (freed: the word's evicted rows, written off with tombstones).
EMBSTORE_HD void restore_dirty_word(uint64_t* dirty, const uint64_t* snapshot_set, uint64_t word,
                                    uint64_t freed = 0) {
  dirty[word] |= snapshot_set[word] & ~freed;
}

// Takes `row` out of the captured bitmap; true for the one caller that found it captured (the
// one that must write the row's captured contents). Concurrent as in bitmap_set.
template <bool Concurrent>
EMBSTORE_HD bool take_captured(uint64_t* captured, uint64_t row) {
  const uint64_t bit = uint64_t{1} << (row & 63);
  uint64_t before;
  if constexpr (Concurrent) {
    before = atomic_and(&captured[row >> 6], ~bit);
  } else {
    before = captured[row >> 6];
    captured[row >> 6] = before & ~bit;
  }
  return (before & bit) != 0;
}

// Takes at most `max_rows` of the lowest captured rows of word `word` (concurrently with
// take_captured on single rows); returns the bits taken, each for this caller alone.
EMBSTORE_HD uint64_t take_captured_rows(uint64_t* captured, uint64_t word, uint64_t max_rows) {
  uint64_t want = 0, rest = atomic_load(&captured[word]);
  for (uint64_t n = 0; n < max_rows && rest != 0; ++n) {
    want |= rest & (~rest + 1);  // the lowest set bit
    rest &= rest - 1;
  }
  return atomic_and(&captured[word], ~want) & want;
}

// A staging record: the key, then the row's `stride` floats (value, then optimizer state),
// padded to 8 bytes so that every record's key is aligned.
EMBSTORE_HD uint64_t record_bytes(uint32_t stride) {
  return (8 + uint64_t{stride} * 4 + 7) / 8 * 8;
}

EMBSTORE_HD void write_record(char* record, int64_t key, const float* row, uint32_t stride) {
  memcpy(record, &key, sizeof(key));
  memcpy(record + 8, row, uint64_t{stride} * 4);
}

// One 8-byte word from src to dst, both 8-byte aligned: a single 64-bit load and store on the
// device, where a memcpy through char pointers may go byte by byte.
EMBSTORE_HD void copy_word8(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  *static_cast<uint2*>(dst) = *static_cast<const uint2*>(src);
#else
  memcpy(dst, src, 8);
#endif
}

EMBSTORE_HD void copy_word4(void* dst, const void* src) {
#if defined(__CUDA_ARCH__)
  *static_cast<uint32_t*>(dst) = *static_cast<const uint32_t*>(src);
#else
  memcpy(dst, src, 4);
#endif
}

// Lane `lane` of a tile of `lanes` threads that write one staging record together: the bytes of
// write_record, padding zeroed. Consecutive lanes take consecutive words, so a tile's accesses
// coalesce, and the row moves in 8-byte words where it starts 8-byte aligned (in floats
// otherwise). `record` is 8-byte aligned (records are record_bytes apart in aligned memory).
EMBSTORE_HD void write_record_part(char* record, int64_t key, const float* row, uint32_t stride,
                                   uint32_t lane, uint32_t lanes) {
  const uint64_t used = 8 + uint64_t{stride} * 4;
  if (lane == 0) {
    copy_word8(record, &key);
    const uint32_t zero = 0;
    if (record_bytes(stride) > used) copy_word4(record + used, &zero);  // 4 bytes of padding
  }
  char* out = record + 8;
  const char* in = reinterpret_cast<const char*>(row);
  uint32_t done = 0;
  if ((reinterpret_cast<uintptr_t>(row) & 7) == 0) {
    const uint32_t pairs = stride / 2;
    for (uint32_t p = lane; p < pairs; p += lanes) copy_word8(out + p * 8, in + p * 8);
    done = pairs * 2;
  }
  for (uint32_t c = done + lane; c < stride; c += lanes) copy_word4(out + c * 4, in + c * 4);
}

// Lane `lane` of a tile moving one whole record of `record_size` bytes (a multiple of 8) between
// 8-byte aligned places.
EMBSTORE_HD void move_record_part(char* dst, const char* src, uint64_t record_size, uint32_t lane,
                                  uint32_t lanes) {
  for (uint64_t w = lane; w < record_size / 8; w += lanes) copy_word8(dst + w * 8, src + w * 8);
}

}  // namespace embstore::row
