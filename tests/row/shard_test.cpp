// row::shard_of (embstore_shard_of): the owner of a key among W ranks. Its values are part of
// the on-disk contract (checkpoints and serving layouts depend on them), so they are pinned
// here: the expected values were computed independently, in Python, from the formula the
// public header documents.
#include "cuda/row/shard.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "cuda/row/hash.h"

using embstore::row::shard_of;

TEST_CASE("shard_of gives the pinned owners", "[row][shard]") {
  struct Case {
    int64_t key;
    uint32_t owner[4];  // for world sizes 2, 3, 8, 1000
  };
  const Case cases[] = {
      {0, {1, 1, 4, 582}},
      {1, {0, 0, 2, 261}},
      {-1, {1, 2, 5, 748}},
      {std::numeric_limits<int64_t>::min(), {0, 0, 1, 148}},
      {std::numeric_limits<int64_t>::max(), {0, 0, 0, 111}},
      {123456789, {1, 2, 6, 805}},
      {-987654321012345, {1, 2, 6, 812}},
  };
  const uint32_t worlds[4] = {2, 3, 8, 1000};
  for (const Case& c : cases) {
    INFO("key " << c.key);
    REQUIRE(shard_of(c.key, 1) == 0);
    for (int w = 0; w < 4; ++w) REQUIRE(shard_of(c.key, worlds[w]) == c.owner[w]);
  }
}

TEST_CASE("shard_of spreads keys evenly, sequential or strided", "[row][shard]") {
  for (const uint32_t world : {2u, 3u, 7u, 16u}) {
    for (const int64_t stride : {int64_t{1}, int64_t{1024}, int64_t{-7}}) {
      INFO("world " << world << ", stride " << stride);
      const size_t n = 200'000;
      std::vector<size_t> count(world, 0);
      size_t outside = 0;
      for (size_t i = 0; i < n; ++i) {
        const uint32_t r = shard_of(static_cast<int64_t>(i) * stride, world);
        if (r < world) {
          ++count[r];
        } else {
          ++outside;
        }
      }
      REQUIRE(outside == 0);
      for (const size_t c : count) {
        // Binomial: a standard deviation is below sqrt(n / world) ~ 316; allow 6 of them.
        REQUIRE(std::abs(static_cast<double>(c) - double(n) / world) < 6 * 316.0);
      }
    }
  }
}

TEST_CASE("the keys one rank owns spread evenly over its index slots", "[row][shard]") {
  // The index homes a key at the low bits of hash_key(key): a shard hash correlated with it
  // would crowd one rank's keys into a fraction of its slots.
  const uint32_t world = 8;
  const uint64_t slots = 4096;
  std::vector<size_t> per_slot(slots, 0);
  size_t owned = 0;
  for (int64_t k = 0; owned < 64 * slots; ++k) {
    if (shard_of(k, world) != 3) continue;
    ++per_slot[embstore::row::hash_key(k) & (slots - 1)];
    ++owned;
  }
  size_t empty = 0, most = 0;
  for (const size_t c : per_slot) {
    empty += c == 0;
    most = std::max(most, c);
  }
  REQUIRE(empty == 0);  // 64 keys per slot on average: none left empty
  REQUIRE(most < 128);  // nor any crowded (Poisson(64): P(>= 128) is about 1e-12)
}
