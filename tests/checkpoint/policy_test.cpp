// The checkpoint policy: checkpoints on schedule, retention of the newest full checkpoints,
// and retention after a rolled-back commit.
#include <catch2/catch.hpp>

#include "host/store/store.hpp"
#include "tests/checkpoint/checkpoint_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

TEST_CASE("the policy checkpoints on schedule and keeps the newest full checkpoints",
          "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.full_every_steps = 10;
  p.keep_full = 2;
  ok(embstore_checkpoint_set_policy(store, &p));
  for (uint64_t s = 1; s <= 45; ++s) {
    train_step(store, t, s, 100, 16);
    if (s % 10 == 0) ok(embstore_checkpoint_wait(store, s));  // the policy took it at s
  }
  const uint64_t last = checkpoint_ok(store, dir.path());
  REQUIRE(last == 45);

  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.committed == 5);  // 10, 20, 30, 40 and 45
  REQUIRE(cs.failed == 0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  REQUIRE(names.size() == 3);
  REQUIRE(names[2] == embstore::io::kLockFileName);  // held by the store
  REQUIRE(names[1] == fs::path(version_dir(dir.path(), 45)).filename().string());
  uint64_t v = 0;
  require_status(embstore_restore(store, dir.path().c_str(), 10, &v), EMBSTORE_NOT_FOUND, "10");

  // A checkpoint due while another is being written is deferred to a later step.
  {
    std::atomic<int> writes{0};
    FaultGuard slow([&](uint64_t, size_t) {
      if (writes.fetch_add(1) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return 0;
    });
    train_step(store, t, 50, 100, 16);  // due: version 50, slow
    train_step(store, t, 60, 100, 16);  // due, but 50 is in flight: deferred
    ok(embstore_checkpoint_wait(store, 50));
    require_status(embstore_checkpoint_wait(store, 60), EMBSTORE_NOT_FOUND, "60");
    train_step(store, t, 61, 100, 16);  // the deferred one
    ok(embstore_checkpoint_wait(store, 61));
  }

  // By time: due once the interval has passed, at the next step.
  TempDir timed;
  p.dir = timed.path().c_str();
  p.full_every_steps = 0;
  p.full_every_seconds = 0.05;
  p.keep_full = 0;
  ok(embstore_checkpoint_set_policy(store, &p));
  train_step(store, t, 62, 100, 16);
  ok(embstore_checkpoint_stats(store, &cs));
  const uint64_t before = cs.committed + cs.in_flight;
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  train_step(store, t, 63, 100, 16);
  ok(embstore_checkpoint_wait(store, 63));
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.committed == before + 1);
  REQUIRE(fs::exists(version_dir(timed.path(), 63)));
}

TEST_CASE("retention after a rollback keeps the new checkpoints", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.keep_full = 1;
  ok(embstore_checkpoint_set_policy(store, &p));
  for (uint64_t s = 100; s <= 300; s += 100) {
    train_step(store, t, s, 100, 16);
    checkpoint_ok(store, dir.path() + "/");  // another spelling of the policy's dir
  }
  REQUIRE_FALSE(fs::exists(version_dir(dir.path(), 200)));
  REQUIRE(fs::exists(version_dir(dir.path(), 300)));

  // Back to 300, then a checkpoint at an earlier step: it is kept, and 300 is not touched.
  REQUIRE(restore_ok(store, dir.path(), 300) == 300);
  t = get_table(store, "emb");
  train_step(store, t, 250, 100, 16);
  REQUIRE(checkpoint_ok(store, dir.path()) == 250);
  REQUIRE(fs::exists(version_dir(dir.path(), 250)));
  REQUIRE(fs::exists(version_dir(dir.path(), 300)));
}

TEST_CASE("a policy with a schedule has staging ready before its first checkpoint",
          "[checkpoint]") {
  // White-box: the ring is allocated (and pinned, on CUDA) off the training thread when the
  // policy is set, so the step that takes the first checkpoint does not pay for it.
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  const auto& checkpointer = *store.store->checkpointer;
  no_rebaseline(store);  // a policy without a schedule allocates nothing
  REQUIRE_FALSE(checkpointer.staging_ready());
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.full_every_steps = 10;
  ok(embstore_checkpoint_set_policy(store, &p));
  for (int i = 0; i < 1000 && !checkpointer.staging_ready(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  REQUIRE(checkpointer.staging_ready());
  for (uint64_t s = 1; s <= 10; ++s) train_step(store, t, s, 500);
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  do {
    ok(embstore_checkpoint_stats(store, &cs));
  } while (cs.in_flight != 0);
  REQUIRE(cs.committed == 1);
}
