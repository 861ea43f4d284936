// Open-addressing index key -> row id with linear probing. Occupancy lives in the row field,
// not in the key, so every int64 is a valid key.
#pragma once

#include "cuda/row/hash.h"

namespace embstore::row {

inline constexpr uint32_t kEmptyRow = 0xFFFFFFFFu;   // slot never used; ends a probe
inline constexpr uint32_t kLockedRow = 0xFFFFFFFEu;  // CUDA insert in progress
inline constexpr uint32_t kNoRow = kEmptyRow;        // "key has no row" in results
inline constexpr uint64_t kMaxRows = 0xFFFFFF00u;    // row ids stay below the markers

struct alignas(16) Slot {
  int64_t key;
  uint32_t row;
  uint32_t unused;
};
static_assert(sizeof(Slot) == 16);

// Rows a table may hold: max_capacity (0: unbounded) within what 32-bit row ids allow.
EMBSTORE_HD uint64_t row_limit(uint64_t max_capacity) {
  return max_capacity != 0 && max_capacity < kMaxRows ? max_capacity : kMaxRows;
}

// The index stays at most half full, which keeps linear probes short.
EMBSTORE_HD uint64_t index_slots_for(uint64_t rows) {
  uint64_t slots = 16;
  while (slots / 2 < rows) slots *= 2;
  return slots;
}

// Backward-shift deletion in a linear-probing table: the entry at slot s, whose home slot is
// h, may move back into the hole unless h lies cyclically in (hole, s].
EMBSTORE_HD bool stays_behind_hole(uint64_t hole, uint64_t h, uint64_t s) {
  return hole <= s ? (hole < h && h <= s) : (hole < h || h <= s);
}

struct IndexRef {
  Slot* slots;
  uint64_t mask;  // slots - 1; slots is a power of two

  EMBSTORE_HD uint64_t home(int64_t key) const { return hash_key(key) & mask; }
  EMBSTORE_HD uint64_t next(uint64_t s) const { return (s + 1) & mask; }

  // Read-only probe; safe wherever no insert runs concurrently.
  EMBSTORE_HD uint32_t find(int64_t key) const {
    for (uint64_t s = home(key);; s = next(s)) {
      const Slot& slot = slots[s];
      if (slot.row == kEmptyRow) return kNoRow;
      if (slot.key == key) return slot.row;
    }
  }

  // Points the entry of a key the index holds at another row. Safe beside other such calls for
  // other keys and beside find(): an entry's slot, and its occupancy, do not change.
  EMBSTORE_HD void repoint(int64_t key, uint32_t row) const {
    for (uint64_t s = home(key);; s = next(s)) {
      Slot& slot = slots[s];
      if (slot.row == kEmptyRow) return;  // absent: nothing to repoint
      if (slot.key == key) {
        slot.row = row;
        return;
      }
    }
  }

  // Single-writer find-or-insert in one probe: the key's row, or new_row placed in the first
  // empty slot of its probe sequence (*inserted set) when the key is absent.
  EMBSTORE_HD uint32_t find_or_insert_serial(int64_t key, uint32_t new_row, bool* inserted) const {
    for (uint64_t s = home(key);; s = next(s)) {
      Slot& slot = slots[s];
      if (slot.row == kEmptyRow) {
        slot.key = key;
        slot.row = new_row;
        *inserted = true;
        return new_row;
      }
      if (slot.key == key) {
        *inserted = false;
        return slot.row;
      }
    }
  }

  // find_or_insert_serial for one of several writers that each own the slots [lo, hi) and
  // insert the keys whose home slot lies there (a parallel load). An absent key claims the first
  // empty slot of its probe with row `placeholder`. Returns kClaimed, kFound (the key is in
  // *slot_out already), or kLeavesRange: the probe would reach a slot outside [lo, hi) (another
  // writer's), nothing is written, and the key is left for a serial insert afterwards. The range
  // is a strict part of the index (hi - lo < slots), or a probe on a full index would not end.
  enum ProbeResult : uint8_t { kClaimed = 0, kFound = 1, kLeavesRange = 2 };
  EMBSTORE_HD ProbeResult claim_in_range(int64_t key, uint64_t lo, uint64_t hi,
                                         uint32_t placeholder, uint64_t* slot_out) const {
    for (uint64_t s = home(key); s >= lo && s < hi; s = next(s)) {
      Slot& slot = slots[s];
      if (slot.row == kEmptyRow) {
        slot.key = key;
        slot.row = placeholder;
        *slot_out = s;
        return kClaimed;
      }
      if (slot.key == key) {
        *slot_out = s;
        return kFound;
      }
    }
    return kLeavesRange;
  }

  // Single-writer removal (eviction): the key's row, or kNoRow when absent. The entries after
  // it in its cluster move back (backward-shift deletion), so no probe ever needs a marker
  // for a deleted slot.
  EMBSTORE_HD uint32_t erase_serial(int64_t key) const {
    uint64_t hole = home(key);
    for (;; hole = next(hole)) {
      if (slots[hole].row == kEmptyRow) return kNoRow;
      if (slots[hole].key == key) break;
    }
    const uint32_t row = slots[hole].row;
    for (uint64_t s = next(hole); slots[s].row != kEmptyRow; s = next(s)) {
      if (!stays_behind_hole(hole, home(slots[s].key), s)) {
        slots[hole] = slots[s];
        hole = s;
      }
    }
    slots[hole].row = kEmptyRow;
    return row;
  }

  // Single-writer insert of a key known to be absent (host backend, index rebuild).
  EMBSTORE_HD void insert_absent(int64_t key, uint32_t row) const {
    uint64_t s = home(key);
    while (slots[s].row != kEmptyRow) s = next(s);
    slots[s].key = key;
    slots[s].row = row;
  }
};

}  // namespace embstore::row
