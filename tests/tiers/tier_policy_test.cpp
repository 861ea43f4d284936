// Which rows a tiered table moves down: the coldest (used in the fewest calls, a count that
// halves now and then), the least recently used among equals. A pass over many rows used once
// does not push out rows used in every call, and a new hot set still takes over the memory.
#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

TEST_CASE("rows used in many calls stay in memory while rows used once pass through",
          "[tiers][host_tier]") {
  TierDir tier;
  if (!host_tier_policy()) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 64));
  const std::vector<int64_t> hot = keys_from(0, 16);
  for (int call = 0; call < 4; ++call) lookup_ok(t, hot);
  const std::vector<float> hot_values = lookup_ok(t, hot, 0);
  // 20 calls of 16 keys never seen again: from the fourth on, each needs room. A policy by
  // recency alone would move the hot rows down first (they were used longest ago).
  for (int64_t call = 0; call < 20; ++call) lookup_ok(t, keys_from(1000 + call * 16, 16));
  embstore_table_stats_t s = stats(t);
  REQUIRE(s.rows == 16 + 20 * 16);
  REQUIRE(s.rows_in_memory <= 64);
  REQUIRE(s.rows_moved_down >= 20 * 16 + 16 - 64);
  const uint64_t up = s.rows_moved_up;
  REQUIRE(same_bits(lookup_ok(t, hot, 0), hot_values));
  REQUIRE(stats(t).rows_moved_up == up);  // every hot row was still in memory
}

TEST_CASE("a new hot set takes over a tiered table's memory from an old one", "[tiers]") {
  TierDir tier;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 64));
  // The old hot set: 40 rows used in 300 calls (their count saturates).
  const std::vector<int64_t> old_hot = keys_from(0, 40);
  for (int call = 0; call < 300; ++call) lookup_ok(t, old_hot);
  // The new one: 40 other rows, 8 a call, so that each call needs less room than the old rows
  // take (a call's own rows are never the ones moved down to make room for it).
  const std::vector<int64_t> new_hot = keys_from(5000, 40);
  int settled_after = -1;
  for (int round = 0; round < 200 && settled_after < 0; ++round) {
    const uint64_t up = stats(t).rows_moved_up;
    for (size_t part = 0; part < new_hot.size(); part += 8) {
      lookup_ok(t, std::vector<int64_t>(new_hot.begin() + part, new_hot.begin() + part + 8));
    }
    if (round > 0 && stats(t).rows_moved_up == up) settled_after = round;
  }
  INFO("rounds of the new hot set before its rows stayed in memory: " << settled_after);
  REQUIRE(settled_after > 0);
  REQUIRE(settled_after < 200);
  // The old set's rows are still in the table, most of them on disk now.
  const embstore_table_stats_t s = stats(t);
  REQUIRE(s.rows == 80);
  REQUIRE(s.rows_on_disk >= 16);
}

}  // namespace
}  // namespace embstore_test::tiers
