// The CUDA device tier's moves (the table's rows below device_rows live in device memory, the
// rest in mapped host memory; see arena.h's place_chunk). A hot row in host memory moves up by
// trading row ids with a cold row in device memory: everything a row id names goes with the
// row, its value and optimizer state, its metadata (key, step), its index entry, its dirty bit
// and its carried bit (row/eviction.h), so the table holds the same rows, bit for bit, in other
// places. Rows a snapshot in flight captured and evicted rows never trade (the drain, a failed
// snapshot's re-marking and the free list name them by id).
#pragma once

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/index.h"

namespace embstore::row {

// Whether device row r may give its place to a hot row: untouched since before cutoff_step, not
// wanted by the prefetch asking (generation `generation`) or the one before it (the current
// batch's, whose update has not come yet; wanted[r] is the latest generation that wanted row
// r, 0: none; generations start at 2), not in the snapshot in flight (snapshot: its rows as
// captured, NULL when none is in flight), and live (not freed).
EMBSTORE_HD bool may_move_down(uint64_t r, uint64_t last_step, uint64_t cutoff_step,
                               const uint32_t* wanted, uint32_t generation,
                               const uint64_t* snapshot, const uint64_t* freed) {
  if (last_step >= cutoff_step || wanted[r] >= generation - 1) return false;
  if (snapshot != nullptr && bitmap_test(snapshot, r)) return false;
  return freed == nullptr || !bitmap_test(freed, r);
}

// Columns [first, stride) of rows a and b, every `step`-th, trade places: a tile of lanes swaps
// a pair's records, lane l taking first = l.
EMBSTORE_HD void swap_records(const ArenaRef& arena, uint64_t a, uint64_t b, uint32_t first,
                              uint32_t step) {
  float* ra = arena.row(a);
  float* rb = arena.row(b);
  for (uint32_t c = first; c < arena.stride; c += step) {
    const float t = ra[c];
    ra[c] = rb[c];
    rb[c] = t;
  }
}

// Bits a and b of `bits` trade values.
template <bool Concurrent>
EMBSTORE_HD void swap_bits(uint64_t* bits, uint64_t a, uint64_t b) {
  const bool bit_a = bitmap_test(bits, a);
  const bool bit_b = bitmap_test(bits, b);
  if (bit_a == bit_b) return;
  if (bit_b) {
    bitmap_set<Concurrent>(bits, a);
    bitmap_clear<Concurrent>(bits, b);
  } else {
    bitmap_clear<Concurrent>(bits, a);
    bitmap_set<Concurrent>(bits, b);
  }
}

// Rows a and b trade metadata, index entries, dirty bits and carried bits (a row put in while a
// snapshot was in flight that held it elsewhere: carried NULL where the table keeps none; such a
// row may trade, as the snapshot's re-marking finds it by its bit, not by a captured id). One
// thread per pair; pairs disjoint. Concurrent as in bitmap_set: other pairs' bits may share a
// word.
template <bool Concurrent>
EMBSTORE_HD void swap_identities(const ArenaRef& arena, const IndexRef& index, uint64_t* dirty,
                                 uint64_t* carried, uint64_t a, uint64_t b) {
  RowMeta* ma = arena.row_meta(a);
  RowMeta* mb = arena.row_meta(b);
  const RowMeta t = *ma;
  *ma = *mb;
  *mb = t;
  index.repoint(ma->key, static_cast<uint32_t>(a));
  index.repoint(mb->key, static_cast<uint32_t>(b));
  swap_bits<Concurrent>(dirty, a, b);
  if (carried != nullptr) swap_bits<Concurrent>(carried, a, b);
}

}  // namespace embstore::row
