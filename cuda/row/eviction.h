// Eviction's per-row rules, shared by both backends: which rows may go, and what going means
// for a row's bits.
#pragma once

#include "cuda/row/bitmap.h"
#include "cuda/row/hd.h"

namespace embstore::row {

// Row r (last touched at `stamp`) may be evicted by a rule with cutoff `before`: it is live
// (not freed), idle since before the cutoff, and not spared (spared may be null: none is).
EMBSTORE_HD bool evictable(const uint64_t* freed, const uint64_t* spared, uint64_t r,
                           uint64_t stamp, uint64_t before) {
  return stamp < before && !bitmap_test(freed, r) && (spared == nullptr || !bitmap_test(spared, r));
}

// An evicted row: no longer dirty (its key is written off with a tombstone), and freed until a
// new key takes it (reuse clears the freed bit).
template <bool Concurrent>
EMBSTORE_HD void release_row(uint64_t* dirty, uint64_t* freed, uint64_t r) {
  bitmap_clear<Concurrent>(dirty, r);
  bitmap_set<Concurrent>(freed, r);
}

}  // namespace embstore::row
