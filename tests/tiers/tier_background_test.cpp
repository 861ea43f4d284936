// A prefetch that needs frames moves colder rows down on the table's prefetch thread, beside
// training calls: the calls that meet those rows, a checkpoint captured meanwhile and a failed
// write all leave the table as an untiered twin's.
#include <atomic>
#include <mutex>
#include <set>
#include <thread>

#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

constexpr uint32_t kDim = 8;

// Tier writes seen by the write fault hook, by thread, while it lives.
class WriterThreads {
 public:
  WriterThreads()
      : guard_([this](uint64_t, size_t) {
          std::lock_guard lock(m_);
          threads_.insert(std::this_thread::get_id());
          return 0;
        }) {}
  bool any() {
    std::lock_guard lock(m_);
    return !threads_.empty();
  }
  bool this_thread_wrote() {
    std::lock_guard lock(m_);
    return threads_.count(std::this_thread::get_id()) != 0;
  }

 private:
  std::mutex m_;
  std::set<std::thread::id> threads_;
  FaultGuard guard_;
};

// A tiered table (64 rows in memory) beside its untiered twin, both holding the same rows:
// `read`'s 32 on disk, `old`'s 64 in memory (dirty: updated once), old[0] used last. A prefetch
// of `read` then needs 32 frames: it moves 40 of old's rows down (the excess and an eighth of
// the budget), old[0] spared as the current batch's.
struct SceneOptions {
  uint64_t evict_idle_steps = 0;  // both tables' idle rule (0: none)
  size_t filler = 0;              // rows inserted first (lower row ids), on disk in the tiered
  size_t staging_bytes = 0;       // the stores' (0: the default)
};

struct PrefetchScene {
  TierDir tier;
  StoreGuard plain_store, tiered_store;
  embstore_table_t* plain = nullptr;
  embstore_table_t* tiered = nullptr;
  const std::vector<int64_t> read = keys_from(1000, 32), old = keys_from(0, 64);

  explicit PrefetchScene(const SceneOptions& o = {})
      : plain_store(tier_store(nullptr, o.staging_bytes)),
        tiered_store(tier_store(tier.path().c_str(), o.staging_bytes)) {
    embstore_table_config_t c = tier_config("emb", kDim, 0);
    c.evict_idle_steps = o.evict_idle_steps;
    plain = make_table(plain_store, c);
    c.memory_rows = 64;
    tiered = make_table(tiered_store, c);
    for (embstore_table_t* t : {plain, tiered}) {
      if (o.filler != 0) lookup_ok(t, keys_from(100000, o.filler));
      lookup_ok(t, read);
      lookup_ok(t, old);  // read's rows go down
      apply_ok(t, old, grads(old.size(), 0.5f));
      lookup_ok(t, {old[0]}, 0);  // the current batch
    }
    REQUIRE(stats(tiered).rows_on_disk == 32 + o.filler);
    REQUIRE(stats(tiered).rows_in_memory == 64);
  }
  static std::vector<float> grads(size_t rows, float g) {
    return std::vector<float>(rows * kDim, g);
  }
  std::vector<int64_t> all() const {
    std::vector<int64_t> k = old;
    k.insert(k.end(), read.begin(), read.end());
    return k;
  }
  void require_same_rows() {
    REQUIRE(same_bits(lookup_ok(tiered, all(), 0), lookup_ok(plain, all(), 0)));
  }
};

TEST_CASE("a prefetch moves rows down on its own thread, and its next call finishes the move",
          "[tiers][host_tier]") {
  if (!host_tier_policy()) return;
  PrefetchScene scene;
  const embstore_table_stats_t before = stats(scene.tiered);
  {
    WriterThreads writers;
    ok(embstore_prefetch(scene.tiered, scene.read.data(), scene.read.size(), nullptr));
    // Nothing moved on this thread: the rows going down are still in memory, still counted there.
    const embstore_table_stats_t s = stats(scene.tiered);
    REQUIRE(s.rows_moved_down == before.rows_moved_down);
    REQUIRE(s.rows_in_memory == 64);
    // The lookup that needs the prefetched rows finishes both moves.
    REQUIRE(
        same_bits(lookup_ok(scene.tiered, scene.read, 0), lookup_ok(scene.plain, scene.read, 0)));
    REQUIRE(writers.any());
    REQUIRE_FALSE(writers.this_thread_wrote());  // every tier write on another thread
  }
  const embstore_table_stats_t s = stats(scene.tiered);
  REQUIRE(s.rows_moved_down == before.rows_moved_down + 40);
  REQUIRE(s.rows_moved_up == before.rows_moved_up + 32);
  REQUIRE(s.rows_in_memory <= 64);
  REQUIRE(s.tier_bytes_written >= before.tier_bytes_written + 40 * kDim * 2 * sizeof(float));
  scene.require_same_rows();  // the rows that went down come back with their values
}

TEST_CASE("calls and checkpoints that meet rows a prefetch moves down see their values",
          "[tiers][host_tier]") {
  if (!host_tier_policy()) return;
  PrefetchScene scene;
  TempDir dir_a, dir_b;
  ok(embstore_prefetch(scene.tiered, scene.read.data(), scene.read.size(), nullptr));
  SECTION("an update of them") {
    for (embstore_table_t* t : {scene.plain, scene.tiered}) {
      apply_ok(t, scene.old, PrefetchScene::grads(scene.old.size(), -0.25f));
    }
  }
  SECTION("a lookup of them") {
    REQUIRE(same_bits(lookup_ok(scene.tiered, scene.old, 0), lookup_ok(scene.plain, scene.old, 0)));
  }
  SECTION("a checkpoint captured while they move") {
    // The rows are dirty: the full checkpoint holds their values, not what the read put in their
    // frames.
    require_same_checkpoint(scene.plain_store, scene.tiered_store, dir_a.path(), dir_b.path(),
                            "emb");
  }
  scene.require_same_rows();
  for (embstore_store_t* s : {scene.plain_store.store, scene.tiered_store.store}) {
    ok(embstore_step(s, 1));
  }
  require_same_checkpoint(scene.plain_store, scene.tiered_store, dir_a.path(), dir_b.path(), "emb");
}

TEST_CASE("rows a prefetch moves down can be evicted before it ends", "[tiers][host_tier]") {
  if (!host_tier_policy()) return;
  PrefetchScene scene({.evict_idle_steps = 100});
  ok(embstore_prefetch(scene.tiered, scene.read.data(), scene.read.size(), nullptr));
  // Every row is idle since step 0: all go, the 40 moving down among them.
  for (embstore_store_t* s : {scene.plain_store.store, scene.tiered_store.store}) {
    ok(embstore_step(s, 1000));
  }
  uint64_t evicted = 0;
  ok(embstore_table_evict(scene.tiered, &evicted));
  const embstore_table_stats_t s = stats(scene.tiered);
  REQUIRE(s.rows == 0);
  REQUIRE(s.rows_in_memory + s.rows_on_disk == 0);
  REQUIRE(stats(scene.plain).rows == 0);
  scene.require_same_rows();  // both start again from the initializer
}

TEST_CASE("rows captured by a checkpoint in flight go to it before a prefetch moves them down",
          "[tiers][host_tier]") {
  if (!host_tier_policy()) return;
  // 30,000 rows of lower row ids than old's, and 1 MiB of staging: with the writer held, the
  // drain fills the staging before it reaches old's rows, which stay captured.
  PrefetchScene scene({.filler = 30000, .staging_bytes = size_t{1} << 20});
  TempDir dir_a, dir_b;
  const uint64_t va = checkpoint_ok(scene.plain_store, dir_a.path());
  uint64_t vb = 0;
  {
    // The tiered store's checkpoint writer is held: the prefetch takes 40 of old's captured rows
    // down and reads other rows into their frames; it must write them to the snapshot first,
    // taking them before it waits for anything (the drain's read of the tier, staging room: the
    // writer goes on after at most the hold); a prefetch that waited first could find every row
    // already taken by the drain.
    HeldCheckpointWriter held;
    ok(embstore_checkpoint(scene.tiered_store, dir_b.path().c_str(), EMBSTORE_CKPT_FULL, &vb));
    held.wait_held();
    ok(embstore_prefetch(scene.tiered, scene.read.data(), scene.read.size(), nullptr));
    lookup_ok(scene.tiered, scene.read, 0);  // finishes it
    for (embstore_table_t* t : {scene.plain, scene.tiered}) {
      apply_ok(t, scene.read, PrefetchScene::grads(scene.read.size(), 1.0f));  // after the capture
    }
    held.release();
    ok(embstore_checkpoint_wait(scene.tiered_store, vb));
  }
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(scene.tiered_store, &cs));
  REQUIRE(cs.copy_on_write_rows >= 40);  // old's 40 at least (read's 32 too, when updated)
  REQUIRE(stats(scene.tiered).rows_moved_down >= 40);
  const auto want = read_rows(version_dir(dir_a.path(), va) + "/" + row_file("emb"));
  const auto got = read_rows(version_dir(dir_b.path(), vb) + "/" + row_file("emb"));
  REQUIRE(got.size() == want.size());
  for (const auto& [key, rec] : want) REQUIRE(same_bits(rec, got.at(key)));
  scene.require_same_rows();
}

TEST_CASE("a prefetch whose write fails moves nothing and reads nothing, and loses no row",
          "[tiers][host_tier][failure]") {
  if (!host_tier_policy()) return;
  PrefetchScene scene;
  TempDir dir_a, dir_b;
  const embstore_table_stats_t before = stats(scene.tiered);
  std::atomic<int> writes{0};
  SECTION("once: the lookup that needs the rows moves and reads them itself") {
    {
      FaultGuard fail_first([&](uint64_t, size_t) { return writes.fetch_add(1) == 0 ? -EIO : 0; });
      ok(embstore_prefetch(scene.tiered, scene.read.data(), scene.read.size(), nullptr));
      REQUIRE(
          same_bits(lookup_ok(scene.tiered, scene.read, 0), lookup_ok(scene.plain, scene.read, 0)));
    }
    REQUIRE(writes.load() > 1);  // the prefetch's write failed, the lookup's went through
    const embstore_table_stats_t s = stats(scene.tiered);
    REQUIRE(s.rows_moved_up == before.rows_moved_up + 32);
    REQUIRE(s.rows_in_memory <= 64);
  }
  SECTION("always: the lookup fails as well, and nothing moved") {
    {
      FaultGuard fail_all([&](uint64_t, size_t) {
        writes.fetch_add(1);
        return -ENOSPC;
      });
      ok(embstore_prefetch(scene.tiered, scene.read.data(), scene.read.size(), nullptr));  // a hint
      std::vector<float> out(scene.read.size() * kDim);
      require_status(embstore_lookup(scene.tiered, scene.read.data(), scene.read.size(), out.data(),
                                     0, nullptr),
                     EMBSTORE_IO_ERROR, "no row was lost");
    }
    REQUIRE(writes.load() >= 2);
    const embstore_table_stats_t s = stats(scene.tiered);
    REQUIRE(s.rows_moved_down == before.rows_moved_down);
    REQUIRE(s.rows_moved_up == before.rows_moved_up);
    REQUIRE(s.rows_in_memory == 64);
  }
  scene.require_same_rows();
  require_same_checkpoint(scene.plain_store, scene.tiered_store, dir_a.path(), dir_b.path(), "emb");
}

TEST_CASE("a table that does not prefetch gets cold rows written down between its calls",
          "[tiers][host_tier]") {
  if (!host_tier_policy()) return;
  TierDir tier;
  StoreGuard plain_store(tier_store(nullptr));
  StoreGuard tiered_store(tier_store(tier.path().c_str()));
  embstore_table_t* plain = make_table(plain_store, tier_config("emb", kDim, 0));
  embstore_table_t* t = make_table(tiered_store, tier_config("emb", kDim, 64));
  const std::vector<int64_t> full = keys_from(0, 64), fresh = keys_from(1000, 8);
  for (embstore_table_t* table : {plain, t}) {
    lookup_ok(table, full);  // 64 of 64 rows in memory
    apply_ok(table, full, std::vector<float>(full.size() * kDim, 0.5f));
  }
  // Rows of this call and the one before stay: the update's rows are spared here.
  lookup_ok(t, {full[0]}, 0);
  REQUIRE(stats(t).rows_moved_down == 0);
  SECTION("a write-back ahead of the call that needs the room") {
    {
      WriterThreads writers;
      // Fewer than a sixteenth of the frames free, and rows not used by this call or the one
      // before: an eighth of the budget goes down in the background.
      lookup_ok(t, {full[1]}, 0);
      embstore_table_stats_t s = stats(t);
      REQUIRE(s.rows_moved_down == 0);  // counted when a call finishes the move
      REQUIRE(s.rows_in_memory == 64);
      // Eight new rows: the write-back's frames are all they need.
      lookup_ok(t, fresh);
      lookup_ok(plain, fresh);
      s = stats(t);
      REQUIRE(s.rows_moved_down == 8);
      REQUIRE(s.rows_in_memory == 64);
      REQUIRE(writers.any());
      REQUIRE_FALSE(writers.this_thread_wrote());
    }
    REQUIRE(same_bits(lookup_ok(t, full, 0), lookup_ok(plain, full, 0)));  // the 8 come back
  }
  SECTION("a call that needs rows of a write-back keeps them in memory") {
    lookup_ok(t, {full[1]}, 0);  // the write-back of 8 rows of full starts
    const embstore_table_stats_t before = stats(t);
    // Every row of full: the 8 stay where they are, nothing is read back.
    REQUIRE(same_bits(lookup_ok(t, full, 0), lookup_ok(plain, full, 0)));
    const embstore_table_stats_t s = stats(t);
    REQUIRE(s.tier_bytes_written > 0);  // the write-back was written
    REQUIRE(s.rows_moved_down == 0);    // and dropped
    REQUIRE(s.rows_moved_up == 0);
    REQUIRE(s.tier_bytes_read == before.tier_bytes_read);
    REQUIRE(s.rows_in_memory == 64);
  }
  SECTION("none for a table that prefetches: its prefetches make its room") {
    WriterThreads writers;
    ok(embstore_prefetch(t, full.data(), 1, nullptr));  // a row in memory: nothing to read
    lookup_ok(t, {full[1]}, 0);
    lookup_ok(t, {full[2]}, 0);
    REQUIRE_FALSE(writers.any());
    lookup_ok(t, fresh);  // makes its room itself
    lookup_ok(plain, fresh);
    REQUIRE(writers.this_thread_wrote());
    REQUIRE(stats(t).rows_moved_down == 8 + 8);  // what the call needs and an eighth beyond
  }
  std::vector<int64_t> all = full;
  all.insert(all.end(), fresh.begin(), fresh.end());
  REQUIRE(same_bits(lookup_ok(t, all, 0), lookup_ok(plain, all, 0)));
}

}  // namespace
}  // namespace embstore_test::tiers
