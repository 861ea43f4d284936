// White-box tests of the counting Bloom filter cells (cuda/row/admission.h): cells in range and
// stable, the conservative update never counting a key below its true count, saturation at
// 255, and the filled-counter tally.
#include <catch2/catch.hpp>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "cuda/row/admission.h"

using namespace embstore::row;

TEST_CASE("reduce_range is uniform over [0, n) without a division", "[row][bloom]") {
  REQUIRE(reduce_range(0, 10) == 0);
  REQUIRE(reduce_range(~uint64_t{0}, 10) == 9);
  REQUIRE(reduce_range(uint64_t{1} << 63, 10) == 5);
  std::vector<int> hits(8);
  std::mt19937_64 rng(1);
  for (int i = 0; i < 80000; ++i) ++hits[reduce_range(rng(), 8)];
  for (int h : hits) REQUIRE(std::abs(h - 10000) < 500);
}

TEST_CASE("a key's cells are in range and the same every time", "[row][bloom]") {
  for (int64_t key : {int64_t{0}, int64_t{-1}, INT64_MIN, INT64_MAX, int64_t{123456789}}) {
    uint64_t a[kBloomHashes], b[kBloomHashes];
    bloom_cells(key, 1000, a);
    bloom_cells(key, 1000, b);
    for (uint32_t i = 0; i < kBloomHashes; ++i) {
      REQUIRE(a[i] < 1000);
      REQUIRE(a[i] == b[i]);
    }
  }
}

TEST_CASE("the conservative update never counts a key below its true count", "[row][bloom]") {
  const uint64_t cells = 256;  // small: many keys share cells
  std::vector<uint8_t> counters(cells);
  std::map<int64_t, uint32_t> truth;
  uint64_t filled = 0;
  std::mt19937_64 rng(7);
  for (int i = 0; i < 5000; ++i) {
    const int64_t key = static_cast<int64_t>(rng() % 300);
    const uint32_t got = bloom_count(counters.data(), cells, key, &filled);
    const uint32_t want = std::min<uint32_t>(++truth[key], kBloomMaxCount);
    REQUIRE(got >= want);  // never admitted late
  }
  uint64_t nonzero = 0;
  for (uint8_t c : counters) nonzero += c != 0;
  REQUIRE(filled == nonzero);
}

TEST_CASE("counts saturate at 255", "[row][bloom]") {
  std::vector<uint8_t> counters(64);
  uint64_t filled = 0;
  uint32_t last = 0;
  for (int i = 0; i < 300; ++i) last = bloom_count(counters.data(), 64, 42, &filled);
  REQUIRE(last == kBloomMaxCount);
  uint64_t at[kBloomHashes];
  bloom_cells(42, 64, at);
  for (uint64_t c : at) REQUIRE(counters[c] == kBloomMaxCount);
}
