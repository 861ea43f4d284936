// Incremental checkpoints on each backend: a chain of deltas restores every version exactly;
// a broken or corrupt chain is reported; rebaseline, directories and deferral; deltas taken
// while training goes on or while the table grows.
#include <catch2/catch.hpp>

#include "tests/checkpoint/checkpoint_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

TEST_CASE("a chain of deltas restores every version exactly", "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAM));
  no_rebaseline(store);
  const std::vector<int64_t> all = key_range(3000);
  std::map<uint64_t, std::vector<float>> at;
  std::map<uint64_t, uint64_t> rows_at;
  // Version 1 is full (no full in dir yet); then deltas, each on a few keys, new keys included.
  for (uint64_t s = 1; s <= 8; ++s) {
    train_step(store, t, s, 1000 + 250 * static_cast<int64_t>(s), 64);
    const uint64_t dirty = stats(t).dirty_rows;
    REQUIRE(incremental_ok(store, dir.path()) == s);
    REQUIRE(stats(t).dirty_rows == 0);
    at[s] = lookup_ok(t, all, 0);
    rows_at[s] = stats(t).rows;
    if (s == 1) {
      REQUIRE(fs::exists(version_dir(dir.path(), 1)));
    } else {
      REQUIRE(fs::exists(delta_dir(dir.path(), s)));
      const std::string file = delta_dir(dir.path(), s) + "/" + row_file("emb");
      REQUIRE(read_rows(file).size() == dirty);  // only what changed
    }
  }
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.committed == 8);
  REQUIRE(cs.deltas_committed == 7);

  for (uint64_t s = 1; s <= 8; ++s) {
    StoreGuard b(make_store());
    REQUIRE(restore_ok(b, dir.path(), s) == s);
    embstore_table_t* tb = get_table(b, "emb");
    REQUIRE(stats(tb).rows == rows_at[s]);
    REQUIRE(same_bits(lookup_ok(tb, all, 0), at[s]));
  }
  // Training goes on from a restored delta and extends the chain, once the store that wrote
  // it has let go of the directory (one writer per directory).
  train_step(store, t, 9, 3000, 64);
  const std::vector<float> at9 = lookup_ok(t, all, 0);
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 8);
  no_rebaseline(b);
  embstore_table_t* tb = get_table(b, "emb");
  train_step(b, tb, 9, 3000, 64);
  uint64_t v = 0;
  REQUIRE(embstore_checkpoint(b, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) ==
          EMBSTORE_BUSY);
  ok(embstore_store_destroy(store.store));
  store.store = nullptr;
  REQUIRE(incremental_ok(b, dir.path()) == 9);
  REQUIRE(fs::exists(delta_dir(dir.path(), 9)));
  StoreGuard c(make_store());
  restore_ok(c, dir.path(), 9);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), at9));
}

TEST_CASE("a broken or corrupt chain is reported, never loaded", "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  no_rebaseline(store);
  for (uint64_t s = 1; s <= 4; ++s) {
    train_step(store, t, s, 4000, 2000);
    incremental_ok(store, dir.path());
  }
  StoreGuard b(make_store());
  uint64_t v = 0;
  SECTION("a flipped byte in a middle delta") {
    flip_byte(delta_dir(dir.path(), 2) + "/" + row_file("emb"), 200);
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT,
                   ("00000000000000000002.delta/" + row_file("emb")).c_str());
    REQUIRE(restore_ok(b, dir.path(), 1) == 1);  // the full alone is fine
  }
  SECTION("a truncated middle delta") {
    const std::string file = delta_dir(dir.path(), 3) + "/" + row_file("emb");
    fs::resize_file(file, fs::file_size(file) - 4096);
    require_status(embstore_restore(b, dir.path().c_str(), 4, &v), EMBSTORE_CORRUPT, "truncated");
  }
  SECTION("a missing link") {
    fs::remove_all(delta_dir(dir.path(), 2));
    require_status(embstore_restore(b, dir.path().c_str(), 4, &v), EMBSTORE_CORRUPT,
                   "chain is broken");
  }
  REQUIRE(embstore_store_backend(b) == backend());
}

TEST_CASE("incremental checkpoints rebaseline, follow their directory and are deferred",
          "[checkpoint][incremental]") {
  TempDir dir, other;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.max_chain_length = 2;
  p.rebaseline_fraction = 0;
  ok(embstore_checkpoint_set_policy(store, &p));
  for (uint64_t s = 1; s <= 5; ++s) {
    train_step(store, t, s, 100, 16);
    incremental_ok(store, dir.path());
  }
  // 1 full (first), 2 and 3 deltas, 4 full (chain of 2 reached), 5 delta.
  REQUIRE(fs::exists(version_dir(dir.path(), 1)));
  REQUIRE(fs::exists(delta_dir(dir.path(), 3)));
  REQUIRE(fs::exists(version_dir(dir.path(), 4)));
  REQUIRE(fs::exists(delta_dir(dir.path(), 5)));

  // Another directory: its first incremental is a full one, and back in the first directory
  // the chain no longer holds the rows changed meanwhile, so that one is full too.
  train_step(store, t, 6, 100, 16);
  incremental_ok(store, other.path());
  REQUIRE(fs::exists(version_dir(other.path(), 6)));
  train_step(store, t, 7, 100, 16);
  incremental_ok(store, dir.path());
  REQUIRE(fs::exists(version_dir(dir.path(), 7)));

  // The policy: an incremental every 2 steps; one due while another is written is deferred.
  p.max_chain_length = 32;
  p.incremental_every_steps = 2;
  ok(embstore_checkpoint_set_policy(store, &p));
  {
    std::atomic<int> writes{0};
    FaultGuard slow([&](uint64_t, size_t) {
      if (writes.fetch_add(1) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return 0;
    });
    train_step(store, t, 8, 100, 16);   // due: a delta, slow
    train_step(store, t, 10, 100, 16);  // due, deferred
    ok(embstore_checkpoint_wait(store, 8));
    train_step(store, t, 11, 100, 16);  // the deferred one
    ok(embstore_checkpoint_wait(store, 11));
  }
  REQUIRE(fs::exists(delta_dir(dir.path(), 8)));
  REQUIRE(fs::exists(delta_dir(dir.path(), 11)));
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.deferred >= 1);
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 11);
  const std::vector<int64_t> all = key_range(100);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), lookup_ok(t, all, 0)));

  // The default rebaseline by bytes: once the deltas since the full outweigh half of it, the
  // next incremental is full. Every row changes each step here, so that is the second one.
  TempDir third;
  embstore_checkpoint_policy_init(&p);
  ok(embstore_checkpoint_set_policy(store, &p));
  train_step(store, t, 20, 100, 400);
  REQUIRE(incremental_ok(store, third.path()) == 20);  // full: first in dir
  train_step(store, t, 21, 100, 400);
  incremental_ok(store, third.path());
  REQUIRE(fs::exists(delta_dir(third.path(), 21)));
  train_step(store, t, 22, 100, 400);
  incremental_ok(store, third.path());
  REQUIRE(fs::exists(version_dir(third.path(), 22)));
}

TEST_CASE("a delta taken while training goes on holds the rows at its step",
          "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(small_staging_store());
  embstore_table_t* t = make_table(store, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  no_rebaseline(store);
  // Larger than the writer's first block plus the staging ring (about 15k rows of 136 bytes),
  // so rows of the delta are still captured while the writer is held.
  const int64_t keys = 40000;
  const std::vector<int64_t> all = key_range(keys);
  lookup_ok(t, all);
  REQUIRE(incremental_ok(store, dir.path()) == 0);  // the full base
  // Three quarters of the rows change before the delta's capture.
  std::vector<int64_t> half(all.begin(), all.begin() + 3 * keys / 4);
  apply_ok(t, half, std::vector<float>(half.size() * 16, 0.25f));
  ok(embstore_step(store, 1));
  const uint64_t dirty = stats(t).dirty_rows;
  REQUIRE(dirty == half.size());
  const std::vector<float> at_capture = lookup_ok(t, all, 0);

  HeldWriter held;
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &version));
  for (uint64_t s = 2; s <= 4; ++s) train_step(store, t, s, keys + 500, 1000);
  held.release();
  ok(embstore_checkpoint_wait(store, version));
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.copy_on_write_rows > 0);  // training met rows of the delta before they were written
  REQUIRE(fs::exists(delta_dir(dir.path(), 1)));
  const auto rows = read_rows(delta_dir(dir.path(), 1) + "/" + row_file("emb"));
  REQUIRE(rows.size() == dirty);
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), 1) == 1);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at_capture));
  REQUIRE(stats(get_table(b, "emb")).rows == static_cast<uint64_t>(keys));
}

TEST_CASE("a table that doubles twice under a full and a delta in flight restores bit-exactly",
          "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(small_staging_store());
  embstore_table_config_t c = config_for("emb", 16, EMBSTORE_OPT_ADAGRAD);
  c.initial_capacity = 16384;
  embstore_table_t* t = make_table(store, c);
  no_rebaseline(store);
  // Rows of each snapshot are still captured while its writer is held (see the test above),
  // and each growth round inserts three times the rows there were: the table doubles twice.
  int64_t keys = 16000;
  auto grow_and_train = [&](int64_t from, int64_t to, uint64_t step) {
    const uint64_t capacity = stats(t).capacity;
    std::vector<int64_t> fresh(static_cast<size_t>(to - from));
    for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = from + static_cast<int64_t>(i);
    lookup_ok(t, fresh);
    REQUIRE(stats(t).capacity >= 4 * capacity);
    // Captured rows change too: they are copied out before they are updated.
    train_step(store, t, step, 2 * keys, 2000);
  };
  // A checkpoint of `kind` at the current step `version`, held in flight while the table grows.
  auto checkpoint_while_growing = [&](embstore_ckpt_kind_t kind, uint64_t version) {
    HeldWriter held;
    uint64_t got = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), kind, &got));
    REQUIRE(got == version);
    grow_and_train(keys, 4 * keys, version + 1);
    held.release();
    ok(embstore_checkpoint_wait(store, version));
  };

  lookup_ok(t, key_range(keys));
  ok(embstore_step(store, 1));
  const std::vector<float> at_full = lookup_ok(t, key_range(keys), 0);
  checkpoint_while_growing(EMBSTORE_CKPT_FULL, 1);
  keys *= 4;
  train_step(store, t, 3, keys, 4000);
  const uint64_t rows_at_delta = stats(t).rows;
  const std::vector<int64_t> all = key_range(keys);
  const std::vector<float> at_delta = lookup_ok(t, all, 0);
  checkpoint_while_growing(EMBSTORE_CKPT_INCREMENTAL, 3);
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.copy_on_write_rows > 0);
  REQUIRE(fs::exists(delta_dir(dir.path(), 3)));

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), 1) == 1);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), key_range(keys / 4), 0), at_full));
  REQUIRE(stats(get_table(b, "emb")).rows == static_cast<uint64_t>(keys / 4));
  REQUIRE(restore_ok(b, dir.path(), 3) == 3);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at_delta));
  REQUIRE(stats(get_table(b, "emb")).rows == rows_at_delta);
}

// A restore loads the newest version first and the table skips the older rows of a key, so
// the full checkpoint's block arrives when the delta's rows are already in: a table at its
// max_capacity must count only the rows it adds, not the block's.
TEST_CASE("a chain restores into a table filled to its max_capacity", "[checkpoint][incremental]") {
  TempDir dir;
  embstore_table_config_t config = config_for("emb", 8, EMBSTORE_OPT_ADAGRAD);
  config.max_capacity = 512;
  config.initial_capacity = 64;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config);
  no_rebaseline(store);
  const std::vector<int64_t> all = key_range(512);
  lookup_ok(t, all);
  apply_ok(t, all, std::vector<float>(all.size() * 8, 0.25f));
  ok(embstore_step(store, 1));
  REQUIRE(incremental_ok(store, dir.path()) == 1);  // the full: none in dir yet
  const std::vector<int64_t> some(all.begin(), all.begin() + 64);
  apply_ok(t, some, std::vector<float>(some.size() * 8, -0.5f));
  ok(embstore_step(store, 2));
  REQUIRE(incremental_ok(store, dir.path()) == 2);
  REQUIRE(fs::exists(delta_dir(dir.path(), 2)));
  const std::vector<float> expected = lookup_ok(t, all, 0);

  StoreGuard fresh(make_store());  // the table as the manifest describes it
  REQUIRE(restore_ok(fresh, dir.path(), 2) == 2);
  REQUIRE(stats(get_table(fresh, "emb")).rows == 512);
  REQUIRE(same_bits(lookup_ok(get_table(fresh, "emb"), all, 0), expected));
  StoreGuard existing(make_store());  // a table of the same configuration already there
  embstore_table_t* te = make_table(existing, config);
  REQUIRE(restore_ok(existing, dir.path(), 2) == 2);
  REQUIRE(same_bits(lookup_ok(te, all, 0), expected));
}
