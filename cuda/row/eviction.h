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

// Making room at max_capacity takes the `need` least recently touched candidates (ties: the
// lowest key), on both backends without sorting them all: a histogram of the candidates' stamps
// in kCount buckets of `width` steps from the oldest stamp finds the boundary bucket
// (room_boundary); every candidate below it goes, and only the boundary bucket's are ordered
// (evicted_first).
struct RoomBuckets {
  static constexpr uint32_t kCount = 4096;
  uint64_t oldest = 0;
  uint64_t width = 1;

  // Buckets over the stamps [oldest, step): every candidate was touched before the step.
  EMBSTORE_HD static RoomBuckets spanning(uint64_t oldest, uint64_t step) {
    RoomBuckets b;
    b.oldest = oldest;
    b.width = step > oldest ? (step - oldest + kCount - 1) / kCount : 1;
    return b;
  }
  EMBSTORE_HD uint32_t of(uint64_t stamp) const {
    return static_cast<uint32_t>((stamp - oldest) / width);
  }
};

// The boundary bucket's stamps [lo, hi), how many candidates lie below lo (all of which go) and
// how many in the bucket (need - below of them go, in evicted_first order).
struct RoomBoundary {
  uint64_t lo = 0;
  uint64_t hi = 0;
  uint64_t below = 0;
  uint64_t in_bucket = 0;

  // A candidate touched at `stamp` goes whatever the order.
  EMBSTORE_HD bool goes(uint64_t stamp) const { return stamp < lo; }
  // A candidate touched at `stamp` is one of the boundary bucket's, to be ordered.
  EMBSTORE_HD bool in_boundary(uint64_t stamp) const { return stamp >= lo && stamp < hi; }
};

// histogram: kCount counts of candidates per bucket, holding at least `need` (> 0) in all.
EMBSTORE_HD RoomBoundary room_boundary(const RoomBuckets& b, const uint64_t* histogram,
                                       uint64_t need) {
  uint32_t boundary = 0;
  RoomBoundary out;
  while (boundary + 1 < RoomBuckets::kCount && out.below + histogram[boundary] < need) {
    out.below += histogram[boundary++];
  }
  out.lo = b.oldest + boundary * b.width;
  // Saturated: the last bucket of stamps just below 2^64 would wrap (every stamp is below).
  out.hi = b.width > UINT64_MAX - out.lo ? UINT64_MAX : out.lo + b.width;
  out.in_bucket = histogram[boundary];
  return out;
}

// Whether a candidate (stamp a, key a) goes before one of (stamp b, key b): least recently
// touched first, then the lowest key, so that tables fed the same calls evict the same keys
// whatever their rows' ids. The CUDA backend sorts by this order with two stable radix sorts
// (by key, then by stamp).
EMBSTORE_HD bool evicted_first(uint64_t stamp_a, int64_t key_a, uint64_t stamp_b, int64_t key_b) {
  return stamp_a != stamp_b ? stamp_a < stamp_b : key_a < key_b;
}

// A row leaving the table (evicted, or taken out whole): no longer dirty (an evicted key is
// written off with a tombstone, a taken row carries its bit with it), no longer carried
// (carried: NULL where the table keeps no such bits; the id's next row must not inherit the
// snapshot's claim on this one), and freed until a new key takes it (reuse clears the freed
// bit). Only once nothing can fail: until then the row stays as it was, bits and all.
template <bool Concurrent>
EMBSTORE_HD void release_row(uint64_t* dirty, uint64_t* freed, uint64_t* carried, uint64_t r) {
  bitmap_clear<Concurrent>(dirty, r);
  if (carried != nullptr) bitmap_clear<Concurrent>(carried, r);
  bitmap_set<Concurrent>(freed, r);
}

// The id of the i-th of n rows put into a table whole (a stack's move, Table::put_rows): freed
// ids first, from the top of the free list (as an insert takes them), then fresh ones from
// first_fresh on.
EMBSTORE_HD uint32_t put_row_id(uint64_t i, const uint32_t* free_list, uint64_t free_rows,
                                uint64_t first_fresh) {
  return static_cast<uint32_t>(i < free_rows ? free_list[free_rows - 1 - i]
                                             : first_fresh + (i - free_rows));
}

// The dirty and carried bits of a row put into a table whole (Table::put_rows): dirty when it
// was; if the snapshot in flight held it where it came from (in_snapshot), carried while one is
// in flight here (marked dirty if it fails), else dirty at once (none here could re-mark it).
struct PutBits {
  bool dirty, carried;
};
EMBSTORE_HD PutBits put_row_bits(bool was_dirty, bool in_snapshot, bool in_flight) {
  return PutBits{was_dirty || (in_snapshot && !in_flight), in_snapshot && in_flight};
}

// Whether row r, leaving a table whole (Table::take_rows), is in the snapshot in flight: captured
// by it (snapshot: its set, NULL when none is in flight) or carried into this table so from
// another (carried: NULL when none). If the snapshot fails, the row must be dirty again wherever
// it went.
EMBSTORE_HD bool in_snapshot(const uint64_t* snapshot, const uint64_t* carried, uint64_t r) {
  return (snapshot != nullptr && bitmap_test(snapshot, r)) ||
         (carried != nullptr && bitmap_test(carried, r));
}

}  // namespace embstore::row
