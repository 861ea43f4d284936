// Checkpoints do not see tiers: full and incremental checkpoints of a tiered table hold the
// rows of its untiered twin's, rows captured and then moved (down or up) before the drain
// reached them included, and so does the delta after a checkpoint during which rows moved,
// whether that checkpoint succeeded or failed; checkpoints restore across tiered and untiered
// stores.
#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

// The rows of version v's files (full or delta) in dir, for table "emb".
std::map<int64_t, std::vector<float>> version_rows(const std::string& dir, uint64_t v, bool full) {
  return read_rows((full ? version_dir(dir, v) : delta_dir(dir, v)) + "/" + row_file("emb"));
}

// Twin stores with 1 MiB of staging (while a checkpoint's writer is held, most of its 6000 rows
// stay captured), an untiered table and one with 500 rows in memory, every key inserted and two
// steps trained. With device_rows (CUDA: a stack whose upper table has a device tier; the host
// backend ignores it) each step prefetches the next, which trades rows within the upper table.
struct HeldScene {
  static constexpr int64_t kKeys = 6000;
  TierDir tier;
  TempDir dir_a, dir_b;
  StoreGuard a{tier_store(nullptr, size_t{1} << 20)};
  StoreGuard b{tier_store(tier.path().c_str(), size_t{1} << 20)};
  std::vector<int64_t> all = key_range(kKeys);
  Twins twins{};

  explicit HeldScene(uint64_t device_rows = 0) {
    no_rebaseline(a);
    no_rebaseline(b);
    embstore_table_config_t tiered = tier_config("emb", 64, 500);
    tiered.device_rows = device_rows;
    twins = Twins{a, b, make_table(a, tier_config("emb", 64, 0)), make_table(b, tiered),
                  device_rows != 0};
    lookup_ok(twins.plain, all);
    lookup_ok(twins.tiered, all);
    for (uint64_t s = 1; s <= 2; ++s) twins.step(s, kKeys, 3000);
  }
};

TEST_CASE("full and incremental checkpoints of a tiered table equal its untiered twin's",
          "[tiers][checkpoint]") {
  TierDir tier;
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  no_rebaseline(a);
  no_rebaseline(b);
  const uint64_t budget = GENERATE(1, 16, 200);
  const bool prefetch_next = GENERATE(false, true);
  INFO("memory_rows " << budget << ", prefetch " << prefetch_next);
  Twins twins{a, b, make_table(a, tier_config("emb", 8, 0)),
              make_table(b, tier_config("emb", 8, budget)), prefetch_next};
  for (uint64_t s = 1; s <= 3; ++s) twins.step(s, 600, 150);
  REQUIRE(checkpoint_ok(a, dir_a.path()) == checkpoint_ok(b, dir_b.path()));
  REQUIRE(version_rows(dir_a.path(), 3, true) == version_rows(dir_b.path(), 3, true));
  for (uint64_t s = 4; s <= 6; ++s) {
    twins.step(s, 600, 40);  // a few rows change, most of them on disk
    REQUIRE(incremental_ok(a, dir_a.path()) == s);
    REQUIRE(incremental_ok(b, dir_b.path()) == s);
    const auto delta_a = version_rows(dir_a.path(), s, false);
    const auto delta_b = version_rows(dir_b.path(), s, false);
    REQUIRE(delta_a.size() < 600 / 2);
    REQUIRE(delta_a == delta_b);
  }
  // The chain restores into an untiered store and into a tiered one alike.
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), 6) == 6);
  const std::vector<int64_t> all = key_range(600);
  const std::vector<float> want = lookup_ok(twins.plain, all, 0);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), want));
  TierDir tier_d;
  StoreGuard d(tier_store(tier_d.path().c_str()));
  make_table(d, tier_config("emb", 8, budget));  // restore keeps the table's budget
  REQUIRE(restore_ok(d, dir_a.path(), 6) == 6);
  embstore_table_t* restored = get_table(d, "emb");
  REQUIRE(same_bits(lookup_ok(restored, all, 0), want));
  const embstore_table_stats_t s = stats(restored);
  REQUIRE(s.rows == stats(twins.plain).rows);
  if (budget < s.rows) REQUIRE(s.rows_on_disk > 0);
  // And it trains on as the twins do.
  Twins after{a, d, twins.plain, restored};
  for (uint64_t step = 7; step <= 9; ++step) after.step(step, 600, 100);
}

TEST_CASE("a full checkpoint of a tiered table reads its pages on disk once each, in any order",
          "[tiers][host_tier][checkpoint]") {
  TierDir tier;
  if (!host_tier_policy()) return;
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  no_rebaseline(a);
  no_rebaseline(b);
  // Dim 8 and Adagrad: 64 bytes a row, 64 rows a 4 KiB page. 30 steps of 1000 random keys of
  // 8000 move most rows up and down, so that row ids and slots on disk end in unrelated orders:
  // a drain by row id reads a page once for every batch of 1024 ids that has a row there.
  const int64_t keys = 8000;
  Twins twins{a, b, make_table(a, tier_config("emb", 8, 0)),
              make_table(b, tier_config("emb", 8, 100))};
  for (uint64_t s = 1; s <= 30; ++s) twins.step(s, keys, 1000);
  const embstore_table_stats_t before = stats(twins.tiered);
  REQUIRE(before.rows_on_disk > 7000);
  const uint64_t v = checkpoint_ok(a, dir_a.path());
  REQUIRE(checkpoint_ok(b, dir_b.path()) == v);
  const uint64_t read = stats(twins.tiered).tier_bytes_read - before.tier_bytes_read;
  const uint64_t pages_of_rows = (before.rows_on_disk + 63) / 64;
  CAPTURE(read / 4096, pages_of_rows);
  // Each page in the file at most once: the rows' pages and those of dead slots (compaction
  // keeps these under half the slots in use, so the file's pages in use are under twice the
  // rows', a few partly filled pages aside). By row id this table reads 532 pages (tried: 4.4
  // times its rows' pages), in slot order 209.
  REQUIRE(read / 4096 < 3 * pages_of_rows);
  REQUIRE(version_rows(dir_a.path(), v, true) == version_rows(dir_b.path(), v, true));
}

// A row that moves while a checkpoint is in flight must leave the next delta as the untiered
// twin's: not in it when the checkpoint succeeded and the row did not change since (a stack's
// moves carry no dirty bit the twin does not have), in it when the checkpoint failed (a failed
// snapshot's rows are dirty again, wherever they moved).
TEST_CASE("rows moved while a checkpoint is in flight leave the next delta as the untiered twin's",
          "[tiers][checkpoint]") {
  const bool fails = GENERATE(false, true);
  // With a device tier in the stack's upper table, rows moved up from below during the snapshot
  // (carried: dirty again if it fails) trade ids with idle device rows on each prefetch.
  const uint64_t device_rows = GENERATE(0, 200);
  INFO("the checkpoint in flight " << (fails ? "fails" : "succeeds") << ", device_rows "
                                   << device_rows);
  HeldScene scene(device_rows);
  auto& [tier, dir_a, dir_b, a, b, all, twins] = scene;
  (void)tier;  // the stores' tier directory, bound only because every member is
  const int64_t keys = HeldScene::kKeys;
  REQUIRE(checkpoint_ok(a, dir_a.path()) == checkpoint_ok(b, dir_b.path()));
  twins.step(3, keys, 3000);  // thousands of rows dirty: the delta in flight
  const uint64_t moved_before = stats(twins.tiered).rows_moved_up;
  {
    HeldCheckpointWriter held(std::chrono::seconds(2), fails ? HeldCheckpointWriter::Then::kFail
                                                             : HeldCheckpointWriter::Then::kWrite);
    uint64_t va = 0, vb = 0;
    ok(embstore_checkpoint(b, dir_b.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &vb));
    held.wait_held();
    ok(embstore_checkpoint(a, dir_a.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &va));
    REQUIRE(va == vb);
    // Training goes on: rows move up and down, captured ones among them, most not updated.
    for (uint64_t s = 4; s <= 5; ++s) twins.step(s, keys, 1500);
    REQUIRE(stats(twins.tiered).rows_moved_up > moved_before);
    held.release();
    const embstore_status_t want = fails ? EMBSTORE_IO_ERROR : EMBSTORE_OK;
    REQUIRE(embstore_status_name(embstore_checkpoint_wait(a, va)) ==
            std::string(embstore_status_name(want)));
    REQUIRE(embstore_status_name(embstore_checkpoint_wait(b, vb)) ==
            std::string(embstore_status_name(want)));
  }
  twins.step(6, keys, 500);
  const uint64_t next_a = incremental_ok(a, dir_a.path());
  REQUIRE(incremental_ok(b, dir_b.path()) == next_a);
  REQUIRE(version_rows(dir_a.path(), next_a, false) == version_rows(dir_b.path(), next_a, false));
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), next_a) == next_a);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), lookup_ok(twins.plain, all, 0)));
}

TEST_CASE(
    "rows captured and then moved between tiers before the drain are written once, "
    "with their values at the capture",
    "[tiers][checkpoint]") {
  const embstore_ckpt_kind_t kind = GENERATE(EMBSTORE_CKPT_FULL, EMBSTORE_CKPT_INCREMENTAL);
  INFO("kind " << kind);
  HeldScene scene;
  auto& [tier, dir_a, dir_b, a, b, all, twins] = scene;
  (void)tier;  // the stores' tier directory, bound only because every member is
  const int64_t keys = HeldScene::kKeys;
  if (kind == EMBSTORE_CKPT_INCREMENTAL) {
    REQUIRE(checkpoint_ok(a, dir_a.path()) == checkpoint_ok(b, dir_b.path()));
    // About 3800 rows dirty, spread over both tiers: more than staging holds.
    twins.step(3, keys, 6000);
  }
  const std::vector<float> at_capture = lookup_ok(twins.plain, all, 0);
  const uint64_t moved_before = stats(twins.tiered).rows_moved_up;
  uint64_t va = 0, vb = 0;
  {
    HeldCheckpointWriter held;
    ok(embstore_checkpoint(b, dir_b.path().c_str(), kind, &vb));
    held.wait_held();  // b's writer: the tiered table's snapshot waits
    ok(embstore_checkpoint(a, dir_a.path().c_str(), kind, &va));
    REQUIRE(va == vb);
    // Training goes on: rows go up and down, captured ones among them.
    for (uint64_t s = va + 1; s <= va + 3; ++s) twins.step(s, keys, 1500);
    REQUIRE(stats(twins.tiered).rows_moved_up > moved_before);
    held.release();
  }
  ok(embstore_checkpoint_wait(a, va));
  ok(embstore_checkpoint_wait(b, vb));
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(b, &cs));
  // Normally training meets captured rows (moved or updated: copied out first). But training
  // waits for staging room once copy-on-write's share of the ring is full, and if the held
  // writer lets go meanwhile the drain may take every captured row first (1 run in 3 on the
  // dev machine, where the three steps took about the hold's 2 s): the checks below hold
  // either way.
  if (cs.copy_on_write_rows == 0) WARN("no copy-on-write: the drain took every row first");
  const bool full = kind == EMBSTORE_CKPT_FULL;
  REQUIRE(version_rows(dir_a.path(), va, full) == version_rows(dir_b.path(), vb, full));
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), vb) == vb);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), at_capture));
}

}  // namespace
}  // namespace embstore_test::tiers

namespace embstore_test::tiers {
namespace {

TEST_CASE(
    "rows on disk evicted while a checkpoint is in flight are written with their values at "
    "the capture",
    "[tiers][checkpoint]") {
  TierDir tier;
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr, size_t{1} << 20));
  StoreGuard b(tier_store(tier.path().c_str(), size_t{1} << 20));
  embstore_table_config_t ca = tier_config("emb", 64, 0);
  ca.evict_idle_steps = 2;
  embstore_table_config_t cb = ca;
  cb.memory_rows = 300;
  Twins twins{a, b, make_table(a, ca), make_table(b, cb)};
  const int64_t keys = 6000;
  const std::vector<int64_t> all = key_range(keys);
  lookup_ok(twins.plain, all);  // every row at step 0: idle, and mostly on disk, by step 3
  lookup_ok(twins.tiered, all);
  twins.step(1, 200, 100);  // a few rows stay in use
  const std::vector<float> at_capture = lookup_ok(twins.plain, all, 0);
  uint64_t va = 0, vb = 0;
  {
    HeldCheckpointWriter held;
    ok(embstore_checkpoint(b, dir_b.path().c_str(), EMBSTORE_CKPT_FULL, &vb));
    held.wait_held();
    ok(embstore_checkpoint(a, dir_a.path().c_str(), EMBSTORE_CKPT_FULL, &va));
    REQUIRE(va == vb);
    // The idle rule runs in embstore_step (every step for N = 2): rows idle since step 0, most
    // of them on disk and captured, are copied out, then evicted.
    ok(embstore_step(a, 4));
    ok(embstore_step(b, 4));
    REQUIRE(stats(twins.tiered).evicted == stats(twins.plain).evicted);
    REQUIRE(stats(twins.tiered).evicted > keys / 2);
    held.release();
  }
  ok(embstore_checkpoint_wait(a, va));
  ok(embstore_checkpoint_wait(b, vb));
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(b, &cs));
  // Normally the eviction meets captured rows (a copy-on-write that ignores rows on disk fails
  // this test); under TSan the drain has been seen to take them all first.
  if (cs.copy_on_write_rows == 0) WARN("no copy-on-write: the drain took every row first");
  REQUIRE(version_rows(dir_a.path(), va, true) == version_rows(dir_b.path(), vb, true));
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), vb) == vb);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), at_capture));
  REQUIRE(stats(twins.tiered).rows == stats(twins.plain).rows);
}

}  // namespace
}  // namespace embstore_test::tiers
