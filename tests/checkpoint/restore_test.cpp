// Restore on each backend: the same rows whatever the number of host threads (the copies run
// in parallel, rows keep the ids a serial load gives), and a restore that fails half-way (a
// corrupt block in the last file read, memory refused, a table that does not fit) leaves the
// store exactly as it was.
#include <linux/magic.h>
#include <sys/vfs.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <thread>

#include "host/backend/host_buffer.hpp"
#include "tests/checkpoint/checkpoint_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

namespace {

constexpr int64_t kKeys = 40000;  // rows spread over several blocks and thread parts

// A chain in dir: a full checkpoint of kKeys rows (version 1), then three deltas that train a
// quarter of the keys while the idle rule evicts the others (tombstones); returns the source's
// rows at the newest version, for every key, and its row count (and the same for version 1).
std::vector<float> write_chain(const std::string& dir, uint64_t* rows,
                               std::vector<float>* at_full = nullptr) {
  StoreGuard store(make_store());
  embstore_table_config_t config = config_for("emb", 8, EMBSTORE_OPT_ADAGRAD);
  config.evict_idle_steps = 2;
  embstore_table_t* t = make_table(store, config);
  // A second table, restored before "emb" (tables load in name order).
  embstore_table_t* first = make_table(store, config_for("aaa", 4, EMBSTORE_OPT_SGD));
  lookup_ok(first, key_range(100));
  no_rebaseline(store);
  const std::vector<int64_t> all = key_range(kKeys);
  lookup_ok(t, all);
  apply_ok(t, all, std::vector<float>(all.size() * 8, 0.125f));
  ok(embstore_step(store, 1));
  REQUIRE(incremental_ok(store, dir) == 1);
  if (at_full != nullptr) *at_full = lookup_ok(t, all, 0);
  for (uint64_t s = 2; s <= 4; ++s) {
    train_step(store, t, s, kKeys / 4, 2048);
    REQUIRE(incremental_ok(store, dir) == s);
  }
  REQUIRE(stats(t).evicted > 0);  // by the idle rule at embstore_step: the deltas hold tombstones
  *rows = stats(t).rows;
  return lookup_ok(t, all, 0);
}

// A store that parks the tables a restore replaces (restore_spill), or not.
embstore_store_t* store_spilling(embstore_spill_t spill, const char* spill_dir = nullptr) {
  embstore_store_config_t config;
  embstore_store_config_init(&config);
  config.restore_spill = spill;
  config.spill_dir = spill_dir;
  return make_store(config);
}

}  // namespace

TEST_CASE("a restore with many host threads equals one with one thread", "[checkpoint][restore]") {
  TempDir dir;
  uint64_t rows = 0;
  std::vector<float> at_full;
  const std::vector<float> expected = write_chain(dir.path(), &rows, &at_full);
  const std::vector<int64_t> all = key_range(kKeys);
  for (const int threads : {1, 4}) {
    INFO("host_threads " << threads);
    StoreGuard b(make_store(threads));
    REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 4);
    embstore_table_t* tb = get_table(b, "emb");
    REQUIRE(stats(tb).rows == rows);
    REQUIRE(same_bits(lookup_ok(tb, all, 0), expected));
    // The full alone: whole blocks of new keys, which the threads insert in parallel.
    StoreGuard c(make_store(threads));
    REQUIRE(restore_ok(c, dir.path(), 1) == 1);
    REQUIRE(stats(get_table(c, "emb")).rows == kKeys);
    REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), at_full));
  }
}

TEST_CASE("a restore that fails half-way leaves the store as it was", "[checkpoint][restore]") {
  // Each way: the replaced tables kept in memory, or parked in a spill file and read back.
  const embstore_spill_t spill = GENERATE(EMBSTORE_SPILL_NEVER, EMBSTORE_SPILL_ALWAYS);
  INFO("restore_spill " << spill);
  TempDir dir;
  uint64_t rows = 0;
  write_chain(dir.path(), &rows);
  // The store to restore into: the table with rows of its own, and a second table.
  StoreGuard b(store_spilling(spill, dir.path().c_str()));
  embstore_table_t* tb = make_table(b, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  embstore_table_t* other = make_table(b, config_for("other", 4, EMBSTORE_OPT_SGD));
  const std::vector<int64_t> mine = {kKeys * 10, kKeys * 10 + 1, 7};
  lookup_ok(tb, mine);
  lookup_ok(other, mine);
  ok(embstore_step(b, 99));
  const std::vector<float> before = lookup_ok(tb, mine, 0);
  const std::vector<float> other_before = lookup_ok(other, mine, 0);
  auto unchanged = [&] {
    embstore_table_t* none = nullptr;
    REQUIRE(embstore_table_get(b, "aaa", &none) == EMBSTORE_NOT_FOUND);  // no table added
    REQUIRE(get_table(b, "emb") == tb);
    REQUIRE(stats(tb).rows == mine.size());
    REQUIRE(same_bits(lookup_ok(tb, mine, 0), before));
    REQUIRE(same_bits(lookup_ok(other, mine, 0), other_before));
    REQUIRE(lookup_ok(tb, {0}, 0) == std::vector<float>(8, 0.0f));  // no restored row leaked
  };

  SECTION("a corrupt block at the end of the last file read (the full's)") {
    // The chain loads newest first, so the full checkpoint's file comes last: a byte of one of
    // its last blocks.
    const std::string file = table_file(dir.path(), 1, "emb");
    const uint64_t size = fs::file_size(file);
    flip_byte(file, size - 4096 - 1);
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT,
                   file.substr(dir.path().size()).c_str());
    unchanged();
  }
  SECTION("memory refused at each allocation of the host tables' memory in turn") {
    if (backend() != EMBSTORE_BACKEND_HOST) {
      WARN("host memory faults are injected on the host backend only");
      return;
    }
    // Allocation n fails (n = 1, 2, ...): the tables' construction, reserve, growth. The
    // restore with no allocation left to fail succeeds.
    int failed = 0;
    bool restored = false;
    for (int n = 1; n <= 64 && !restored; ++n) {
      INFO("allocation " << n);
      int seen = 0;
      bool fired = false;
      embstore::set_host_alloc_fault([&](size_t) {
        fired = ++seen == n;
        return fired;
      });
      uint64_t v = 0;
      const embstore_status_t st = embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v);
      embstore::set_host_alloc_fault({});
      if (!fired) {
        REQUIRE(st == EMBSTORE_OK);
        REQUIRE(v == 4);
        REQUIRE(stats(get_table(b, "emb")).rows == rows);
        restored = true;
        break;
      }
      ++failed;
      require_status(st, EMBSTORE_OUT_OF_MEMORY);
      unchanged();
    }
    REQUIRE(restored);     // once no allocation was left to fail
    REQUIRE(failed >= 4);  // two tables, each built and then reserved at least
  }
  SECTION("a table that does not fit, after the one that did") {
    // "aaa" loads; then "emb" exists with a row limit its rows pass: its load fails when the
    // table is nearly full, after every delta has loaded.
    StoreGuard c(store_spilling(spill, dir.path().c_str()));
    embstore_table_t* ta = make_table(c, config_for("aaa", 4, EMBSTORE_OPT_SGD));
    const std::vector<int64_t> a_keys = {kKeys * 20};
    lookup_ok(ta, a_keys);
    const std::vector<float> a_before = lookup_ok(ta, a_keys, 0);
    embstore_table_config_t small = config_for("emb", 8, EMBSTORE_OPT_ADAGRAD);
    small.max_capacity = rows - 1;
    embstore_table_t* tc = make_table(c, small);
    lookup_ok(tc, mine);
    const std::vector<float> c_before = lookup_ok(tc, mine, 0);
    uint64_t v = 0;
    require_status(embstore_restore(c, dir.path().c_str(), EMBSTORE_LATEST, &v),
                   EMBSTORE_CAPACITY_EXCEEDED, "max_capacity");
    REQUIRE(get_table(c, "aaa") == ta);
    REQUIRE(stats(ta).rows == 1);
    REQUIRE(same_bits(lookup_ok(ta, a_keys, 0), a_before));
    REQUIRE(get_table(c, "emb") == tc);
    REQUIRE(stats(tc).rows == mine.size());
    REQUIRE(same_bits(lookup_ok(tc, mine, 0), c_before));
    unchanged();  // and the first store was never touched
  }
}

TEST_CASE("a restore that parks the tables it replaces gives the same rows, or none on failure",
          "[checkpoint][restore]") {
  TempDir dir;
  uint64_t rows = 0;
  const std::vector<float> expected = write_chain(dir.path(), &rows);
  const std::vector<int64_t> all = key_range(kKeys);
  // The tables replaced hold many rows of their own (several arena chunks), some evicted.
  StoreGuard b(store_spilling(EMBSTORE_SPILL_ALWAYS, dir.path().c_str()));
  embstore_table_config_t config = config_for("emb", 8, EMBSTORE_OPT_ADAGRAD);
  config.evict_idle_steps = 2;
  embstore_table_t* tb = make_table(b, config);
  embstore_table_t* ta = make_table(b, config_for("aaa", 4, EMBSTORE_OPT_SGD));
  std::vector<int64_t> mine(3 * kKeys);
  for (size_t i = 0; i < mine.size(); ++i) mine[i] = 1'000'000 + static_cast<int64_t>(i) * 7;
  lookup_ok(tb, mine);
  lookup_ok(ta, mine);
  apply_ok(tb, mine, std::vector<float>(mine.size() * 8, 0.25f));
  ok(embstore_step(b, 1));
  const std::vector<int64_t> kept(mine.begin(), mine.begin() + kKeys * 2);
  apply_ok(tb, kept, std::vector<float>(kept.size() * 8, 0.5f));  // touched at step 1
  train_step(b, tb, 3, kKeys, 4096);  // step 3 evicts the rows last touched at step 0
  REQUIRE(stats(tb).evicted > 0);
  REQUIRE(stats(tb).rows > kept.size());
  const std::vector<int64_t> probe = [&] {
    std::vector<int64_t> k = mine;
    k.insert(k.end(), all.begin(), all.end());
    return k;
  }();
  const std::vector<float> b_before = lookup_ok(tb, probe, 0);
  const std::vector<float> a_before = lookup_ok(ta, mine, 0);
  const uint64_t b_rows = stats(tb).rows;

  SECTION("a corrupt block: the parked tables are read back exactly") {
    flip_byte(table_file(dir.path(), 1, "emb"), 4096 + 100);
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT);
    REQUIRE(get_table(b, "emb") == tb);
    REQUIRE(stats(tb).rows == b_rows);
    REQUIRE(same_bits(lookup_ok(tb, probe, 0), b_before));
    REQUIRE(same_bits(lookup_ok(ta, mine, 0), a_before));
    // And they train on.
    apply_ok(tb, mine, std::vector<float>(mine.size() * 8, 0.5f));
  }
  SECTION("the restore succeeds: the rows of a restore into an empty store") {
    REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 4);
    REQUIRE(get_table(b, "emb") == tb);  // the handle stays valid
    REQUIRE(stats(tb).rows == rows);
    REQUIRE(same_bits(lookup_ok(tb, all, 0), expected));
    REQUIRE(stats(ta).rows == 100);                                       // "aaa" of the checkpoint
    REQUIRE(lookup_ok(tb, {mine[0]}, 0) == std::vector<float>(8, 0.0f));  // mine are gone
  }
}

TEST_CASE("restore_spill decides whether a restore needs a spill file", "[checkpoint][restore]") {
  TempDir dir;
  uint64_t rows = 0;
  const std::vector<float> expected = write_chain(dir.path(), &rows);
  const std::string nowhere = dir.path() + "/no-such-dir";
  auto store_with_emb = [&](embstore_spill_t spill) {
    embstore_store_t* s = store_spilling(spill, nowhere.c_str());
    lookup_ok(make_table(s, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD)), {1, 2, 3});
    return s;
  };
  SECTION("ALWAYS: the spill file cannot be made, and nothing changed") {
    StoreGuard b(store_with_emb(EMBSTORE_SPILL_ALWAYS));
    if (backend() != EMBSTORE_BACKEND_HOST) {  // device tables never spill
      REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 4);
      return;
    }
    const std::vector<float> before = lookup_ok(get_table(b, "emb"), {1, 2, 3}, 0);
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_IO_ERROR,
                   "spill_dir");
    REQUIRE(stats(get_table(b, "emb")).rows == 3);
    REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), {1, 2, 3}, 0), before));
  }
  SECTION("ALWAYS into tmpfs: refused, parking there would free nothing") {
    struct statfs fs {};
    if (backend() != EMBSTORE_BACKEND_HOST || ::statfs("/dev/shm", &fs) != 0 ||
        fs.f_type != TMPFS_MAGIC) {
      WARN("no tmpfs at /dev/shm, or not the host backend");
      return;
    }
    StoreGuard b(store_spilling(EMBSTORE_SPILL_ALWAYS, "/dev/shm"));
    lookup_ok(make_table(b, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD)), {1, 2, 3});
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_IO_ERROR,
                   "tmpfs");
    REQUIRE(stats(get_table(b, "emb")).rows == 3);
  }
  SECTION("NEVER, and AUTO with memory to spare, need none") {
    for (const embstore_spill_t spill : {EMBSTORE_SPILL_NEVER, EMBSTORE_SPILL_AUTO}) {
      StoreGuard b(store_with_emb(spill));
      REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 4);
      REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), key_range(kKeys), 0), expected));
    }
  }
  SECTION("a store with no table to replace needs none") {
    StoreGuard b(store_spilling(EMBSTORE_SPILL_ALWAYS, nowhere.c_str()));
    REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 4);
  }
}

TEST_CASE("restore and warm start never replace tables under calls on other threads",
          "[checkpoint][restore]") {
  // They replace the store's tables: a lookup on another thread used to read a freed index.
  // Now either side that finds the other running returns BUSY.
  if (backend() != EMBSTORE_BACKEND_HOST) {
    WARN("host backend only: the gate is the C API's, the same on CUDA");
    return;
  }
  TempDir dir;
  uint64_t rows = 0;
  write_chain(dir.path(), &rows);
  StoreGuard store(make_store());
  restore_ok(store, dir.path(), EMBSTORE_LATEST);
  embstore_table_t* t = get_table(store, "emb");
  const std::vector<int64_t> keys = key_range(2000);

  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0}, busy_calls{0}, other{0};
  std::thread caller([&] {
    std::vector<float> out(keys.size() * 8), grads(keys.size() * 8, 0.01f);
    embstore_table_stats_t s;
    s.struct_size = sizeof(s);
    for (uint64_t round = 0; !stop.load(); ++round) {
      // Now and then a pause, so that restores get through on a machine of one or two cores.
      if (round % 8 == 7) std::this_thread::sleep_for(std::chrono::microseconds(500));
      for (const embstore_status_t st :
           {embstore_lookup(t, keys.data(), keys.size(), out.data(), EMBSTORE_LOOKUP_INSERT,
                            nullptr),
            embstore_apply_gradients(t, keys.data(), grads.data(), keys.size(), nullptr),
            embstore_table_stats(t, &s)}) {
        ++calls;
        if (st == EMBSTORE_BUSY) {
          ++busy_calls;
        } else if (st != EMBSTORE_OK) {
          ++other;
        }
      }
    }
  });
  uint64_t restores = 0, busy_restores = 0;
  embstore_warm_start_source_t source;
  embstore_warm_start_source_init(&source);
  source.dir = dir.path().c_str();
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < until) {
    uint64_t v = 0;
    for (const embstore_status_t st : {embstore_restore(store, dir.path().c_str(), 2, &v),
                                       embstore_warm_start(store, &source, 1)}) {
      ++restores;
      if (st == EMBSTORE_BUSY) {
        if (busy_restores++ == 0) {
          REQUIRE(std::string(embstore_last_error()).find("other threads") != std::string::npos);
        }
      } else if (st != EMBSTORE_OK) {
        ok(st);  // fails, saying why
      }
    }
  }
  stop = true;
  caller.join();
  CAPTURE(restores, busy_restores, calls.load(), busy_calls.load());
  REQUIRE(other.load() == 0);
  REQUIRE(busy_restores + busy_calls.load() > 0);  // they met
  REQUIRE(busy_restores < restores);               // and each side also got through
  REQUIRE(busy_calls.load() < calls.load());
  // Alone again, everything works.
  restore_ok(store, dir.path(), EMBSTORE_LATEST);
  REQUIRE(stats(get_table(store, "emb")).rows == rows);
}
