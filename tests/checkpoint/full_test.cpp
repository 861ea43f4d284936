// Full checkpoints on each backend: every optimizer round-trips bit-exactly and training goes
// on, a checkpoint taken while training goes on (and flat out, from two threads) holds the rows
// at its step, attachments, versions, restore into an existing table or a store of the other
// backend, and a store destroyed with a checkpoint in flight.
#include <catch2/catch.hpp>

#include "tests/checkpoint/checkpoint_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

TEST_CASE("a full checkpoint round-trips every optimizer bit-exactly and training continues",
          "[checkpoint]") {
  const embstore_optimizer_t opt = GENERATE(EMBSTORE_OPT_SGD, EMBSTORE_OPT_ADAGRAD,
                                            EMBSTORE_OPT_ROWWISE_ADAGRAD, EMBSTORE_OPT_ADAM);
  INFO("optimizer " << opt);
  TempDir dir;
  const int64_t keys = 600;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 13, opt));
  for (uint64_t s = 1; s <= 5; ++s) train_step(a, ta, s, keys);
  const uint64_t version = checkpoint_ok(a, dir.path());
  REQUIRE(version == 5);

  // Into an empty store: the table is created from the manifest, exactly as configured.
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 5);
  embstore_table_t* tb = get_table(b, "emb");
  REQUIRE(embstore_table_dim(tb) == 13);
  REQUIRE(stats(tb).rows == stats(ta).rows);
  REQUIRE(stats(tb).dirty_rows == 0);
  const std::vector<int64_t> all = key_range(keys);
  REQUIRE(same_bits(lookup_ok(ta, all, 0), lookup_ok(tb, all, 0)));

  // Training goes on identically: the optimizer state came back too, bit for bit.
  for (uint64_t s = 6; s <= 9; ++s) {
    train_step(a, ta, s, keys);
    train_step(b, tb, s, keys);
  }
  REQUIRE(same_bits(lookup_ok(ta, all, 0), lookup_ok(tb, all, 0)));
  TempDir da, db;
  checkpoint_ok(a, da.path());
  checkpoint_ok(b, db.path());
  const auto rows_a = read_rows(table_file(da.path(), 9, "emb"));
  const auto rows_b = read_rows(table_file(db.path(), 9, "emb"));
  REQUIRE(rows_a.size() == stats(ta).rows);
  REQUIRE(rows_a == rows_b);  // values and optimizer state
}

TEST_CASE("a checkpoint taken while training goes on holds the rows at its step", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(small_staging_store());
  embstore_table_t* t = make_table(store, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  const int64_t keys = 20000;
  const std::vector<int64_t> all = key_range(keys);
  lookup_ok(t, all);  // every key gets a row
  for (uint64_t s = 1; s <= 3; ++s) train_step(store, t, s, keys, 2000);
  const std::vector<float> at_capture = lookup_ok(t, all, 0);

  HeldWriter held;
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
  REQUIRE(version == 3);
  for (uint64_t s = 4; s <= 6; ++s) train_step(store, t, s, keys + 500, 1000);  // new keys too
  held.release();
  ok(embstore_checkpoint_wait(store, version));

  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.copy_on_write_rows > 0);
  REQUIRE(cs.committed == 1);
  REQUIRE(cs.rows_written == static_cast<uint64_t>(keys));
  REQUIRE(cs.last_version == 3);

  const auto rows = read_rows(table_file(dir.path(), 3, "emb"));
  REQUIRE(rows.size() == static_cast<size_t>(keys));
  for (size_t i = 0; i < all.size(); ++i) {
    auto it = rows.find(all[i]);
    REQUIRE(it != rows.end());
    REQUIRE(std::memcmp(it->second.data(), &at_capture[i * 16], 16 * sizeof(float)) == 0);
  }
  // Training after the capture changed the table, and none of it is in the checkpoint.
  REQUIRE_FALSE(same_bits(lookup_ok(t, all, 0), at_capture));
  StoreGuard fresh(make_store());
  restore_ok(fresh, dir.path(), 3);
  REQUIRE(same_bits(lookup_ok(get_table(fresh, "emb"), all, 0), at_capture));
  REQUIRE(stats(get_table(fresh, "emb")).rows == static_cast<uint64_t>(keys));
}

TEST_CASE("attachments are saved with the next checkpoint and restored", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 4, EMBSTORE_OPT_SGD));
  train_step(store, t, 1, 100);
  const std::string rng = "reader offset 12345, rng state 0xdeadbeef";
  ok(embstore_checkpoint_attach(store, "rng", "stale", 5));
  ok(embstore_checkpoint_attach(store, "rng", rng.data(), rng.size()));  // replaces
  ok(embstore_checkpoint_attach(store, "empty", nullptr, 0));
  checkpoint_ok(store, dir.path());
  train_step(store, t, 2, 100);
  checkpoint_ok(store, dir.path());  // attachments were consumed by the first one

  StoreGuard b(make_store());
  restore_ok(b, dir.path(), 1);
  size_t bytes = 0;
  ok(embstore_restore_attachment(b, "rng", nullptr, 0, &bytes));
  REQUIRE(bytes == rng.size());
  std::vector<char> buf(bytes);
  bytes = 0;
  require_status(embstore_restore_attachment(b, "rng", buf.data(), buf.size() - 1, &bytes),
                 EMBSTORE_INVALID_ARGUMENT, "capacity");
  REQUIRE(bytes == rng.size());
  ok(embstore_restore_attachment(b, "rng", buf.data(), buf.size(), &bytes));
  REQUIRE(std::string(buf.begin(), buf.end()) == rng);
  ok(embstore_restore_attachment(b, "empty", nullptr, 0, &bytes));
  REQUIRE(bytes == 0);
  require_status(embstore_restore_attachment(b, "other", nullptr, 0, &bytes), EMBSTORE_NOT_FOUND,
                 "other");

  restore_ok(b, dir.path(), 2);
  require_status(embstore_restore_attachment(b, "rng", nullptr, 0, &bytes), EMBSTORE_NOT_FOUND,
                 "rng");
}

TEST_CASE("restored rows count as inserted, not as admitted by training", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 4, EMBSTORE_OPT_SGD));
  lookup_ok(t, key_range(100));
  REQUIRE(stats(t).admitted == 100);
  checkpoint_ok(store, dir.path());
  StoreGuard b(make_store());
  restore_ok(b, dir.path(), EMBSTORE_LATEST);
  embstore_table_t* r = get_table(b, "emb");
  REQUIRE(stats(r).inserted == 100);
  REQUIRE(stats(r).admitted == 0);
  lookup_ok(r, {1000, 1001, 1000});
  REQUIRE(stats(r).inserted == 102);
  REQUIRE(stats(r).admitted == 2);
}

TEST_CASE("restore picks the latest or an exact version", "[checkpoint]") {
  TempDir dir;
  const std::string nested = dir.file("a/b/c");  // created with its parents
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  const std::vector<int64_t> all = key_range(200);
  std::map<uint64_t, std::vector<float>> at;
  for (uint64_t s = 10; s <= 30; s += 10) {
    train_step(store, t, s, 200);
    REQUIRE(checkpoint_ok(store, nested) == s);
    at[s] = lookup_ok(t, all, 0);
  }
  // The same step twice is refused; nothing is overwritten.
  uint64_t v = 0;
  require_status(embstore_checkpoint(store, nested.c_str(), EMBSTORE_CKPT_FULL, &v),
                 EMBSTORE_ALREADY_EXISTS, "30");

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, nested, 20) == 20);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at[20]));
  REQUIRE(restore_ok(b, nested, EMBSTORE_LATEST) == 30);  // into the existing table
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at[30]));
  REQUIRE(restore_ok(b, nested, 10) == 10);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at[10]));
  require_status(embstore_restore(b, nested.c_str(), 25, &v), EMBSTORE_NOT_FOUND, "25");
  require_status(embstore_restore(b, dir.file("missing").c_str(), EMBSTORE_LATEST, &v),
                 EMBSTORE_NOT_FOUND, "does not exist");
  require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_NOT_FOUND,
                 "no committed checkpoint");
}

TEST_CASE("restore replaces the rows of an existing table and checks its shape", "[checkpoint]") {
  TempDir dir;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  train_step(a, ta, 1, 100);
  const uint64_t rows = stats(ta).rows;
  checkpoint_ok(a, dir.path());
  const std::vector<int64_t> all = key_range(100);
  const std::vector<float> expected = lookup_ok(ta, all, 0);

  SECTION("rows the checkpoint lacks are gone") {
    StoreGuard b(make_store());
    embstore_table_t* tb = make_table(b, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
    lookup_ok(tb, {1000001, 1000002});
    restore_ok(b, dir.path(), EMBSTORE_LATEST);
    REQUIRE(get_table(b, "emb") == tb);  // the handle stays valid
    REQUIRE(stats(tb).rows == rows);
    REQUIRE(same_bits(lookup_ok(tb, all, 0), expected));
    REQUIRE(lookup_ok(tb, {1000001}, 0) == std::vector<float>(8, 0.0f));
  }
  SECTION("a different dim or optimizer is refused and nothing changes") {
    StoreGuard b(make_store());
    embstore_table_t* tb = make_table(b, config_for("emb", 4, EMBSTORE_OPT_ADAGRAD));
    const std::vector<float> before = lookup_ok(tb, {1, 2, 3});
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v),
                   EMBSTORE_INVALID_ARGUMENT, "dim");
    REQUIRE(same_bits(lookup_ok(tb, {1, 2, 3}, 0), before));
    StoreGuard c(make_store());
    make_table(c, config_for("emb", 8, EMBSTORE_OPT_ADAM));
    require_status(embstore_restore(c, dir.path().c_str(), EMBSTORE_LATEST, &v),
                   EMBSTORE_INVALID_ARGUMENT, "optimizer");
  }
  SECTION("more rows than an existing table's max_capacity") {
    StoreGuard b(make_store());
    embstore_table_config_t c = config_for("emb", 8, EMBSTORE_OPT_ADAGRAD);
    c.max_capacity = rows - 1;
    c.initial_capacity = 16;
    make_table(b, c);
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v),
                   EMBSTORE_CAPACITY_EXCEEDED, "max_capacity");
  }
}

TEST_CASE("destroying a store finishes its checkpoint in flight", "[checkpoint]") {
  TempDir dir;
  embstore_store_t* store = make_store();
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  train_step(store, t, 7, 5000, 5000);
  const std::vector<int64_t> all = key_range(5000);
  const std::vector<float> expected = lookup_ok(t, all, 0);
  uint64_t v = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v));
  ok(embstore_store_destroy(store));
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 7);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), expected));
}

TEST_CASE("a checkpoint restores into a store of the other backend", "[checkpoint]") {
  // On a machine with a device this is HOST -> CUDA and CUDA -> HOST; without one, both
  // stores are HOST and the test still checks the round trip.
  TempDir dir;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 24, EMBSTORE_OPT_ROWWISE_ADAGRAD));
  for (uint64_t s = 1; s <= 3; ++s) train_step(a, ta, s, 400);
  checkpoint_ok(a, dir.path());
  const std::vector<int64_t> all = key_range(400);
  const std::vector<float> expected = lookup_ok(ta, all, 0);

  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = backend() == EMBSTORE_BACKEND_CUDA ? EMBSTORE_BACKEND_HOST : EMBSTORE_BACKEND_AUTO;
  embstore_store_t* other = nullptr;
  ok(embstore_store_create(&c, &other));
  StoreGuard guard(other);
  REQUIRE(restore_ok(other, dir.path(), EMBSTORE_LATEST) == 3);
  embstore_table_t* to = get_table(other, "emb");
  std::vector<float> got(all.size() * 24);
  if (embstore_store_backend(other) == backend()) {
    got = lookup_ok(to, all, 0);  // same backend: the helper handles device memory
  } else {
    REQUIRE(embstore_store_backend(other) == EMBSTORE_BACKEND_HOST);
    ok(embstore_lookup(to, all.data(), all.size(), got.data(), 0, nullptr));
  }
  REQUIRE(same_bits(got, expected));
}

TEST_CASE("a checkpoint completes while two threads train its table flat out", "[checkpoint]") {
  // Drain gives way to training calls, but only for a while: two trainers keep the table
  // wanted nearly all the time, and the rows they do not touch must still be written.
  TempDir dir;
  StoreGuard store(make_store(1));
  embstore_table_t* t = make_table(store, config_for("emb", 32, EMBSTORE_OPT_ADAGRAD));
  const std::vector<int64_t> all = key_range(50000);
  lookup_ok(t, all);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto trainer = [&](int64_t base) {
    // Hot keys only: the cold rows are left to the drain.
    std::vector<int64_t> keys(64);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = base + static_cast<int64_t>(i);
    std::vector<float> grads(keys.size() * 32, 0.001f);
    while (!stop.load() && std::chrono::steady_clock::now() < deadline) {
      if (embstore_apply_gradients(t, keys.data(), grads.data(), keys.size(), nullptr) !=
          EMBSTORE_OK) {
        break;
      }
      calls.fetch_add(1);
    }
  };
  if (backend() != EMBSTORE_BACKEND_HOST) return;  // the trainers use host pointers
  std::thread a(trainer, int64_t{-100}), b(trainer, int64_t{100});
  while (calls.load() < 100) std::this_thread::yield();
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
  ok(embstore_checkpoint_wait(store, version));
  const bool trainers_were_running = std::chrono::steady_clock::now() < deadline;
  stop.store(true);
  a.join();
  b.join();
  REQUIRE(trainers_were_running);
  REQUIRE(read_rows(table_file(dir.path(), version, "emb")).size() == all.size());
}
