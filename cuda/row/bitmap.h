// Per-row bitmaps (dirty, and later captured): one bit a row, 64 rows a word.
#pragma once

#include "cuda/row/hd.h"

namespace embstore::row {

EMBSTORE_HD uint64_t bitmap_words(uint64_t rows) { return (rows + 63) / 64; }

EMBSTORE_HD bool bitmap_test(const uint64_t* words, uint64_t row) {
  return (words[row >> 6] >> (row & 63)) & 1u;
}

// Concurrent is false where one thread owns the word (host backend on one thread); it saves
// a locked instruction per row on the fused update path.
template <bool Concurrent>
EMBSTORE_HD void bitmap_set(uint64_t* words, uint64_t row) {
  const uint64_t bit = uint64_t{1} << (row & 63);
  if constexpr (Concurrent) {
    atomic_or(&words[row >> 6], bit);
  } else {
    words[row >> 6] |= bit;
  }
}

template <bool Concurrent>
EMBSTORE_HD void bitmap_clear(uint64_t* words, uint64_t row) {
  const uint64_t bit = uint64_t{1} << (row & 63);
  if constexpr (Concurrent) {
    (void)atomic_and(&words[row >> 6], ~bit);
  } else {
    words[row >> 6] &= ~bit;
  }
}

EMBSTORE_HD uint64_t bitmap_count(const uint64_t* words, uint64_t first_word, uint64_t end_word) {
  uint64_t n = 0;
  for (uint64_t w = first_word; w < end_word; ++w) n += popcount64(words[w]);
  return n;
}

// The set bits of word w that lie among the bitmap's first `bits` bits.
EMBSTORE_HD uint64_t bitmap_count_word_below(const uint64_t* words, uint64_t w, uint64_t bits) {
  const uint64_t first = w * 64;
  if (first >= bits) return 0;
  const uint64_t word =
      bits - first >= 64 ? words[w] : words[w] & ((uint64_t{1} << (bits - first)) - 1);
  return popcount64(word);
}

}  // namespace embstore::row
