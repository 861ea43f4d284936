// Feature admission's portable pieces: the counting Bloom filter's cells and conservative
// update (a device filter would count in the same cells), and the slots of exact counts that a
// GPU updates concurrently (cuda/backend/device_admission.cuh) and the host rebuilds.
#pragma once

#include "cuda/row/hash.h"

namespace embstore::row {

inline constexpr uint32_t kBloomHashes = 4;      // counters per key
inline constexpr uint32_t kBloomMaxCount = 255;  // one-byte counters saturate here
inline constexpr uint64_t kBloomMinCells = 64;

// Multiply-shift range reduction: uniform over [0, n) without a division.
EMBSTORE_HD uint64_t reduce_range(uint64_t h, uint64_t n) {
#if defined(__CUDA_ARCH__)
  return __umul64hi(h, n);
#else
  return static_cast<uint64_t>((static_cast<unsigned __int128>(h) * n) >> 64);
#endif
}

// The key's kBloomHashes cells, by double hashing of two independent 64-bit hashes. Two
// cells of a key may coincide (then that cell counts once per update).
EMBSTORE_HD void bloom_cells(int64_t key, uint64_t cells, uint64_t out[kBloomHashes]) {
  const uint64_t h1 = hash_key(key);
  const uint64_t h2 = mix64(h1 ^ 0x5851f42d4c957f2dull) | 1;
  for (uint32_t i = 0; i < kBloomHashes; ++i) out[i] = reduce_range(h1 + i * h2, cells);
}

// Counts one occurrence of key (serial): raises only the key's smallest counters, which keeps
// every key's minimum at least its true count while others grow less. Returns the key's count
// (the minimum after the update), and in *filled the counters that left 0. Cells is a pointer
// to the counters, or anything indexable that returns an assignable reference.
template <typename Cells>
EMBSTORE_HD uint32_t bloom_count(Cells&& counters, uint64_t cells, int64_t key, uint64_t* filled) {
  uint64_t at[kBloomHashes];
  bloom_cells(key, cells, at);
  uint32_t least = kBloomMaxCount;
  for (uint32_t i = 0; i < kBloomHashes; ++i) {
    const uint32_t c = counters[at[i]];
    least = c < least ? c : least;
  }
  if (least == kBloomMaxCount) return least;
  for (uint32_t i = 0; i < kBloomHashes; ++i) {
    if (counters[at[i]] == least) {
      if (least == 0) ++*filled;
      counters[at[i]] = static_cast<uint8_t>(least + 1);
    }
  }
  return least + 1;
}

// ---- exact counts in an open-addressing table (linear probing, at most half full) --------
// A slot has io::AdmissionEntry's layout; its count is its state: 0 empty, 1 .. kAdmitMaxCount
// a key's count, kAdmitLocked while a thread claims the slot for a key, kAdmitGone once the
// key's count was dropped (admitted, forgotten). A gone slot keeps its key (the next delta's
// removals) and is not reused until the table is rebuilt, so a probe never stops early and a
// slot never changes key under a reader. gen: the generation of the slot's last change.
struct AdmitSlot {
  int64_t key;
  uint32_t count;
  uint32_t gen;
  uint64_t step;  // last seen
};
static_assert(sizeof(AdmitSlot) == 24);

inline constexpr uint32_t kAdmitEmpty = 0;
inline constexpr uint32_t kAdmitLocked = 0xFFFFFFFFu;
inline constexpr uint32_t kAdmitGone = 0xFFFFFFFEu;
inline constexpr uint32_t kAdmitMaxCount = 0xFFFFFFFDu;  // counts saturate here, on both backends
inline constexpr uint32_t kNoAdmitSlot = 0xFFFFFFFFu;

EMBSTORE_HD bool admit_live(uint32_t count) { return count != kAdmitEmpty && count < kAdmitGone; }
EMBSTORE_HD uint32_t admit_increment(uint32_t count) {
  return count < kAdmitMaxCount ? count + 1 : count;
}
EMBSTORE_HD uint64_t admit_home(int64_t key, uint64_t mask) { return hash_key(key) & mask; }

// Places an entry whose key the table does not hold, one thread at a time (rebuilds, loads).
EMBSTORE_HD void admit_place(AdmitSlot* slots, uint64_t mask, const AdmitSlot& entry) {
  uint64_t s = admit_home(entry.key, mask);
  while (slots[s].count != kAdmitEmpty) s = (s + 1) & mask;
  slots[s] = entry;
}

}  // namespace embstore::row
