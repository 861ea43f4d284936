// A tiered table keeps its row limit (max_capacity) as its untiered twin does: a call past it
// fails the same way with nothing inserted, or evicts the same least recently used rows wherever
// they live, and the deltas and restores that follow agree. On a stack of tables (the CUDA
// backend's SSD tier, the host's under EMBSTORE_TEST_STACKED_TIERS) the limit is the stack's.
#include <random>
#include <set>

#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

constexpr uint64_t kLimit = 100;

// Admission in a twin's config: none, exact counts, a Bloom filter with few keys sharing
// counters, one small enough that most do (its conservative update then depends on the order of
// the occurrences, and keys are admitted before they are seen admit_after times).
enum class Admission { kNone, kExact, kBloom, kCrowdedBloom };

embstore_table_config_t limited_config(uint64_t memory_rows, bool evict_when_full,
                                       Admission admission = Admission::kNone) {
  embstore_table_config_t c = tier_config("emb", 8, memory_rows);
  c.initial_capacity = 64;
  c.max_capacity = kLimit;
  c.evict_when_full = evict_when_full ? 1 : 0;
  if (admission != Admission::kNone) c.admit_after = admission == Admission::kExact ? 3 : 2;
  if (admission == Admission::kBloom) c.admit_bloom_bytes = 4096;
  if (admission == Admission::kCrowdedBloom) c.admit_bloom_bytes = 96;
  return c;
}

// The status and message of a lookup with insert.
std::pair<embstore_status_t, std::string> try_lookup(embstore_table_t* t,
                                                     const std::vector<int64_t>& keys) {
  std::vector<float> out;
  const embstore_status_t s = lookup(t, keys, EMBSTORE_LOOKUP_INSERT, &out);
  return {s, s == EMBSTORE_OK ? std::string() : std::string(embstore_last_error())};
}

// Both tables refuse keys the same way: same status, same message.
void require_same_refusal(embstore_table_t* plain, embstore_table_t* tiered,
                          const std::vector<int64_t>& keys) {
  const auto a = try_lookup(plain, keys);
  const auto b = try_lookup(tiered, keys);
  REQUIRE(std::string(embstore_status_name(a.first)) == "EMBSTORE_CAPACITY_EXCEEDED");
  REQUIRE(std::string(embstore_status_name(b.first)) == "EMBSTORE_CAPACITY_EXCEEDED");
  REQUIRE(a.second == b.second);
}

// The same counts, and the same values for the keys `all`, rows or none.
void require_same_rows(embstore_table_t* plain, embstore_table_t* tiered,
                       const std::vector<int64_t>& all) {
  const embstore_table_stats_t sa = stats(plain);
  const embstore_table_stats_t sb = stats(tiered);
  REQUIRE(sa.rows == sb.rows);
  REQUIRE(sa.evicted == sb.evicted);
  REQUIRE(sa.dirty_rows == sb.dirty_rows);
  REQUIRE(sb.rows <= kLimit);
  REQUIRE(same_bits(lookup_ok(plain, all, 0), lookup_ok(tiered, all, 0)));
}

// For key_range(keys).
void require_same_rows(embstore_table_t* plain, embstore_table_t* tiered, int64_t keys) {
  require_same_rows(plain, tiered, key_range(keys));
}

// An untiered table and a tiered one, each with the row limit, in stores of their own.
struct LimitedTwins {
  TierDir tier;
  StoreGuard a{tier_store(nullptr)};
  StoreGuard b{tier_store(tier.path().c_str())};
  embstore_table_t* plain;
  embstore_table_t* tiered;
  LimitedTwins(uint64_t budget, bool evict_when_full, Admission admission = Admission::kNone)
      : plain(make_table(a, limited_config(0, evict_when_full, admission))),
        tiered(make_table(b, limited_config(budget, evict_when_full, admission))) {}
  std::pair<embstore_table_t*, embstore_table_t*> tables() const { return {plain, tiered}; }
};

TEST_CASE("without an eviction rule, a tiered table at max_capacity refuses as the untiered one",
          "[tiers]") {
  const uint64_t budget = GENERATE(1, 16);
  INFO("memory_rows " << budget);
  LimitedTwins twins(budget, false);
  auto [plain, tiered] = twins.tables();
  for (embstore_table_t* t : {plain, tiered}) lookup_ok(t, key_range(90));
  // 30 new keys (80-89 have rows) on top of 90 rows pass the limit of 100: nothing inserted.
  require_same_refusal(plain, tiered, keys_from(80, 40));
  REQUIRE(stats(tiered).rows == 90);
  require_same_rows(plain, tiered, 200);
  // Up to the limit, and one more.
  for (embstore_table_t* t : {plain, tiered}) lookup_ok(t, keys_from(90, 10));
  require_same_refusal(plain, tiered, {100});
  REQUIRE(stats(tiered).rows == kLimit);
  require_same_rows(plain, tiered, 200);
}

TEST_CASE("with evict_when_full, a tiered table at max_capacity evicts the untiered one's rows",
          "[tiers]") {
  TierDir tier;
  const uint64_t budget = GENERATE(1, 16, 60);
  const bool prefetch_next = GENERATE(false, true);
  INFO("memory_rows " << budget << ", prefetch " << prefetch_next);
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  no_rebaseline(a);
  no_rebaseline(b);
  Twins twins{a, b, make_table(a, limited_config(0, true)),
              make_table(b, limited_config(budget, true)), prefetch_next};
  const int64_t keys = 400;
  for (uint64_t s = 1; s <= 4; ++s) twins.step(s, keys, 60);
  REQUIRE(checkpoint_ok(a, dir_a.path()) == checkpoint_ok(b, dir_b.path()));
  size_t tombstones = 0;
  for (uint64_t s = 5; s <= 10; ++s) {
    twins.step(s, keys, 60);
    REQUIRE(incremental_ok(a, dir_a.path()) == s);
    REQUIRE(incremental_ok(b, dir_b.path()) == s);
    const std::string rows = "/" + row_file("emb");
    std::vector<int64_t> gone_a, gone_b;
    REQUIRE(read_rows(delta_dir(dir_a.path(), s) + rows, &gone_a) ==
            read_rows(delta_dir(dir_b.path(), s) + rows, &gone_b));
    REQUIRE(gone_a == gone_b);
    tombstones += gone_a.size();
  }
  REQUIRE(tombstones > 0);
  const embstore_table_stats_t s = stats(twins.tiered);
  REQUIRE(s.evicted > 0);
  REQUIRE(s.rows == kLimit);
  if (budget < kLimit) REQUIRE(s.rows_on_disk > 0);
  require_same_rows(twins.plain, twins.tiered, keys);

  // The chain's tombstones: the tiered store's chain restores into an untiered store as the
  // untiered twin holds its rows (an evicted key read back would be a row too many).
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), 10) == 10);
  embstore_table_t* restored = get_table(c, "emb");
  REQUIRE(stats(restored).rows == stats(twins.plain).rows);
  const std::vector<int64_t> all = key_range(keys);
  REQUIRE(same_bits(lookup_ok(restored, all, 0), lookup_ok(twins.plain, all, 0)));
}

TEST_CASE("a tiered table at max_capacity with too few rows to evict refuses as the untiered one",
          "[tiers]") {
  const uint64_t budget = GENERATE(1, 16);
  INFO("memory_rows " << budget);
  LimitedTwins twins(budget, true);
  auto [plain, tiered] = twins.tables();
  const std::vector<int64_t> first = key_range(static_cast<int64_t>(kLimit));
  for (embstore_table_t* t : {plain, tiered}) {
    lookup_ok(t, first);
    apply_ok(t, first, std::vector<float>(first.size() * 8, 0.5f));
  }
  const std::vector<float> trained = lookup_ok(tiered, first, 0);
  ok(embstore_step(twins.a, 1));
  ok(embstore_step(twins.b, 1));
  // 101 new rows need 101 evicted; 100 may go.
  require_same_refusal(plain, tiered, keys_from(1000, kLimit + 1));
  REQUIRE(stats(tiered).evicted == 0);
  require_same_rows(plain, tiered, 2000);
  // 50 new rows: the 50 least recently used go (all touched at step 0: the lowest keys).
  for (embstore_table_t* t : {plain, tiered}) lookup_ok(t, keys_from(1000, 50));
  REQUIRE(stats(tiered).evicted == 50);
  require_same_rows(plain, tiered, 2000);
  // Keys 0-49 read what a key without a row reads (not their trained values), 50-99 their rows.
  const std::vector<float> now = lookup_ok(tiered, first, 0);
  const size_t half = 50 * 8;
  for (size_t i = 0; i < 50; ++i) {
    const std::vector<float> was(trained.begin() + i * 8, trained.begin() + (i + 1) * 8);
    REQUIRE(!same_bits(std::vector<float>(now.begin() + i * 8, now.begin() + (i + 1) * 8), was));
  }
  REQUIRE(same_bits(std::vector<float>(now.begin() + half, now.end()),
                    std::vector<float>(trained.begin() + half, trained.end())));
}

TEST_CASE("a call at max_capacity that fails on the tier evicts nothing", "[tiers][failure]") {
  TierDir tier;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  Twins twins{a, b, make_table(a, limited_config(0, true)),
              make_table(b, limited_config(16, true))};
  for (uint64_t s = 1; s <= 4; ++s) twins.step(s, 400, 60);
  const embstore_table_stats_t before = stats(twins.tiered);
  REQUIRE(before.rows == kLimit);
  REQUIRE(before.rows_on_disk > 0);
  // Ten keys of step 2 (most of their rows on disk by now) and twenty new ones: twenty rows must
  // go to make room, and the rows below must come up first, which fails.
  std::vector<int64_t> keys, step2;
  std::vector<float> grads;
  step_batch(2, 400, 60, 8, &step2, &grads);
  const std::set<int64_t> old(step2.begin(), step2.end());
  keys.assign(old.begin(), old.end());
  keys.resize(10);
  for (int64_t i = 0; i < 20; ++i) keys.push_back(100000 + i);
  {
    ReadFaultGuard faults([](uint64_t, size_t) { return -EIO; });
    std::vector<float> out;
    require_status(lookup(twins.tiered, keys, EMBSTORE_LOOKUP_INSERT, &out), EMBSTORE_IO_ERROR,
                   "no row was lost");
  }
  const embstore_table_stats_t after = stats(twins.tiered);
  REQUIRE(after.evicted == before.evicted);
  REQUIRE(after.rows == before.rows);
  // As if the call had not been made: the twins go on alike.
  require_same_rows(twins.plain, twins.tiered, 400);
  for (uint64_t s = 5; s <= 7; ++s) twins.step(s, 400, 60);
  require_same_rows(twins.plain, twins.tiered, 400);
}

TEST_CASE("a call at max_capacity refused for its size changes nothing in a tiered table",
          "[tiers]") {
  const uint64_t budget = GENERATE(1, 16);
  INFO("memory_rows " << budget);
  LimitedTwins twins(budget, true);
  for (embstore_table_t* t : {twins.plain, twins.tiered}) lookup_ok(t, key_range(100));
  ok(embstore_step(twins.a, 1));
  ok(embstore_step(twins.b, 1));
  const embstore_table_stats_t before = stats(twins.tiered);
  // 200,000 new rows need as many evicted; 100 may go (the call's own 100 keys, most of their
  // rows below, are spared). Refused before any new row's room is made: nothing grows. A stack
  // refuses before it moves anything; the host table's own tier brings the call's rows up first
  // (moving others down), as for any call.
  std::vector<int64_t> keys = key_range(100);
  const std::vector<int64_t> fresh = keys_from(1000, 200000);
  keys.insert(keys.end(), fresh.begin(), fresh.end());
  require_same_refusal(twins.plain, twins.tiered, keys);
  const embstore_table_stats_t after = stats(twins.tiered);
  REQUIRE(after.capacity == before.capacity);
  if (!host_tier_policy()) {
    REQUIRE(after.rows_moved_down == before.rows_moved_down);
    REQUIRE(after.tier_bytes_written == before.tier_bytes_written);
    REQUIRE(after.rows_moved_up == before.rows_moved_up);
    REQUIRE(after.tier_bytes_read == before.tier_bytes_read);
  }
  require_same_rows(twins.plain, twins.tiered, 2000);
}

// Twin tables at a row limit of 100 fed a random stream: one to three calls a step (lookups with
// and without insert, some too large to fit, updates, prefetches of the tiered table), an
// incremental checkpoint every 5 steps. Statuses, messages, values, counts and deltas agree,
// with admission too: a stack asks its upper table's counts how many rows a call at the limit
// inserts (a refused call's keys stay counted, as in the untiered table).
TEST_CASE("a tiered table at max_capacity agrees with the untiered one on a random stream",
          "[tiers]") {
  const uint64_t budget = GENERATE(1, 17, 90);
  const uint64_t seed = GENERATE(1, 2);
  const bool evict_when_full = GENERATE(true, false);
  const Admission admission =
      GENERATE(Admission::kNone, Admission::kExact, Admission::kCrowdedBloom);
  INFO("memory_rows " << budget << ", seed " << seed << ", evict_when_full " << evict_when_full
                      << ", admission " << static_cast<int>(admission));
  TempDir dir_a, dir_b;
  LimitedTwins twins(budget, evict_when_full, admission);
  no_rebaseline(twins.a);
  no_rebaseline(twins.b);
  auto [plain, tiered] = twins.tables();
  std::mt19937_64 rng(seed);
  const auto batch = [&](size_t n) {
    std::vector<int64_t> k(n);
    for (int64_t& key : k) key = static_cast<int64_t>(rng() % 300) - 20;
    return k;
  };
  REQUIRE(checkpoint_ok(twins.a, dir_a.path()) == checkpoint_ok(twins.b, dir_b.path()));
  for (uint64_t s = 1; s <= 40; ++s) {
    const int calls = 1 + static_cast<int>(rng() % 3);
    for (int c = 0; c < calls; ++c) {
      const int kind =
          static_cast<int>(rng() % 6);  // 0-2, 5 (larger): insert; 3: read; 4: prefetch
      const std::vector<int64_t> k = batch(1 + rng() % (kind == 5 ? 140 : 50));
      INFO("step " << s << ", call " << c << ", kind " << kind);
      if (kind == 4) {
        prefetch_ok(tiered, k);
      } else if (kind == 3) {
        REQUIRE(same_bits(lookup_ok(plain, k, 0), lookup_ok(tiered, k, 0)));
      } else {
        const auto ra = try_lookup(plain, k);
        const auto rb = try_lookup(tiered, k);
        REQUIRE(std::string(embstore_status_name(ra.first)) == embstore_status_name(rb.first));
        REQUIRE(ra.second == rb.second);
        if (ra.first == EMBSTORE_OK && rng() % 2 == 0) {
          std::vector<float> g(k.size() * 8);
          for (float& x : g) x = static_cast<float>(rng() % 1000) / 1000.0f - 0.5f;
          apply_ok(plain, k, g);
          apply_ok(tiered, k, g);
        }
      }
      const embstore_table_stats_t sa = stats(plain);
      const embstore_table_stats_t sb = stats(tiered);
      REQUIRE(sa.rows == sb.rows);
      REQUIRE(sa.evicted == sb.evicted);
      REQUIRE(sa.dirty_rows == sb.dirty_rows);
      REQUIRE(sa.admitted == sb.admitted);
      REQUIRE(sa.pending_admission == sb.pending_admission);
    }
    ok(embstore_step(twins.a, s));
    ok(embstore_step(twins.b, s));
    if (s % 5 == 0) {
      REQUIRE(incremental_ok(twins.a, dir_a.path()) == s);
      REQUIRE(incremental_ok(twins.b, dir_b.path()) == s);
      const std::string rows = "/" + row_file("emb");
      std::vector<int64_t> gone_a, gone_b;
      REQUIRE(read_rows(delta_dir(dir_a.path(), s) + rows, &gone_a) ==
              read_rows(delta_dir(dir_b.path(), s) + rows, &gone_b));
      REQUIRE(gone_a == gone_b);
    }
  }
  if (evict_when_full) REQUIRE(stats(tiered).evicted > 0);
  if (admission != Admission::kNone) REQUIRE(stats(tiered).pending_admission > 0);
  require_same_rows(plain, tiered, keys_from(-20, 300));  // every key of the stream
}

// Rows evicted at the limit while a checkpoint's writer is held (its rows mostly still
// captured), the checkpoint then written or failed: that checkpoint, the next delta and a
// restore of the chain agree with the untiered twin's.
TEST_CASE(
    "a tiered table evicting at max_capacity during a checkpoint agrees with the untiered one",
    "[tiers][checkpoint]") {
  const bool full = GENERATE(true, false);
  const bool fails = GENERATE(false, true);
  INFO("full " << full << ", fails " << fails);
  TierDir tier;
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr, size_t{1} << 20));
  StoreGuard b(tier_store(tier.path().c_str(), size_t{1} << 20));
  no_rebaseline(a);
  no_rebaseline(b);
  embstore_table_config_t c = limited_config(0, true);
  c.dim = 64;
  c.max_capacity = 4000;
  embstore_table_config_t tiered_config = c;
  tiered_config.memory_rows = 300;
  Twins twins{a, b, make_table(a, c), make_table(b, tiered_config)};
  const int64_t keys = 20000;
  for (uint64_t s = 1; s <= 3; ++s) twins.step(s, keys, 3000);
  REQUIRE(stats(twins.tiered).rows == c.max_capacity);
  if (!full) {
    REQUIRE(checkpoint_ok(a, dir_a.path()) == checkpoint_ok(b, dir_b.path()));
    twins.step(4, keys, 3000);
  }
  const embstore_ckpt_kind_t kind = full ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
  uint64_t va = 0, vb = 0;
  {
    HeldCheckpointWriter held(std::chrono::seconds(2), fails ? HeldCheckpointWriter::Then::kFail
                                                             : HeldCheckpointWriter::Then::kWrite);
    ok(embstore_checkpoint(b, dir_b.path().c_str(), kind, &vb));
    held.wait_held();
    ok(embstore_checkpoint(a, dir_a.path().c_str(), kind, &va));
    for (uint64_t s = 5; s <= 7; ++s) twins.step(s, keys, 2500);
    REQUIRE(stats(twins.tiered).evicted == stats(twins.plain).evicted);
    held.release();
  }
  const embstore_status_t want = fails ? EMBSTORE_IO_ERROR : EMBSTORE_OK;
  require_status(embstore_checkpoint_wait(a, va), want);
  require_status(embstore_checkpoint_wait(b, vb), want);
  const std::string rows = "/" + row_file("emb");
  const auto files = [&](const std::string& dir, uint64_t v) {
    const std::string delta = delta_dir(dir, v) + rows;
    return std::filesystem::exists(delta) ? delta : version_dir(dir, v) + rows;
  };
  std::vector<int64_t> gone_a, gone_b;
  if (!fails) {
    REQUIRE(read_rows(files(dir_a.path(), va), &gone_a) ==
            read_rows(files(dir_b.path(), vb), &gone_b));
    REQUIRE(gone_a == gone_b);
  }
  twins.step(8, keys, 500);
  const uint64_t next = incremental_ok(a, dir_a.path());
  REQUIRE(incremental_ok(b, dir_b.path()) == next);
  REQUIRE(read_rows(files(dir_a.path(), next), &gone_a) ==
          read_rows(files(dir_b.path(), next), &gone_b));
  REQUIRE(gone_a == gone_b);
  StoreGuard restored(tier_store(nullptr));
  REQUIRE(restore_ok(restored, dir_b.path(), next) == next);
  const std::vector<int64_t> all = key_range(keys);
  REQUIRE(same_bits(lookup_ok(get_table(restored, "emb"), all, 0), lookup_ok(twins.plain, all, 0)));
}

// Admission at the limit, step by step: keys below admit_after get no row and need no room; a
// call that admits more than fit is refused with its keys counted, as the untiered table does,
// so that their next occurrence admits them.
TEST_CASE("a tiered table with admission at max_capacity counts and refuses as the untiered one",
          "[tiers]") {
  const uint64_t budget = GENERATE(1, 16);
  const Admission admission = GENERATE(Admission::kExact, Admission::kBloom);
  INFO("memory_rows " << budget << ", admission " << static_cast<int>(admission));
  LimitedTwins twins(budget, false, admission);
  auto [plain, tiered] = twins.tables();
  const uint32_t admit_after = admission == Admission::kExact ? 3 : 2;
  // Rows for keys 0-89 (each seen admit_after times).
  for (uint32_t i = 0; i < admit_after; ++i) {
    for (embstore_table_t* t : {plain, tiered}) lookup_ok(t, key_range(90));
  }
  REQUIRE(stats(tiered).rows == 90);
  // 40 keys seen once more than the 10 rows left: none reaches admit_after, so nothing needs room.
  for (embstore_table_t* t : {plain, tiered}) lookup_ok(t, keys_from(1000, 40));
  REQUIRE(stats(tiered).rows == 90);
  require_same_rows(plain, tiered, keys_from(0, 1100));
  // Seen admit_after times within the call: 40 rows on top of 90 pass the limit. Refused, and
  // every occurrence counted, also those of keys 2000-2004 (twice each: not yet admitted).
  std::vector<int64_t> refused;
  for (uint32_t i = 1; i < admit_after; ++i) {
    const std::vector<int64_t> k = keys_from(1000, 40);
    refused.insert(refused.end(), k.begin(), k.end());
  }
  for (int i = 0; i < 2; ++i) {
    const std::vector<int64_t> k = keys_from(2000, 5);
    refused.insert(refused.end(), k.begin(), k.end());
  }
  require_same_refusal(plain, tiered, refused);
  REQUIRE(stats(tiered).rows == 90);
  REQUIRE(stats(tiered).pending_admission == stats(plain).pending_admission);
  // Keys 1000-1019 once each: counted to the threshold before, each is admitted now, 20 rows on
  // top of 90: refused again (the stack must count what was counted before this call).
  require_same_refusal(plain, tiered, keys_from(1000, 20));
  REQUIRE(stats(tiered).rows == 90);
  // Five of those and 2000-2004 once more (three occurrences in all: admitted): 10 rows, the limit.
  std::vector<int64_t> last = keys_from(1000, 5);
  const std::vector<int64_t> again = keys_from(2000, 5);
  last.insert(last.end(), again.begin(), again.end());
  for (embstore_table_t* t : {plain, tiered}) lookup_ok(t, last);
  REQUIRE(stats(plain).rows == kLimit);
  REQUIRE(stats(tiered).rows == kLimit);
  REQUIRE(stats(tiered).admitted == stats(plain).admitted);
  REQUIRE(stats(tiered).pending_admission == stats(plain).pending_admission);
  require_same_rows(plain, tiered, keys_from(0, 2100));
}

}  // namespace
}  // namespace embstore_test::tiers
