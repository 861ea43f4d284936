// A tiered table trained on a stream holds what an untiered one holds, bit for bit, at every
// budget down to one row; its stats count rows per tier and the moves; prefetch brings rows up.
#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

struct Case {
  uint64_t memory_rows;
  embstore_optimizer_t opt;
  uint32_t admit_after;
  uint64_t evict_idle_steps;
};

TEST_CASE("a tiered table trains bit for bit as an untiered one, at budgets down to one row",
          "[tiers]") {
  TierDir tier;
  if (!backend_has_tiers(tier.path())) return;
  const Case c =
      GENERATE(Case{1, EMBSTORE_OPT_ADAGRAD, 1, 0}, Case{7, EMBSTORE_OPT_ADAM, 1, 0},
               Case{64, EMBSTORE_OPT_SGD, 1, 0}, Case{100, EMBSTORE_OPT_ROWWISE_ADAGRAD, 2, 0},
               Case{300, EMBSTORE_OPT_ADAGRAD, 1, 3});
  INFO("memory_rows " << c.memory_rows << ", optimizer " << c.opt << ", admit_after "
                      << c.admit_after << ", evict_idle_steps " << c.evict_idle_steps);
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  embstore_table_config_t ca = tier_config("emb", 8, 0, c.opt);
  ca.admit_after = c.admit_after;
  ca.evict_idle_steps = c.evict_idle_steps;
  embstore_table_config_t cb = ca;
  cb.memory_rows = c.memory_rows;
  Twins twins{a, b, make_table(a, ca), make_table(b, cb)};
  const int64_t keys = 1000;
  for (uint64_t s = 1; s <= 12; ++s) twins.step(s, keys, 200);
  const embstore_table_stats_t sa = stats(twins.plain);
  const embstore_table_stats_t sb = stats(twins.tiered);
  REQUIRE(sb.rows_in_memory <= c.memory_rows);  // the budget holds between calls
  REQUIRE(sa.rows == sb.rows);
  REQUIRE(sa.dirty_rows == sb.dirty_rows);
  REQUIRE(sa.evicted == sb.evicted);
  REQUIRE(sa.pending_admission == sb.pending_admission);
  REQUIRE(sa.admitted == sb.admitted);
  REQUIRE(sa.rows_in_memory == sa.rows);
  REQUIRE(sa.rows_on_disk == 0);
  REQUIRE(sa.rows_moved_down == 0);
  REQUIRE(sb.rows_in_memory + sb.rows_on_disk == sb.rows);
  REQUIRE(sb.rows_on_disk > 0);
  REQUIRE(sb.rows_moved_down > 0);
  REQUIRE(sb.rows_moved_up > 0);
  REQUIRE(sb.tier_bytes_written >= sb.rows_moved_down * 8 * 4);
  REQUIRE(sb.tier_bytes_read > 0);
  if (c.evict_idle_steps != 0) REQUIRE(sb.evicted > 0);
  if (c.admit_after > 1) REQUIRE(sb.pending_admission > 0);
  // Every key, including those with no row (zeros without insert).
  const std::vector<int64_t> all = key_range(keys + 40);
  REQUIRE(same_bits(lookup_ok(twins.plain, all, 0), lookup_ok(twins.tiered, all, 0)));
  REQUIRE(stats(twins.tiered).rows_in_memory <= c.memory_rows);
  require_same_checkpoint(a, b, dir_a.path(), dir_b.path(), "emb");
}

TEST_CASE("a tiered table keeps its budget between calls and holds a larger batch while it runs",
          "[tiers]") {
  TierDir tier;
  if (!backend_has_tiers(tier.path())) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 4, 50));
  lookup_ok(t, key_range(40));
  REQUIRE(stats(t).rows_in_memory == 40);
  REQUIRE(stats(t).rows_on_disk == 0);
  // 200 distinct rows in one call: all in memory while it runs (its result needs them), the
  // least recently used moved down once it is done.
  const std::vector<int64_t> big = key_range(200);
  const std::vector<float> first = lookup_ok(t, big);
  embstore_table_stats_t s = stats(t);
  REQUIRE(s.rows == 200);
  REQUIRE(s.rows_in_memory == 50);
  REQUIRE(s.rows_on_disk == 150);
  REQUIRE(s.rows_moved_down == 150);
  const std::vector<int64_t> other = {1000, 1001};
  lookup_ok(t, other);  // room for 2 more: an eighth of the budget beyond goes down with them
  s = stats(t);
  REQUIRE(s.rows_in_memory == 50 - 50 / 8);
  REQUIRE(s.rows_on_disk == s.rows - s.rows_in_memory);
  REQUIRE(same_bits(lookup_ok(t, big, 0), first));  // brought back up unchanged
  REQUIRE(stats(t).rows_in_memory == 50);
}

TEST_CASE("prefetch brings a batch's rows up ahead of its lookup", "[tiers]") {
  TierDir tier;
  if (!backend_has_tiers(tier.path())) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 64));
  const std::vector<int64_t> early = key_range(64);
  std::vector<int64_t> late(64);
  for (size_t i = 0; i < late.size(); ++i) late[i] = 1000 + static_cast<int64_t>(i);
  const std::vector<float> early_values = lookup_ok(t, early);
  lookup_ok(t, late);  // early's rows go down
  REQUIRE(stats(t).rows_on_disk >= 32);
  std::vector<int64_t> ask = early;
  ask.push_back(999999);  // no row: ignored
  ok(embstore_prefetch(t, ask.data(), ask.size(), nullptr));
  const uint64_t up = stats(t).rows_moved_up;
  REQUIRE(up >= 32);
  REQUIRE(same_bits(lookup_ok(t, early, 0), early_values));
  REQUIRE(stats(t).rows_moved_up == up);  // nothing left to bring up
  REQUIRE(stats(t).rows == 128);          // the unknown key got no row

  ok(embstore_prefetch(t, nullptr, 0, nullptr));
  require_status(embstore_prefetch(t, nullptr, 3, nullptr), EMBSTORE_INVALID_ARGUMENT, "keys");
  require_status(embstore_prefetch(nullptr, ask.data(), 1, nullptr), EMBSTORE_INVALID_ARGUMENT,
                 "table");
  // On an untiered table it does nothing.
  embstore_table_t* plain = make_table(store, tier_config("plain", 8, 0));
  lookup_ok(plain, early);
  ok(embstore_prefetch(plain, early.data(), early.size(), nullptr));
  REQUIRE(stats(plain).rows_moved_up == 0);
}

TEST_CASE("stats of a caller built before tiers leave the tier fields alone", "[tiers]") {
  TierDir tier;
  if (!backend_has_tiers(tier.path())) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 4));
  lookup_ok(t, key_range(20));
  embstore_table_stats_t s;
  std::memset(&s, 0xAB, sizeof(s));
  s.struct_size = offsetof(embstore_table_stats_t, rows_in_device);
  ok(embstore_table_stats(t, &s));
  REQUIRE(s.rows == 20);
  REQUIRE(s.admitted == 20);  // the 0.3 field still reaches a 0.3-sized struct
  REQUIRE(s.rows_on_disk == 0xABABABABABABABABull);
}

}  // namespace
}  // namespace embstore_test::tiers
