// A tiered table trained on a stream holds what an untiered one holds, bit for bit, at every
// budget down to one row; its stats count rows per tier and the moves; prefetch brings rows up.
#include <chrono>
#include <thread>

#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

TEST_CASE("a tiered table trains bit for bit as an untiered one, at budgets down to one row",
          "[tiers]") {
  TierDir tier;
  const TrainCase c = GENERATE(
      TrainCase{1, EMBSTORE_OPT_ADAGRAD, 1, 0}, TrainCase{7, EMBSTORE_OPT_ADAM, 1, 0},
      TrainCase{64, EMBSTORE_OPT_SGD, 1, 0}, TrainCase{100, EMBSTORE_OPT_ROWWISE_ADAGRAD, 2, 0},
      TrainCase{300, EMBSTORE_OPT_ADAGRAD, 1, 3}, TrainCase{40, EMBSTORE_OPT_ADAGRAD, 1, 0, 400},
      TrainCase{40, EMBSTORE_OPT_ADAGRAD, 3, 0, 400});
  const bool prefetch_next = GENERATE(false, true);
  INFO("memory_rows: " << c << ", prefetch " << prefetch_next);
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  const embstore_table_config_t ca = c.untiered_config();
  embstore_table_config_t cb = ca;
  cb.memory_rows = c.budget;
  Twins twins{a, b, make_table(a, ca), make_table(b, cb), prefetch_next};
  const int64_t keys = 1000;
  for (uint64_t s = 1; s <= 12; ++s) twins.step(s, keys, 200);
  const embstore_table_stats_t sa = stats(twins.plain);
  const embstore_table_stats_t sb = stats(twins.tiered);
  REQUIRE(sb.rows_in_memory <= c.budget);  // the budget holds between calls
  REQUIRE(sa.rows == sb.rows);
  REQUIRE(sa.dirty_rows == sb.dirty_rows);
  REQUIRE(sa.evicted == sb.evicted);
  REQUIRE(sa.pending_admission == sb.pending_admission);
  REQUIRE(sa.admitted == sb.admitted);
  REQUIRE(sa.rows_in_memory == sa.rows);
  REQUIRE(sa.rows_on_disk == 0);
  REQUIRE(sa.rows_moved_down == 0);
  REQUIRE(sb.rows_in_device + sb.rows_in_memory + sb.rows_on_disk == sb.rows);
  REQUIRE(sb.rows_on_disk > 0);
  REQUIRE(sb.rows_moved_down > 0);
  REQUIRE(sb.rows_moved_up > 0);
  // Each move down writes the row to disk; a stack's moves between its tables write nothing.
  if (host_tier_policy()) REQUIRE(sb.tier_bytes_written >= sb.rows_moved_down * 8 * 4);
  REQUIRE(sb.tier_bytes_written >= sb.rows_on_disk * 8 * 4);
  REQUIRE(sb.tier_bytes_read > 0);
  if (c.evicts()) REQUIRE(sb.evicted > 0);
  if (c.max_capacity != 0) REQUIRE(sb.rows <= c.max_capacity);
  if (c.admit_after > 1) REQUIRE(sb.pending_admission > 0);
  // Every key, including those with no row (zeros without insert).
  const std::vector<int64_t> all = key_range(keys + 40);
  REQUIRE(same_bits(lookup_ok(twins.plain, all, 0), lookup_ok(twins.tiered, all, 0)));
  REQUIRE(stats(twins.tiered).rows_in_memory <= c.budget);
  require_same_checkpoint(a, b, dir_a.path(), dir_b.path(), "emb");
}

TEST_CASE("a tiered table keeps its budget between calls and holds a larger batch while it runs",
          "[tiers][host_tier]") {
  TierDir tier;
  if (!host_tier_policy()) return;
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

// The tier's bytes read, once they exceed `above` (a prefetch's read runs on a thread of the
// table's); 0 when that did not happen within 30 s.
uint64_t wait_for_bytes_read(embstore_table_t* t, uint64_t above) {
  for (int i = 0; i < 3000; ++i) {
    const uint64_t read = stats(t).tier_bytes_read;
    if (read > above) return read;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

TEST_CASE("prefetch reads a batch's rows in the background, ahead of its lookup",
          "[tiers][host_tier]") {
  TierDir tier;
  if (!host_tier_policy()) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 64));
  const std::vector<int64_t> early = key_range(60);
  const std::vector<int64_t> late = keys_from(1000, 64);
  const std::vector<float> early_values = lookup_ok(t, early);
  lookup_ok(t, late);          // early's rows go down
  lookup_ok(t, {late[0]}, 0);  // the call before the prefetch: one row
  const embstore_table_stats_t before = stats(t);
  REQUIRE(before.rows_on_disk == 60);
  std::vector<int64_t> ask = early;
  ask.push_back(999999);  // no row: ignored
  ok(embstore_prefetch(t, ask.data(), ask.size(), nullptr));
  // The call returned with the read handed over: it shows in the bytes read.
  const uint64_t read = wait_for_bytes_read(t, before.tier_bytes_read);
  REQUIRE(read >= before.tier_bytes_read + 60 * 8 * 2 * 4);
  // The lookup finds its rows read already: they come up, and nothing more is read.
  REQUIRE(same_bits(lookup_ok(t, early, 0), early_values));
  const embstore_table_stats_t after = stats(t);
  REQUIRE(after.rows_moved_up == before.rows_moved_up + 60);
  REQUIRE(after.tier_bytes_read == read);
  REQUIRE(after.rows == 124);  // the unknown key got no row
  REQUIRE(after.rows_in_memory <= 64);

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

TEST_CASE("a prefetch of the next batch leaves the current batch's rows for its update",
          "[tiers][host_tier]") {
  TierDir tier;
  if (!host_tier_policy()) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 100));
  const std::vector<int64_t> next = keys_from(0, 40), all = keys_from(1000, 100);
  const std::vector<int64_t> hot(all.begin(), all.begin() + 60),
      current(all.begin() + 60, all.end());
  lookup_ok(t, next);
  lookup_ok(t, all);                                       // next's rows go down
  for (int call = 0; call < 3; ++call) lookup_ok(t, hot);  // used in more calls than current
  lookup_ok(t, current);                                   // batch i's lookup
  const embstore_table_stats_t before = stats(t);
  REQUIRE(before.rows_on_disk == 40);
  // Batch i + 1's prefetch needs 40 frames: it takes them from the hot rows, not from the
  // colder rows that batch i's update is about to use (a policy by use counts alone would).
  ok(embstore_prefetch(t, next.data(), next.size(), nullptr));
  const uint64_t read = wait_for_bytes_read(t, before.tier_bytes_read);
  REQUIRE(read > before.tier_bytes_read);
  const std::vector<float> grads(current.size() * 8, 0.5f);
  apply_ok(t, current, grads);
  embstore_table_stats_t s = stats(t);
  REQUIRE(s.tier_bytes_read == read);  // the update read nothing
  REQUIRE(s.rows_moved_up == before.rows_moved_up);
  lookup_ok(t, next, 0);  // batch i + 1 takes its prefetched rows
  s = stats(t);
  REQUIRE(s.rows_moved_up == before.rows_moved_up + 40);
  REQUIRE(s.tier_bytes_read == read);
}

TEST_CASE("a prefetch reads only what fits beside the current batch", "[tiers][host_tier]") {
  TierDir tier;
  if (!host_tier_policy()) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 64));
  const std::vector<int64_t> next = keys_from(0, 40), current = keys_from(1000, 40);
  lookup_ok(t, next);
  lookup_ok(t, current);  // 24 of next's rows go down: 40 + 40 do not fit in 64
  const embstore_table_stats_t before = stats(t);
  REQUIRE(before.rows_on_disk == 24);
  // 56 rows in memory, the 16 others of next's among them; current's 40 stay (the call before):
  // room for 8 more.
  ok(embstore_prefetch(t, next.data(), next.size(), nullptr));
  const uint64_t read = wait_for_bytes_read(t, before.tier_bytes_read);
  REQUIRE(read > before.tier_bytes_read);
  apply_ok(t, current, std::vector<float>(current.size() * 8, 0.5f));
  embstore_table_stats_t s = stats(t);
  REQUIRE(s.tier_bytes_read == read);  // the update's rows were all still in memory
  REQUIRE(s.rows_moved_up == before.rows_moved_up);
  lookup_ok(t, next, 0);
  s = stats(t);
  REQUIRE(s.rows_moved_up == before.rows_moved_up + 24);  // 8 prefetched, 16 read now
  REQUIRE(s.tier_bytes_read > read);
}

TEST_CASE("a prefetch that fits only part of its batch reads the hottest rows",
          "[tiers][host_tier]") {
  TierDir tier;
  if (!host_tier_policy()) return;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_t* t = make_table(store, tier_config("emb", 8, 64));
  // Rows 0-29 used once, then rows 30-39 in five calls; two calls of 64 other keys each move
  // them all down.
  const std::vector<int64_t> cold = keys_from(0, 30), hot = keys_from(30, 10);
  lookup_ok(t, cold);
  for (int call = 0; call < 5; ++call) lookup_ok(t, hot);
  const std::vector<int64_t> other = keys_from(1000, 64), current = keys_from(2000, 64);
  lookup_ok(t, other);
  lookup_ok(t, current);
  const std::vector<int64_t> batch(current.begin(), current.begin() + 40);
  lookup_ok(t, batch);  // the current batch: its 40 rows stay for its update
  const embstore_table_stats_t before = stats(t);
  REQUIRE(before.rows_on_disk == 30 + 10 + 64);
  // The next batch: the 40 rows of cold and hot, with room for 24 beside the current batch.
  std::vector<int64_t> next = cold;
  next.insert(next.end(), hot.begin(), hot.end());
  ok(embstore_prefetch(t, next.data(), next.size(), nullptr));
  const uint64_t read = wait_for_bytes_read(t, before.tier_bytes_read);
  lookup_ok(t, hot, 0);  // finishes the prefetch: the hot rows came up with it
  const embstore_table_stats_t s = stats(t);
  REQUIRE(s.rows_moved_up == before.rows_moved_up + 24);
  REQUIRE(s.tier_bytes_read == read);  // nothing more read: by row id, 0-23 would have come
}

TEST_CASE("a prefetch in flight meets eviction, another prefetch and the table's end", "[tiers]") {
  TierDir tier;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_config_t c = tier_config("emb", 8, 32);
  c.evict_idle_steps = 100;
  embstore_table_t* t = make_table(store, c);
  ok(embstore_step(store, 1));
  const std::vector<int64_t> old_keys = key_range(64);
  lookup_ok(t, old_keys);  // touched at step 1; half of them on disk
  const std::vector<int64_t> fresh = keys_from(500, 32);
  ok(embstore_step(store, 2));
  lookup_ok(t, fresh);  // touched at step 2: the old rows go down
  REQUIRE(stats(t).rows_on_disk == 64);
  SECTION("eviction of the rows being read") {
    ok(embstore_prefetch(t, old_keys.data(), old_keys.size(), nullptr));
    // Idle since step 1: all 64 old rows go (in embstore_step's idle rule, or in the evict).
    ok(embstore_step(store, 102));
    uint64_t evicted = 0;
    ok(embstore_table_evict(t, &evicted));
    const embstore_table_stats_t s = stats(t);
    REQUIRE(s.evicted == 64);
    REQUIRE(s.rows == 32);
    REQUIRE(s.rows_in_device + s.rows_in_memory + s.rows_on_disk == 32);
    // Their keys start again from the initializer.
    const std::vector<float> again = lookup_ok(t, old_keys);
    const std::vector<float> fresh_table =
        lookup_ok(make_table(store, tier_config("x", 8, 0)), old_keys);
    REQUIRE(same_bits(again, fresh_table));
  }
  SECTION("a second prefetch while the first is in flight") {
    const std::vector<float> want = lookup_ok(make_table(store, tier_config("x", 8, 0)), old_keys);
    ok(embstore_prefetch(t, old_keys.data(), 32, nullptr));
    ok(embstore_prefetch(t, old_keys.data() + 32, 32, nullptr));
    REQUIRE(same_bits(lookup_ok(t, old_keys, 0), want));
  }
  SECTION("the store destroyed with a prefetch in flight") {
    ok(embstore_prefetch(t, old_keys.data(), old_keys.size(), nullptr));
  }
}

TEST_CASE("stats of a caller built before tiers leave the tier fields alone", "[tiers]") {
  TierDir tier;
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
