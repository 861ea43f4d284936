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
  std::vector<uint64_t> dirty(2), freed(2), carried(2);
  bitmap_set<false>(dirty.data(), 70);
  bitmap_set<false>(dirty.data(), 71);
  bitmap_set<false>(carried.data(), 71);
  bitmap_set<false>(carried.data(), 72);
  release_row<false>(dirty.data(), freed.data(), nullptr, 70);  // a table without carried bits
  REQUIRE_FALSE(bitmap_test(dirty.data(), 70));                 // a tombstone stands for it
  REQUIRE(bitmap_test(dirty.data(), 71));
  REQUIRE(bitmap_test(freed.data(), 70));
  // The concurrent form, the same bits; the id's carried bit goes too (its next row is new).
  release_row<true>(dirty.data(), freed.data(), carried.data(), 71);
  REQUIRE(dirty[1] == 0);
  REQUIRE(freed[1] == 0b11 << 6);
  REQUIRE_FALSE(bitmap_test(carried.data(), 71));
  REQUIRE(bitmap_test(carried.data(), 72));
}

TEST_CASE("making room finds the bucket of the need-th oldest stamp and orders only its own",
          "[row][eviction]") {
  // Stamps from 100 to a step 8,292 later: buckets of 3 steps (8,292 / 4,096 rounded up).
  const RoomBuckets b = RoomBuckets::spanning(100, 8392);
  REQUIRE(b.width == 3);
  REQUIRE(b.of(100) == 0);
  REQUIRE(b.of(102) == 0);
  REQUIRE(b.of(103) == 1);
  REQUIRE(b.of(8391) == 2763);                      // the newest stamp a candidate can have
  REQUIRE(RoomBuckets::spanning(5, 6).width == 1);  // fewer steps than buckets: one step each

  std::vector<uint64_t> histogram(RoomBuckets::kCount, 0);
  histogram[0] = 2;     // stamps 100-102
  histogram[7] = 3;     // stamps 121-123
  histogram[2763] = 1;  // stamps 8,389-8,391
  // Two: bucket 0 holds exactly them, nothing is ordered beyond it.
  RoomBoundary r = room_boundary(b, histogram.data(), 2);
  CHECK(r.below == 0);
  CHECK(r.lo == 100);
  CHECK(r.hi == 103);
  // Four: bucket 0's two go whole, two of bucket 7's three are ordered.
  r = room_boundary(b, histogram.data(), 4);
  CHECK(r.below == 2);
  CHECK(r.lo == 121);
  CHECK(r.hi == 124);
  CHECK(r.in_bucket == 3);
  CHECK(r.goes(120));
  CHECK_FALSE(r.goes(121));
  CHECK(r.in_boundary(121));
  CHECK(r.in_boundary(123));
  CHECK_FALSE(r.in_boundary(124));
  CHECK_FALSE(r.in_boundary(120));
  r = room_boundary(b, histogram.data(), 6);  // every candidate
  CHECK(r.below == 5);
  CHECK(r.lo == 8389);

  // Steps at the top of the range: the last bucket's end does not wrap past 2^64.
  const RoomBuckets top = RoomBuckets::spanning(UINT64_MAX - 10001, UINT64_MAX);
  REQUIRE(top.width == 3);
  std::vector<uint64_t> last(RoomBuckets::kCount, 0);
  last[top.of(UINT64_MAX - 1)] = 1;  // bucket 3,333: from 2^64 - 3, three steps wide
  r = room_boundary(top, last.data(), 1);
  CHECK(r.lo == UINT64_MAX - 2);
  CHECK(r.hi > UINT64_MAX - 1);

  // Inside a bucket: the oldest stamp first, then the lowest key.
  CHECK(evicted_first(121, 9, 122, 1));
  CHECK_FALSE(evicted_first(122, 1, 121, 9));
  CHECK(evicted_first(121, -5, 121, 3));
  CHECK_FALSE(evicted_first(121, 3, 121, 3));
}

TEST_CASE("rows put in whole take freed ids from the top of the list, then fresh ones",
          "[row][eviction][moves]") {
  const std::vector<uint32_t> free_list = {7, 3, 11};  // 11 was freed last
  CHECK(put_row_id(0, free_list.data(), 3, 40) == 11);
  CHECK(put_row_id(1, free_list.data(), 3, 40) == 3);
  CHECK(put_row_id(2, free_list.data(), 3, 40) == 7);
  CHECK(put_row_id(3, free_list.data(), 3, 40) == 40);
  CHECK(put_row_id(5, free_list.data(), 3, 40) == 42);
  CHECK(put_row_id(0, nullptr, 0, 40) == 40);  // no free list: fresh ids only
}

TEST_CASE("a row leaving a table is in the snapshot when captured or carried so", "[row][moves]") {
  std::vector<uint64_t> snapshot(2), carried(2);
  bitmap_set<false>(snapshot.data(), 3);
  bitmap_set<false>(carried.data(), 70);
  CHECK(in_snapshot(snapshot.data(), carried.data(), 3));
  CHECK(in_snapshot(snapshot.data(), carried.data(), 70));  // put in from the other table
  CHECK_FALSE(in_snapshot(snapshot.data(), carried.data(), 4));
  CHECK_FALSE(in_snapshot(nullptr, nullptr, 3));  // no snapshot in flight
  CHECK(in_snapshot(nullptr, carried.data(), 70));
}
