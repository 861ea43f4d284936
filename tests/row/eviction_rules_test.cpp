// White-box tests of eviction's per-row rules (cuda/row/eviction.h): which rows an idle rule may
// take, and what taking a row does to its bits.
#include <catch2/catch.hpp>
#include <vector>

#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"

using namespace embstore::row;

TEST_CASE("a row is evictable when idle before the cutoff, live and not spared",
          "[row][eviction]") {
  std::vector<uint64_t> freed(1), spared(1);
  REQUIRE(evictable(freed.data(), nullptr, 5, /*stamp=*/9, /*before=*/10));
  REQUIRE_FALSE(evictable(freed.data(), nullptr, 5, 10, 10));  // touched at the cutoff
  REQUIRE_FALSE(evictable(freed.data(), nullptr, 5, 11, 10));
  bitmap_set<false>(freed.data(), 5);
  REQUIRE_FALSE(evictable(freed.data(), nullptr, 5, 0, 10));  // already freed
  REQUIRE(evictable(freed.data(), spared.data(), 6, 0, 10));
  bitmap_set<false>(spared.data(), 6);
  REQUIRE_FALSE(evictable(freed.data(), spared.data(), 6, 0, 10));  // read by this call
}

TEST_CASE("releasing a row frees it and leaves it out of the next delta", "[row][eviction]") {
  std::vector<uint64_t> dirty(2), freed(2);
  bitmap_set<false>(dirty.data(), 70);
  bitmap_set<false>(dirty.data(), 71);
  release_row<false>(dirty.data(), freed.data(), 70);
  REQUIRE_FALSE(bitmap_test(dirty.data(), 70));  // a tombstone stands for it
  REQUIRE(bitmap_test(dirty.data(), 71));
  REQUIRE(bitmap_test(freed.data(), 70));
  release_row<true>(dirty.data(), freed.data(), 71);  // the concurrent form, the same bits
  REQUIRE(dirty[1] == 0);
  REQUIRE(freed[1] == 0b11 << 6);
}
