// A bad tier directory is a clear error naming it; a failed move fails the call and loses no
// row; a process killed while rows move comes back from its last checkpoint.
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "host/backend/host_buffer.hpp"
#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

embstore_status_t create_tiered(embstore_store_t* store, uint64_t memory_rows) {
  embstore_table_config_t c = tier_config("emb", 8, memory_rows);
  embstore_table_t* t = nullptr;
  return embstore_table_create(store, &c, &t);
}

TEST_CASE("a bad tier directory fails the table's creation with a message naming it",
          "[tiers][failure]") {
  TierDir tier;
  SECTION("memory_rows without a tier_dir") {
    StoreGuard store(tier_store(nullptr));
    require_status(create_tiered(store, 10), EMBSTORE_INVALID_ARGUMENT, "tier_dir");
    // Without a budget the store needs none.
    embstore_table_config_t c = tier_config("emb", 8, 0);
    make_table(store, c);
  }
  SECTION("missing") {
    const std::string missing = tier.path() + "/not-there";
    StoreGuard store(tier_store(missing.c_str()));
    require_status(create_tiered(store, 10), EMBSTORE_INVALID_ARGUMENT, missing.c_str());
  }
  SECTION("a file, not a directory") {
    const std::string file = tier.path() + "/file";
    std::ofstream(file) << "x";
    StoreGuard store(tier_store(file.c_str()));
    require_status(create_tiered(store, 10), EMBSTORE_INVALID_ARGUMENT, file.c_str());
  }
  SECTION("on tmpfs") {
    if (!in_memory("/dev/shm")) {
      WARN("no tmpfs at /dev/shm: not checked");
      return;
    }
    StoreGuard store(tier_store("/dev/shm"));
    require_status(create_tiered(store, 10), EMBSTORE_INVALID_ARGUMENT, "/dev/shm");
  }
  SECTION("read-only") {
    if (::geteuid() == 0) {
      WARN("running as root, which writes anywhere: not checked");
      return;
    }
    REQUIRE(::chmod(tier.path().c_str(), 0555) == 0);
    StoreGuard store(tier_store(tier.path().c_str()));
    const embstore_status_t s = create_tiered(store, 10);
    ::chmod(tier.path().c_str(), 0755);
    require_status(s, EMBSTORE_IO_ERROR, tier.path().c_str());
  }
  SECTION("an empty tier_dir is refused at the store") {
    embstore_store_config_t config;
    embstore_store_config_init(&config);
    config.backend = backend();
    config.tier_dir = "";
    embstore_store_t* store = nullptr;
    require_status(embstore_store_create(&config, &store), EMBSTORE_INVALID_ARGUMENT, "tier_dir");
  }
}

TEST_CASE("the CUDA backend takes an SSD tier below a device budget, as a stack of tables",
          "[tiers][failure]") {
  if (backend() != EMBSTORE_BACKEND_CUDA) return;
  TierDir tier;
  StoreGuard store(tier_store(tier.path().c_str()));
  embstore_table_config_t c = tier_config("emb", 8, 100);
  c.device_rows = 100;
  embstore_table_t* t = nullptr;
  ok(embstore_table_create(store, &c, &t));
  const std::vector<int64_t> keys = key_range(1000);
  lookup_ok(t, keys);
  const embstore_table_stats_t s = stats(t);
  REQUIRE(s.rows == 1000);
  REQUIRE(s.rows_in_device <= 100);
  REQUIRE(s.rows_on_disk > 0);
  REQUIRE(s.rows_in_device + s.rows_in_memory + s.rows_on_disk == s.rows);
  // A row limit over both tables is the stack's, with admission too (exact counts then on the
  // host: tier_limit_test.cpp compares it with an untiered table).
  c.name = "capped";
  c.max_capacity = 1500;
  c.admit_after = 2;
  ok(embstore_table_create(store, &c, &t));
  lookup_ok(t, keys);
  REQUIRE(stats(t).rows == 0);
  REQUIRE(stats(t).pending_admission == 1000);
  lookup_ok(t, keys);
  REQUIRE(stats(t).rows == 1000);
  // Keys 1000-1999 twice in one call: 1000 admitted on top of 1000 rows: refused, counted.
  const std::vector<int64_t> fresh = keys_from(1000, 1000);
  std::vector<int64_t> twice = fresh;
  twice.insert(twice.end(), fresh.begin(), fresh.end());
  std::vector<float> out;
  require_status(lookup(t, twice, EMBSTORE_LOOKUP_INSERT, &out), EMBSTORE_CAPACITY_EXCEEDED,
                 "max_capacity");
  REQUIRE(stats(t).rows == 1000);
  // 500 of them once: admitted, to the limit.
  lookup_ok(t, keys_from(1000, 500));
  REQUIRE(stats(t).rows == 1500);
  REQUIRE(stats(t).pending_admission == 500);
}

TEST_CASE("a failed write to the tier fails the call and loses no row", "[tiers][failure]") {
  TierDir tier;
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  Twins twins{a, b, make_table(a, tier_config("emb", 8, 0)),
              make_table(b, tier_config("emb", 8, 32))};
  for (uint64_t s = 1; s <= 3; ++s) twins.step(s, 300, 100);
  const std::vector<int64_t> all = key_range(300);
  const std::vector<float> before = lookup_ok(twins.plain, all, 0);
  // The last 32 keys' rows (those the stream inserted) are in memory; the first 100 keys' on disk.
  const std::vector<int64_t> hot(all.end() - 32, all.end()), cold(all.begin(), all.begin() + 100);
  lookup_ok(twins.tiered, hot, 0);
  const embstore_table_stats_t at_fault = stats(twins.tiered);
  REQUIRE(at_fault.rows_in_memory > 0);
  REQUIRE(at_fault.rows_in_memory <= 32);
  const std::vector<int64_t> fresh = keys_from(5000, 64);
  std::vector<float> out(fresh.size() * 8);
  {
    const int err = GENERATE(ENOSPC, EIO);
    INFO("errno " << err);
    FaultGuard faults([&](uint64_t, size_t) { return -err; });
    // Room for new rows means moving rows down, which fails: nothing is inserted.
    require_status(embstore_lookup(twins.tiered, fresh.data(), fresh.size(), out.data(),
                                   EMBSTORE_LOOKUP_INSERT, nullptr),
                   EMBSTORE_IO_ERROR, tier.path().c_str());
    std::vector<float> grads(cold.size() * 8, 0.25f);
    // Updating rows on disk brings them up, which needs room: fails the same way, unapplied.
    require_status(
        embstore_apply_gradients(twins.tiered, cold.data(), grads.data(), cold.size(), nullptr),
        EMBSTORE_IO_ERROR, "no row was lost");
  }
  const embstore_table_stats_t after = stats(twins.tiered);
  REQUIRE(after.rows == at_fault.rows);
  REQUIRE(after.rows_moved_down == at_fault.rows_moved_down);
  REQUIRE(same_bits(lookup_ok(twins.tiered, all, 0), before));
  for (uint64_t s = 4; s <= 6; ++s) twins.step(s, 300, 100);
  require_same_checkpoint(a, b, dir_a.path(), dir_b.path(), "emb");
}

TEST_CASE("a failed read from the tier fails the call or the checkpoint and loses no row",
          "[tiers][failure]") {
  TierDir tier;
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  no_rebaseline(a);
  no_rebaseline(b);
  Twins twins{a, b, make_table(a, tier_config("emb", 8, 0)),
              make_table(b, tier_config("emb", 8, 32))};
  for (uint64_t s = 1; s <= 3; ++s) twins.step(s, 300, 100);
  const std::vector<int64_t> all = key_range(300);
  const std::vector<float> before = lookup_ok(twins.plain, all, 0);
  const std::vector<int64_t> cold(all.begin(), all.begin() + 100);  // most of them on disk
  REQUIRE(stats(twins.tiered).rows_on_disk >= 100);
  const embstore_table_stats_t at_fault = stats(twins.tiered);
  std::vector<float> out(cold.size() * 8);
  std::vector<float> grads(cold.size() * 8, 0.25f);
  SECTION("a lookup's and an update's") {
    ReadFaultGuard faults([](uint64_t, size_t) { return -EIO; });
    require_status(embstore_lookup(twins.tiered, cold.data(), cold.size(), out.data(), 0, nullptr),
                   EMBSTORE_IO_ERROR, tier.path().c_str());
    require_status(
        embstore_apply_gradients(twins.tiered, cold.data(), grads.data(), cold.size(), nullptr),
        EMBSTORE_IO_ERROR, "no row was lost");
  }
  SECTION("a prefetch's, which the call that needs the rows meets again") {
    ReadFaultGuard faults([](uint64_t, size_t) { return -EIO; });
    ok(embstore_prefetch(twins.tiered, cold.data(), cold.size(), nullptr));  // not reported here
    require_status(embstore_lookup(twins.tiered, cold.data(), cold.size(), out.data(), 0, nullptr),
                   EMBSTORE_IO_ERROR, "reading rows from");
  }
  SECTION("a checkpoint's drain, then a checkpoint that succeeds") {
    uint64_t v = 0;
    {
      ReadFaultGuard faults([](uint64_t, size_t) { return -EIO; });
      ok(embstore_checkpoint(b, dir_b.path().c_str(), EMBSTORE_CKPT_FULL, &v));
      require_status(embstore_checkpoint_wait(b, v), EMBSTORE_IO_ERROR, "for a checkpoint");
    }
    REQUIRE_FALSE(std::filesystem::exists(version_dir(dir_b.path(), v)));  // no version left
  }
  const embstore_table_stats_t after = stats(twins.tiered);
  REQUIRE(after.rows == at_fault.rows);
  REQUIRE(after.rows_moved_up == at_fault.rows_moved_up);  // nothing came up
  REQUIRE(same_bits(lookup_ok(twins.tiered, all, 0), before));
  for (uint64_t s = 4; s <= 6; ++s) twins.step(s, 300, 100);
  require_same_checkpoint(a, b, dir_a.path(), dir_b.path(), "emb");
}

// Fails every host memory allocation while it lives (HostBuffer's test hook), counting them.
struct AllocFaultGuard {
  int asked = 0;
  AllocFaultGuard() {
    embstore::set_host_alloc_fault([this](size_t) {
      ++asked;
      return true;
    });
  }
  ~AllocFaultGuard() { embstore::set_host_alloc_fault({}); }
  AllocFaultGuard(const AllocFaultGuard&) = delete;
  AllocFaultGuard& operator=(const AllocFaultGuard&) = delete;
};

TEST_CASE("a failed allocation while rows move up fails the call and loses no row",
          "[tiers][host_tier][failure]") {
  TierDir tier;
  if (!host_tier_policy()) return;  // the hook is the host table's memory, its frames
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(tier.path().c_str()));
  Twins twins{a, b, make_table(a, tier_config("emb", 8, 0)),
              make_table(b, tier_config("emb", 8, 32))};
  // Batches within the first tier's frames (64: the table's initial capacity), so that the
  // frames never grew past them.
  for (uint64_t s = 1; s <= 8; ++s) twins.step(s, 300, 30);
  const std::vector<int64_t> all = key_range(300);
  const std::vector<float> before = lookup_ok(twins.plain, all, 0);
  const embstore_table_stats_t at_fault = stats(twins.tiered);
  REQUIRE(at_fault.rows_on_disk >= 100);
  std::vector<float> out(all.size() * 8);
  std::vector<float> grads(all.size() * 8, 0.25f);
  {
    // Every row of one call must be in memory at once: over a hundred frames, past the 32 of the
    // budget and the 64 the table has, so more frame memory is asked for, and refused.
    AllocFaultGuard faults;
    require_status(embstore_lookup(twins.tiered, all.data(), all.size(), out.data(), 0, nullptr),
                   EMBSTORE_OUT_OF_MEMORY, "");
    require_status(
        embstore_apply_gradients(twins.tiered, all.data(), grads.data(), all.size(), nullptr),
        EMBSTORE_OUT_OF_MEMORY, "");
    REQUIRE(faults.asked >= 2);
  }
  const embstore_table_stats_t after = stats(twins.tiered);
  REQUIRE(after.rows == at_fault.rows);
  REQUIRE(after.rows_in_memory + after.rows_on_disk == after.rows);
  REQUIRE(same_bits(lookup_ok(twins.tiered, all, 0), before));  // the update was not applied
  for (uint64_t s = 9; s <= 12; ++s) twins.step(s, 300, 100);
  require_same_checkpoint(a, b, dir_a.path(), dir_b.path(), "emb");
}

// A child trains a tiered table with a checkpoint every 3 steps and dies by SIGKILL at a random
// point while its rows move; restoring the last checkpoint equals replaying the stream to it.
TEST_CASE("a tiered store killed while rows move restores its last checkpoint",
          "[tiers][failure]") {
  TierDir tier;
  if (backend() != EMBSTORE_BACKEND_HOST) return;  // the child trains on the host backend
  TempDir dir;
  const int64_t keys = 2000;
  const size_t batch = 300;
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    die_with_parent(parent);
    embstore_store_config_t config;
    embstore_store_config_init(&config);
    config.backend = EMBSTORE_BACKEND_HOST;
    config.tier_dir = tier.path().c_str();
    embstore_store_t* store = nullptr;
    if (embstore_store_create(&config, &store) != EMBSTORE_OK) ::_exit(2);
    embstore_table_config_t c = tier_config("emb", 8, 50);
    embstore_table_t* t = nullptr;
    if (embstore_table_create(store, &c, &t) != EMBSTORE_OK) ::_exit(3);
    for (uint64_t s = 1;; ++s) {
      if (!host_train_step(store, t, s, keys, batch)) ::_exit(4);
      if (s % 3 == 0) {
        uint64_t v = 0;
        if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) !=
            EMBSTORE_OK) {
          ::_exit(5);
        }
      }
    }
  }
  // Let it get past a few checkpoints, then kill it mid-step.
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  REQUIRE(::kill(child, SIGKILL) == 0);
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(WIFSIGNALED(status));
  StoreGuard restored(tier_store(tier.path().c_str()));
  make_table(restored, tier_config("emb", 8, 50));
  uint64_t version = 0;
  const embstore_status_t r =
      embstore_restore(restored, dir.path().c_str(), EMBSTORE_LATEST, &version);
  if (r == EMBSTORE_NOT_FOUND) {
    WARN("the child committed no checkpoint in 600 ms: nothing to compare");
    return;
  }
  ok(r);
  REQUIRE(version % 3 == 0);
  StoreGuard replay(make_store());
  embstore_table_t* t = make_table(replay, tier_config("emb", 8, 0));
  for (uint64_t s = 1; s <= version; ++s) train_step(replay, t, s, keys, batch);
  const std::vector<int64_t> all = key_range(keys);
  REQUIRE(same_bits(lookup_ok(get_table(restored, "emb"), all, 0), lookup_ok(t, all, 0)));
  REQUIRE(stats(get_table(restored, "emb")).rows == stats(t).rows);
}

}  // namespace
}  // namespace embstore_test::tiers
