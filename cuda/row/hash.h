// Integer hashing shared by the index and the initializers.
#pragma once

#include "cuda/row/hd.h"

namespace embstore::row {

// The splitmix64 finalizer: a bijection on 64 bits with full avalanche, so sequential or
// strided feature ids spread evenly over the index.
EMBSTORE_HD uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

// murmur3's 32-bit finalizer: a bijection with full avalanche.
EMBSTORE_HD uint32_t mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

EMBSTORE_HD uint64_t hash_key(int64_t key) { return mix64(static_cast<uint64_t>(key)); }

// Combines values in order; used for (seed, key, column, draw) streams.
EMBSTORE_HD uint64_t hash_combine(uint64_t h, uint64_t v) {
  return mix64(h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2)));
}

}  // namespace embstore::row
