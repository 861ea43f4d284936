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

}  // namespace embstore::row
