// Which rank owns a key (embstore_shard_of): one hash for every backend and every version,
// since checkpoints, resharding and serving layouts depend on it. Never change it.
#pragma once

#include "cuda/row/hash.h"
#include "cuda/row/hd.h"

namespace embstore::row {

// Salts the key before the index's own mixer, so that the keys one rank owns still spread
// evenly over that rank's index slots (the index takes the low bits of mix64(key)).
inline constexpr uint64_t kShardSalt = 0x2545f4914f6cdd1dull;

// The owner of key among world_size ranks (world_size >= 1): the high 32 bits of
// mix64(key ^ kShardSalt), scaled to [0, world_size) by a multiply (no modulo bias beyond
// 2^-32 per rank).
EMBSTORE_HD uint32_t shard_of(int64_t key, uint32_t world_size) {
  const uint64_t h = mix64(static_cast<uint64_t>(key) ^ kShardSalt);
  return static_cast<uint32_t>(((h >> 32) * uint64_t{world_size}) >> 32);
}

}  // namespace embstore::row
