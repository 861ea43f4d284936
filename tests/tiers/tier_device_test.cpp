// The CUDA backend's device tier: the rows beyond a table's device_rows live in mapped host
// memory, which its kernels read and write over the bus. A table with a device budget trains bit
// for bit as one without, at budgets down to one row; its stats count the rows in each tier; its
// checkpoints equal its untiered twin's, copy-on-write from host memory included, and restore
// across. embstore_prefetch moves a batch's rows in host memory up, each trading places with a
// device row idle for two steps, never with rows of a checkpoint in flight. The host backend
// ignores device_rows: the same cases hold there with every row in memory and nothing moved.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "tests/tiers/tier_fixtures.hpp"

namespace embstore_test::tiers {
namespace {

embstore_table_config_t device_config(const char* name, uint32_t dim, uint64_t device_rows,
                                      embstore_optimizer_t opt = EMBSTORE_OPT_ADAGRAD) {
  embstore_table_config_t c = tier_config(name, dim, 0, opt);
  c.device_rows = device_rows;
  return c;
}

// The rows of each tier of a table whose device budget is `budget` (0: none). On CUDA the
// arena's first `budget` row ids are in device memory: without eviction, exactly the first
// budget rows created; evicted rows among them wait on the free list, counted nowhere.
void require_rows_per_tier(embstore_table_t* t, uint64_t budget, bool evicts) {
  const embstore_table_stats_t s = stats(t);
  INFO("rows " << s.rows << ", in device " << s.rows_in_device << ", in memory "
               << s.rows_in_memory);
  REQUIRE(s.rows_on_disk == 0);
  if (backend() != EMBSTORE_BACKEND_CUDA) {
    REQUIRE(s.rows_in_device == 0);
    REQUIRE(s.rows_in_memory == s.rows);
    return;
  }
  REQUIRE(s.rows_in_device + s.rows_in_memory == s.rows);
  if (budget == 0) {
    REQUIRE(s.rows_in_memory == 0);
  } else if (evicts) {
    REQUIRE(s.rows_in_device <= budget);
  } else {
    REQUIRE(s.rows_in_device == std::min(budget, s.rows));
  }
}

TEST_CASE("a table with a device budget trains bit for bit as one without, down to one row",
          "[tiers][device]") {
  const TrainCase c = GENERATE(
      TrainCase{1, EMBSTORE_OPT_ADAGRAD, 1, 0}, TrainCase{7, EMBSTORE_OPT_ADAM, 1, 0},
      TrainCase{64, EMBSTORE_OPT_SGD, 1, 0}, TrainCase{100, EMBSTORE_OPT_ROWWISE_ADAGRAD, 2, 0},
      TrainCase{300, EMBSTORE_OPT_ADAGRAD, 1, 3}, TrainCase{40, EMBSTORE_OPT_ADAGRAD, 1, 0, 400},
      TrainCase{5000, EMBSTORE_OPT_ADAGRAD, 1, 0});
  const bool prefetch_next = GENERATE(false, true);  // trades the next batch's rows up
  INFO("device_rows: " << c << ", prefetch " << prefetch_next);
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(nullptr));
  const embstore_table_config_t ca = c.untiered_config();
  embstore_table_config_t cb = ca;
  cb.device_rows = c.budget;
  Twins twins{a, b, make_table(a, ca), make_table(b, cb), prefetch_next};
  const int64_t keys = 1000;
  for (uint64_t s = 1; s <= 12; ++s) {
    twins.step(s, keys, 200);
    if (s % 4 == 0) require_rows_per_tier(twins.tiered, c.budget, c.evicts());
  }
  const embstore_table_stats_t sa = stats(twins.plain);
  const embstore_table_stats_t sb = stats(twins.tiered);
  REQUIRE(sa.rows == sb.rows);
  REQUIRE(sb.rows > 300);  // every budget but the largest leaves rows in host memory
  REQUIRE(sa.dirty_rows == sb.dirty_rows);
  REQUIRE(sa.evicted == sb.evicted);
  REQUIRE(sa.pending_admission == sb.pending_admission);
  REQUIRE(sa.admitted == sb.admitted);
  REQUIRE(sb.rows_moved_down == sb.rows_moved_up);  // trades: one row each way
  if (!prefetch_next || backend() != EMBSTORE_BACKEND_CUDA) {
    REQUIRE(sb.rows_moved_up == 0);
  } else if (c.budget >= 7 && c.budget < sb.rows) {
    // Some of 11 prefetches found idle device rows (a single device row may stay busy).
    REQUIRE(sb.rows_moved_up > 0);
  }
  if (c.evicts()) REQUIRE(sb.evicted > 0);
  require_rows_per_tier(twins.plain, 0, c.evicts());
  require_rows_per_tier(twins.tiered, c.budget, c.evicts());
  const std::vector<int64_t> all = key_range(keys + 40);
  REQUIRE(same_bits(lookup_ok(twins.plain, all, 0), lookup_ok(twins.tiered, all, 0)));
  require_same_checkpoint(a, b, dir_a.path(), dir_b.path(), "emb");
}

TEST_CASE("checkpoints of a table with a device budget equal its twin's and restore across",
          "[tiers][device][checkpoint]") {
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(nullptr));
  no_rebaseline(a);
  no_rebaseline(b);
  const uint64_t budget = GENERATE(1, 100);
  INFO("device_rows " << budget);
  Twins twins{a, b, make_table(a, device_config("emb", 8, 0)),
              make_table(b, device_config("emb", 8, budget))};
  for (uint64_t s = 1; s <= 3; ++s) twins.step(s, 600, 150);
  REQUIRE(checkpoint_ok(a, dir_a.path()) == checkpoint_ok(b, dir_b.path()));
  for (uint64_t s = 4; s <= 6; ++s) {
    twins.step(s, 600, 40);
    REQUIRE(incremental_ok(a, dir_a.path()) == s);
    REQUIRE(incremental_ok(b, dir_b.path()) == s);
  }
  const std::vector<int64_t> all = key_range(600);
  const std::vector<float> want = lookup_ok(twins.plain, all, 0);
  // The tiered chain into a store without a budget, and the untiered chain into a table with one.
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), 6) == 6);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), want));
  require_rows_per_tier(get_table(c, "emb"), 0, false);
  StoreGuard d(tier_store(nullptr));
  make_table(d, device_config("emb", 8, budget));  // restore keeps the table's budget
  REQUIRE(restore_ok(d, dir_a.path(), 6) == 6);
  embstore_table_t* restored = get_table(d, "emb");
  REQUIRE(same_bits(lookup_ok(restored, all, 0), want));
  REQUIRE(stats(restored).rows == stats(twins.plain).rows);
  require_rows_per_tier(restored, budget, false);
  Twins after{a, d, twins.plain, restored};
  for (uint64_t step = 7; step <= 9; ++step) after.step(step, 600, 100);
}

TEST_CASE("rows in host memory captured by a checkpoint in flight are copied before an update",
          "[tiers][device][checkpoint]") {
  TempDir dir_a, dir_b;
  // A staging ring of 1 MiB: most of the 6000 rows stay captured while the writer is held.
  StoreGuard a(tier_store(nullptr, size_t{1} << 20));
  StoreGuard b(tier_store(nullptr, size_t{1} << 20));
  no_rebaseline(a);
  no_rebaseline(b);
  Twins twins{a, b, make_table(a, device_config("emb", 64, 0)),
              make_table(b, device_config("emb", 64, 500))};
  const int64_t keys = 6000;
  const std::vector<int64_t> all = key_range(keys);
  lookup_ok(twins.plain, all);
  lookup_ok(twins.tiered, all);
  for (uint64_t s = 1; s <= 2; ++s) twins.step(s, keys, 3000);
  const std::vector<float> at_capture = lookup_ok(twins.plain, all, 0);
  uint64_t va = 0, vb = 0;
  {
    // On CUDA held for up to 8 s, so that the first update meets captured rows in host memory
    // while the writer waits (an update whose copies fill staging waits for the writer).
    HeldCheckpointWriter held(backend() == EMBSTORE_BACKEND_CUDA ? std::chrono::seconds(8)
                                                                 : std::chrono::seconds(2));
    ok(embstore_checkpoint(b, dir_b.path().c_str(), EMBSTORE_CKPT_FULL, &vb));
    held.wait_held();  // b's writer: the table's snapshot waits, its rows captured
    ok(embstore_checkpoint(a, dir_a.path().c_str(), EMBSTORE_CKPT_FULL, &va));
    REQUIRE(va == vb);
    for (uint64_t s = va + 1; s <= va + 3; ++s) twins.step(s, keys, 1500);
    held.release();
  }
  ok(embstore_checkpoint_wait(a, va));
  ok(embstore_checkpoint_wait(b, vb));
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(b, &cs));
  // The copies from host memory are what this case is for, on CUDA. On the host backend
  // (device_rows ignored) whether an update or the drain takes a captured row first is a
  // matter of timing: under ASan the drain took them all (no copy), so it is not required.
  if (backend() == EMBSTORE_BACKEND_CUDA) REQUIRE(cs.copy_on_write_rows > 0);
  const std::string file = "/" + row_file("emb");
  REQUIRE(read_rows(version_dir(dir_a.path(), va) + file) ==
          read_rows(version_dir(dir_b.path(), vb) + file));
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), vb) == vb);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), at_capture));
}

// About 1700 of the keys [-1000, 1000) inserted and trained at step 1; then a hot set, keys
// [900, 950), trained alone at steps 2 to 5 on both twins. Returns the hot keys.
std::vector<int64_t> train_hot_set(Twins& twins) {
  twins.step(1, 2000, 4000);  // step_batch's keys: [-1000, 1000)
  const std::vector<int64_t> hot = keys_from(900, 50);
  const std::vector<float> grads(hot.size() * embstore_table_dim(twins.plain), 0.125f);
  for (uint64_t s = 2; s <= 5; ++s) {
    REQUIRE(same_bits(lookup_ok(twins.plain, hot), lookup_ok(twins.tiered, hot)));
    apply_ok(twins.plain, hot, grads);
    apply_ok(twins.tiered, hot, grads);
    ok(embstore_step(twins.plain_store, s));
    ok(embstore_step(twins.tiered_store, s));
  }
  return hot;
}

TEST_CASE("a prefetch moves a batch's rows in host memory up to the device, trading with idle rows",
          "[tiers][device]") {
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(nullptr));
  const uint64_t budget = 128;
  Twins twins{a, b, make_table(a, device_config("emb", 8, 0)),
              make_table(b, device_config("emb", 8, budget))};
  const std::vector<int64_t> hot = train_hot_set(twins);
  const embstore_table_stats_t before = stats(twins.tiered);
  REQUIRE(before.rows_moved_up == 0);
  prefetch_ok(twins.tiered, hot);
  const embstore_table_stats_t after = stats(twins.tiered);
  require_rows_per_tier(twins.tiered, budget, false);
  if (backend() == EMBSTORE_BACKEND_CUDA) {
    // With about 1700 rows and 128 on the device, most of the 50 hot rows start in host memory;
    // the 78 or more device rows idle since step 1 make room for all of them.
    REQUIRE(after.rows_moved_up > 0);
    REQUIRE(after.rows_moved_up <= hot.size());
    REQUIRE(after.rows_moved_down == after.rows_moved_up);
    // All of them are on the device now: a second prefetch has nothing to move.
    prefetch_ok(twins.tiered, hot);
    REQUIRE(stats(twins.tiered).rows_moved_up == after.rows_moved_up);
  } else {
    REQUIRE(after.rows_moved_up == 0);  // device_rows ignored: no tiers
  }
  // The rows moved are the same rows: training goes on bit for bit, and checkpoints agree.
  for (uint64_t s = 6; s <= 9; ++s) twins.step(s, 2000, 500);
  const std::vector<int64_t> all = key_range(2000);
  REQUIRE(same_bits(lookup_ok(twins.plain, all, 0), lookup_ok(twins.tiered, all, 0)));
  TempDir dir_a, dir_b;
  require_same_checkpoint(a, b, dir_a.path(), dir_b.path(), "emb");
}

TEST_CASE("a prefetch moves no row of a checkpoint in flight, and moves them once it is written",
          "[tiers][device][checkpoint]") {
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr, size_t{1} << 20));
  StoreGuard b(tier_store(nullptr, size_t{1} << 20));
  no_rebaseline(a);
  no_rebaseline(b);
  const uint64_t budget = 128;
  Twins twins{a, b, make_table(a, device_config("emb", 64, 0)),
              make_table(b, device_config("emb", 64, budget))};
  const std::vector<int64_t> hot = train_hot_set(twins);
  const std::vector<int64_t> all = key_range(2000);
  uint64_t va = 0, vb = 0;
  {
    HeldCheckpointWriter held;
    ok(embstore_checkpoint(b, dir_b.path().c_str(), EMBSTORE_CKPT_FULL, &vb));
    held.wait_held();  // every row captured, most not yet written
    prefetch_ok(twins.tiered, hot);
    REQUIRE(stats(twins.tiered).rows_moved_up == 0);
    ok(embstore_checkpoint(a, dir_a.path().c_str(), EMBSTORE_CKPT_FULL, &va));
    REQUIRE(va == vb);
    held.release();
  }
  ok(embstore_checkpoint_wait(a, va));
  ok(embstore_checkpoint_wait(b, vb));
  const std::string file = "/" + row_file("emb");
  REQUIRE(read_rows(version_dir(dir_a.path(), va) + file) ==
          read_rows(version_dir(dir_b.path(), vb) + file));
  // Rows made dirty (steps 6 and 7, over both tiers), then traded: hot rows in host memory,
  // some of them dirty, with device rows idle since step 5, all clean. Their dirty bits go with
  // them, so the delta holds the rows the twin's holds (without, it would hold the idle rows'
  // keys instead of the hot ones').
  for (uint64_t s = 6; s <= 7; ++s) twins.step(s, 2000, 300);
  prefetch_ok(twins.tiered, hot);
  if (backend() == EMBSTORE_BACKEND_CUDA) REQUIRE(stats(twins.tiered).rows_moved_up > 0);
  REQUIRE(stats(twins.tiered).dirty_rows == stats(twins.plain).dirty_rows);
  twins.step(8, 2000, 300);
  REQUIRE(incremental_ok(a, dir_a.path()) == 8);
  REQUIRE(incremental_ok(b, dir_b.path()) == 8);
  REQUIRE(read_rows(delta_dir(dir_a.path(), 8) + file) ==
          read_rows(delta_dir(dir_b.path(), 8) + file));
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), 8) == 8);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), lookup_ok(twins.plain, all, 0)));
}

TEST_CASE("rows of an incremental checkpoint in flight keep their ids while others trade",
          "[tiers][device][checkpoint]") {
  TempDir dir_a, dir_b;
  StoreGuard a(tier_store(nullptr));
  StoreGuard b(tier_store(nullptr));
  no_rebaseline(a);
  no_rebaseline(b);
  Twins twins{a, b, make_table(a, device_config("emb", 64, 0)),
              make_table(b, device_config("emb", 64, 128))};
  const std::vector<int64_t> hot = train_hot_set(twins);
  REQUIRE(checkpoint_ok(a, dir_a.path()) == checkpoint_ok(b, dir_b.path()));
  for (uint64_t s = 6; s <= 7; ++s) twins.step(s, 2000, 300);  // the delta's rows
  // Another set of keys, mostly in host memory and mostly not in the delta, to bring up while
  // it is in flight; the hot set trains meanwhile, so that the delta's rows (untouched since
  // step 7) are idle and would be chosen to move down but for the snapshot. Both deltas then
  // fail, and each table marks the rows of its set dirty again by id: had a row of the set
  // traded, another key would be marked, and the next deltas would differ.
  const std::vector<int64_t> warm = keys_from(-1000, 50);
  const std::vector<float> grads(hot.size() * 64, 0.0625f);
  const uint64_t moved_before = stats(twins.tiered).rows_moved_up;
  {
    HeldCheckpointWriter writers(std::chrono::seconds(30), HeldCheckpointWriter::Then::kFail);
    uint64_t vb = 0, va = 0;
    ok(embstore_checkpoint(b, dir_b.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &vb));
    writers.wait_held();
    for (uint64_t s = 8; s <= 9; ++s) {
      REQUIRE(same_bits(lookup_ok(twins.plain, hot), lookup_ok(twins.tiered, hot)));
      apply_ok(twins.plain, hot, grads);
      apply_ok(twins.tiered, hot, grads);
      ok(embstore_step(a, s));
      ok(embstore_step(b, s));
    }
    prefetch_ok(twins.tiered, warm);
    if (backend() == EMBSTORE_BACKEND_CUDA) {
      REQUIRE(stats(twins.tiered).rows_moved_up > moved_before);
    }
    writers.release();
    require_status(embstore_checkpoint_wait(b, vb), EMBSTORE_IO_ERROR, "");
    ok(embstore_checkpoint(a, dir_a.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &va));
    require_status(embstore_checkpoint_wait(a, va), EMBSTORE_IO_ERROR, "");
  }
  REQUIRE(stats(twins.tiered).dirty_rows == stats(twins.plain).dirty_rows);
  twins.step(10, 2000, 300);
  REQUIRE(incremental_ok(a, dir_a.path()) == 10);
  REQUIRE(incremental_ok(b, dir_b.path()) == 10);
  const std::string file = "/" + row_file("emb");
  REQUIRE(read_rows(delta_dir(dir_a.path(), 10) + file) ==
          read_rows(delta_dir(dir_b.path(), 10) + file));
  StoreGuard c(tier_store(nullptr));
  REQUIRE(restore_ok(c, dir_b.path(), 10) == 10);
  const std::vector<int64_t> all = key_range(2000);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), lookup_ok(twins.plain, all, 0)));
}

}  // namespace
}  // namespace embstore_test::tiers
