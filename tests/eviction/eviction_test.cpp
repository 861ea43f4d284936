// Eviction through the C API: by idle steps, by idle time (an injected clock), at
// max_capacity (least recently used first); rows reused after eviction; tombstones in
// incremental checkpoints, restored; a captured row evicted before it is written; and restore of
// every version of a chain with evictions against the state training had at that version.
// Links embstore_static for the store's clock and the io/ fault hook. Runs on each backend
// (the "cuda:" variants where a device is usable).
#include <embstore/embstore.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "host/store/store.hpp"
#include "io/format/chain.hpp"
#include "io/format/layout.hpp"
#include "io/format/row_file.hpp"
#include "support/backend.hpp"
#include "support/checkpoint_helpers.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_test;

namespace {

void ok(embstore_status_t s) { require_ok(s); }

embstore_table_config_t config(const char* name, uint32_t dim = 4) {
  embstore_table_config_t c = table_config(name, dim);
  c.init = EMBSTORE_INIT_UNIFORM;
  c.init_a = -0.5f;
  c.init_b = 0.5f;
  c.learning_rate = 0.1f;
  c.initial_capacity = 64;
  return c;
}

std::vector<float> ones(size_t keys, uint32_t dim) { return std::vector<float>(keys * dim, 1.0f); }

// Keys of `keys` that have a row: a lookup without insert reads a row's value, zeros otherwise
// (every value of these tables' rows is nonzero: uniform in [-0.5, 0.5), then trained).
std::vector<int64_t> present(embstore_table_t* t, const std::vector<int64_t>& keys) {
  const uint32_t dim = embstore_table_dim(t);
  const std::vector<float> v = lookup_ok(t, keys, 0);
  std::vector<int64_t> out;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (std::any_of(v.begin() + i * dim, v.begin() + (i + 1) * dim, [](float x) { return x != 0; }))
      out.push_back(keys[i]);
  }
  return out;
}

// Steps the store to s, then trains keys (insert and one gradient of ones).
void touch(embstore_store_t* store, embstore_table_t* t, uint64_t s,
           const std::vector<int64_t>& keys) {
  ok(embstore_step(store, s));
  if (keys.empty()) return;
  lookup_ok(t, keys);
  apply_ok(t, keys, ones(keys.size(), embstore_table_dim(t)));
}

// The store's clock, replaced for the test.
struct FakeClock {
  double now = 1000.0;
  explicit FakeClock(embstore_store_t* store) {
    store->idle_clock.set_source([this] { return now; });
  }
};

}  // namespace

TEST_CASE("rows idle for more than evict_idle_steps are evicted", "[eviction]") {
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t");
  c.evict_idle_steps = 80;  // embstore_step's passes at multiples of 10
  embstore_table_t* t = make_table(store, c);

  touch(store, t, 1, {1, 2, 3});
  touch(store, t, 5, {4, 5});
  touch(store, t, 81, {2});  // key 2 touched again; the pass at 81 found nothing idle yet
  // At step 81: rows with a step below 1 go, none.
  uint64_t evicted = 99;
  ok(embstore_table_evict(t, &evicted));
  CHECK(evicted == 0);
  ok(embstore_step(store, 82));  // no pass
  CHECK(stats(t).rows == 5);
  ok(embstore_table_evict(t, &evicted));
  CHECK(evicted == 2);  // keys 1 and 3: idle 81 steps
  CHECK(present(t, {1, 2, 3, 4, 5}) == std::vector<int64_t>{2, 4, 5});
  embstore_table_stats_t s = stats(t);
  CHECK(s.rows == 3);
  CHECK(s.evicted == 2);
  CHECK(s.inserted == 5);

  // An evicted key comes back from the initializer, and its (reused) row with fresh optimizer
  // state: key 3 had an Adagrad accumulator of 1 per column before.
  StoreGuard fresh_store(make_store());
  embstore_table_t* fresh = make_table(fresh_store, config("t"));
  touch(store, t, 83, {3});
  touch(fresh_store, fresh, 83, {3});
  CHECK(lookup_ok(t, {3}, 0) == lookup_ok(fresh, {3}, 0));
  s = stats(t);
  CHECK(s.rows == 4);
  CHECK(s.inserted == 6);

  // A table without idle rules evicts nothing on demand.
  embstore_table_t* plain = make_table(store, config("plain"));
  lookup_ok(plain, {1, 2});
  ok(embstore_step(store, 1000));
  ok(embstore_table_evict(plain, &evicted));
  CHECK(evicted == 0);
  CHECK(stats(plain).rows == 2);
  REQUIRE(embstore_table_evict(nullptr, &evicted) == EMBSTORE_INVALID_ARGUMENT);
}

TEST_CASE("embstore_step runs the idle rule every ceil(N/8) steps", "[eviction]") {
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t");
  c.evict_idle_steps = 16;  // a pass at every even step
  embstore_table_t* t = make_table(store, c);
  touch(store, t, 1, {7});
  touch(store, t, 2, {8});
  ok(embstore_step(store, 17));  // a pass: cutoff 1, key 7 (step 1) is idle exactly 16 steps
  CHECK(stats(t).rows == 2);
  ok(embstore_step(store, 18));  // pass: cutoff 2, key 7 (step 1) goes
  CHECK(present(t, {7, 8}) == std::vector<int64_t>{8});
  ok(embstore_step(store, 19));
  CHECK(stats(t).rows == 1);
  // Steps need not be consecutive: a jump crosses many multiples and runs one pass.
  ok(embstore_step(store, 100));
  CHECK(stats(t).rows == 0);
  CHECK(stats(t).evicted == 2);
}

TEST_CASE("rows idle for longer than evict_idle_seconds are evicted (injected clock)",
          "[eviction]") {
  StoreGuard store(make_store());
  FakeClock clock(store);  // before the table: it notes the time of its creation
  embstore_table_config_t c = config("t");
  c.evict_idle_seconds = 64;
  embstore_table_t* t = make_table(store, c);

  touch(store, t, 1, {1, 2});  // step 1 begins at t=1000
  clock.now = 1010;
  touch(store, t, 2, {2});  // step 2 at 1010: key 2 touched
  clock.now = 1070;
  ok(embstore_step(store, 3));  // a pass (70 s since the last): key 1 idle 60..70 s, stays
  CHECK(stats(t).rows == 2);
  clock.now = 1075;
  uint64_t evicted = 0;
  ok(embstore_table_evict(t, &evicted));  // key 1 untouched since before 1010: > 64 s
  CHECK(evicted == 1);
  CHECK(present(t, {1, 2}) == std::vector<int64_t>{2});
  // Key 2 was touched during step 2, which began at 1010: only once the next step's start
  // (1070) is 64 s old is it surely idle for longer. embstore_step passes every 8 s.
  clock.now = 1080;
  ok(embstore_step(store, 4));
  CHECK(stats(t).rows == 1);
  clock.now = 1134;
  ok(embstore_step(store, 5));
  CHECK(stats(t).rows == 0);
  CHECK(stats(t).evicted == 2);
}

TEST_CASE("at max_capacity an evicting table makes room, least recently used first", "[eviction]") {
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t");
  c.initial_capacity = 8;
  c.max_capacity = 8;
  c.evict_when_full = 1;
  embstore_table_t* t = make_table(store, c);
  for (int64_t k = 1; k <= 8; ++k) touch(store, t, static_cast<uint64_t>(k), {k});
  CHECK(stats(t).rows == 8);

  touch(store, t, 9, {100, 101});  // keys 1 and 2 are the least recently used
  CHECK(present(t, {1, 2, 3, 100, 101}) == std::vector<int64_t>{3, 100, 101});
  CHECK(stats(t).rows == 8);
  CHECK(stats(t).evicted == 2);

  // Key 3 is now the oldest, but this call reads it: key 4 goes instead.
  touch(store, t, 10, {3, 200});
  CHECK(present(t, {3, 4, 200}) == std::vector<int64_t>{3, 200});

  // Every row touched in this step and more new keys than rows: refused, nothing changes.
  ok(embstore_step(store, 11));
  std::vector<int64_t> all = {3, 5, 6, 7, 8, 100, 101, 200};
  lookup_ok(t, all);
  const std::vector<float> before = lookup_ok(t, all, 0);
  std::vector<float> out;
  REQUIRE(lookup(t, {300}, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
  CHECK(std::string(embstore_last_error()).find("current step") != std::string::npos);
  CHECK(lookup_ok(t, all, 0) == before);
  CHECK(stats(t).rows == 8);
  CHECK(stats(t).evicted == 3);

  // Without a rule the bound is a hard one.
  embstore_table_config_t hard = config("hard");
  hard.initial_capacity = 4;
  hard.max_capacity = 4;
  embstore_table_t* h = make_table(store, hard);
  lookup_ok(h, {1, 2, 3, 4});
  ok(embstore_step(store, 12));
  REQUIRE(lookup(h, {5}, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
  CHECK(stats(h).evicted == 0);
}

namespace {

// Four rows at most, the least recently used evicted for a new one.
embstore_table_config_t full_at_four(const char* name) {
  embstore_table_config_t c = config(name);
  c.initial_capacity = 4;
  c.max_capacity = 4;
  c.evict_when_full = 1;
  return c;
}

}  // namespace

TEST_CASE("a refused insert leaves the last-touched steps of the rows it read", "[eviction]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, full_at_four("t"));
  touch(store, t, 1, {2, 3, 4, 9});
  touch(store, t, 5, {2, 3, 4});  // key 9 is the least recently used, not the lowest key
  std::vector<float> out;
  // Two new keys need two rows; only key 9's is not of this step, and this call reads it.
  REQUIRE(lookup(t, {9, 10, 11}, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
  // Had the refused call left key 9 at step 5, every row would tie and the lowest key (2)
  // would go.
  touch(store, t, 6, {12});
  CHECK(present(t, {2, 3, 4, 9, 12}) == std::vector<int64_t>{2, 3, 4, 12});
}

TEST_CASE("rows of one step evicted for room go lowest key first, whatever their rows' ids",
          "[eviction]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, full_at_four("t"));
  // One call, so one step for all four; the host numbers the rows in this order (key 40 gets
  // the lowest row), CUDA in whichever order its threads win.
  touch(store, t, 1, {40, 10, 30, 20});
  touch(store, t, 2, {50});
  CHECK(present(t, {10, 20, 30, 40, 50}) == std::vector<int64_t>{20, 30, 40, 50});
  touch(store, t, 3, {60, 70});  // key 50 (step 2) stays: the three of step 1 are older
  CHECK(present(t, {20, 30, 40, 50, 60, 70}) == std::vector<int64_t>{40, 50, 60, 70});
  CHECK(stats(t).evicted == 3);
}

TEST_CASE("rows evicted for room go oldest first when their steps are far apart", "[eviction]") {
  // Over 4,096 steps between the oldest row and the insert: rows a few steps apart share a
  // bucket of make_room's histogram (row::RoomBuckets), and order within it by step, then key.
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, full_at_four("t"));
  touch(store, t, 1, {70});
  touch(store, t, 3001, {20});  // buckets of 3 steps: 3,001 and 3,002 share one
  touch(store, t, 3002, {10});
  touch(store, t, 9000, {30});
  touch(store, t, 10000, {80, 90});  // key 70 (step 1), then key 20 (older than key 10)
  CHECK(present(t, {10, 20, 30, 70, 80, 90}) == std::vector<int64_t>{10, 30, 80, 90});
  touch(store, t, 10001, {95});  // key 10, the oldest left
  CHECK(present(t, {10, 30, 80, 90, 95}) == std::vector<int64_t>{30, 80, 90, 95});
  CHECK(stats(t).evicted == 3);
}

TEST_CASE("rows evicted for room are those a reference LRU over (step, key) picks", "[eviction]") {
  // Random calls, most a step or three apart and some tens of thousands (so that the buckets of
  // make_room's histogram span several steps, and rows of a few calls share one), against a
  // model: a key's step is its last call's; an insert past the limit evicts
  // the oldest rows by (step, key), never one of the call's own.
  constexpr uint64_t kLimit = 64;
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t");
  c.initial_capacity = kLimit;
  c.max_capacity = kLimit;
  c.evict_when_full = 1;
  embstore_table_t* t = make_table(store, c);
  std::mt19937_64 rng(35);
  std::map<int64_t, uint64_t> last;  // key -> step of its last call
  std::vector<int64_t> universe(300);
  for (size_t i = 0; i < universe.size(); ++i) universe[i] = static_cast<int64_t>(i) * 7 - 500;
  uint64_t step = 0, evicted = 0;
  for (int call = 1; call <= 400; ++call) {
    step += rng() % 20 == 0 ? 20000 + rng() % 40000 : 1 + rng() % 3;
    std::vector<int64_t> keys(1 + rng() % 8);
    for (int64_t& k : keys) k = universe[rng() % universe.size()];
    std::vector<int64_t> distinct = keys;
    std::sort(distinct.begin(), distinct.end());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    const auto fresh = static_cast<uint64_t>(std::count_if(
        distinct.begin(), distinct.end(), [&](int64_t k) { return last.count(k) == 0; }));
    if (last.size() + fresh > kLimit) {
      std::vector<std::pair<uint64_t, int64_t>> order;  // (step, key), the call's keys spared
      for (const auto& [k, s] : last) {
        if (!std::binary_search(distinct.begin(), distinct.end(), k)) order.emplace_back(s, k);
      }
      std::sort(order.begin(), order.end());
      const uint64_t need = last.size() + fresh - kLimit;
      for (uint64_t i = 0; i < need; ++i) last.erase(order[i].second);
      evicted += need;
    }
    for (const int64_t k : distinct) last[k] = step;
    touch(store, t, step, keys);
    if (call % 20 == 0) {
      INFO("call " << call << " at step " << step);
      std::vector<int64_t> want;
      for (const auto& [k, s] : last) want.push_back(k);
      REQUIRE(present(t, universe) == want);
      REQUIRE(stats(t).evicted == evicted);
    }
  }
  REQUIRE(evicted > 500);
}

TEST_CASE("a table config of the 0.1 size gets the eviction defaults", "[eviction]") {
  StoreGuard store(make_store());
  embstore_table_config_t c = config("old");
  c.evict_idle_seconds = 5;  // beyond the old struct: must be ignored
  c.evict_when_full = 1;
  c.struct_size = offsetof(embstore_table_config_t, evict_idle_seconds);
  c.max_capacity = 64;
  embstore_table_t* t = make_table(store, c);
  std::vector<int64_t> keys(64);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i);
  lookup_ok(t, keys);
  ok(embstore_step(store, 2));
  std::vector<float> out;
  REQUIRE(lookup(t, {1000}, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
}

namespace {

struct DeltaFile {
  std::vector<int64_t> upserts, tombstones;
};

// The keys that the newest version in dir holds for table: upserts and tombstones, as written.
DeltaFile newest_rows(const std::string& dir, const std::string& table) {
  embstore::io::CheckpointDir d;
  std::string detail;
  REQUIRE(d.open(dir, &detail) == 0);
  size_t v = 0;
  REQUIRE(d.choose(embstore::io::kLatestVersion, std::nullopt, &v, &detail, nullptr) == 0);
  std::unique_ptr<embstore::io::RowFileReader> reader;
  REQUIRE(embstore::io::RowFileReader::open(
              d.version_path(v) + "/" +
                  embstore::io::row_file_path(embstore::io::kManifestFormatVersion, table, 0, 1),
              {}, &reader) == 0);
  DeltaFile out;
  embstore::io::RowBlock b;
  int r;
  while ((r = reader->next_block(&b)) == 1) {
    auto& into = b.kind == embstore::io::RowBlockKind::kTombstones ? out.tombstones : out.upserts;
    into.insert(into.end(), b.keys, b.keys + b.rows);
  }
  REQUIRE(r == 0);
  std::sort(out.upserts.begin(), out.upserts.end());
  std::sort(out.tombstones.begin(), out.tombstones.end());
  return out;
}

}  // namespace

TEST_CASE("a delta records evicted keys as tombstones, and restore drops them", "[eviction]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t");
  c.evict_idle_steps = 4;
  embstore_table_t* t = make_table(store, c);
  no_rebaseline(store);  // these tiny deltas would otherwise be taken as full ones

  touch(store, t, 1, {1, 2, 3, 4});
  incremental_ok(store, dir.path());  // the first is full
  touch(store, t, 4, {3, 4});
  touch(store, t, 6, {4});  // embstore_step(6) evicts keys 1 and 2 (cutoff 2)
  REQUIRE(stats(t).evicted == 2);
  lookup_ok(t, {2});  // key 2 comes back before the checkpoint: an upsert, no tombstone
  const uint64_t v1 = incremental_ok(store, dir.path());
  DeltaFile d = newest_rows(dir.path(), "t");
  CHECK(d.upserts == std::vector<int64_t>{2, 3, 4});
  CHECK(d.tombstones == std::vector<int64_t>{1});

  // The next delta: key 3 evicted, nothing else changed.
  touch(store, t, 8, {4, 2});
  ok(embstore_step(store, 9));  // cutoff 5: key 3 (step 4)
  REQUIRE(stats(t).evicted == 3);
  const uint64_t v2 = incremental_ok(store, dir.path());
  d = newest_rows(dir.path(), "t");
  CHECK(d.upserts == std::vector<int64_t>{2, 4});
  CHECK(d.tombstones == std::vector<int64_t>{3});

  const std::vector<int64_t> keys = {1, 2, 3, 4};
  for (const auto& [v, want] :
       std::map<uint64_t, std::vector<int64_t>>{{1, {1, 2, 3, 4}}, {v1, {2, 3, 4}}, {v2, {2, 4}}}) {
    StoreGuard other(make_store());
    uint64_t restored = 0;
    ok(embstore_restore(other, dir.path().c_str(), v, &restored));
    embstore_table_t* r = nullptr;
    ok(embstore_table_get(other, "t", &r));
    INFO("version " << v);
    CHECK(present(r, keys) == want);
    CHECK(stats(r).rows == want.size());
    if (v == v2) CHECK(lookup_ok(r, keys, 0) == lookup_ok(t, keys, 0));
  }
}

TEST_CASE("a failed delta leaves its tombstones to the next one", "[eviction]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t");
  c.evict_idle_steps = 2;
  embstore_table_t* t = make_table(store, c);
  no_rebaseline(store);
  touch(store, t, 1, {1, 2});
  incremental_ok(store, dir.path());
  touch(store, t, 5, {2});  // embstore_step(5) evicts both; key 2 comes back at once
  REQUIRE(stats(t).evicted == 2);
  REQUIRE(stats(t).rows == 1);
  {
    FaultGuard enospc([](uint64_t, size_t) { return -ENOSPC; });
    uint64_t v = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &v));
    REQUIRE(embstore_checkpoint_wait(store, v) == EMBSTORE_IO_ERROR);
  }
  ok(embstore_step(store, 6));
  incremental_ok(store, dir.path());
  const DeltaFile d = newest_rows(dir.path(), "t");
  CHECK(d.tombstones == std::vector<int64_t>{1});
  CHECK(d.upserts == std::vector<int64_t>{2});
  StoreGuard other(make_store());
  ok(embstore_restore(other, dir.path().c_str(), EMBSTORE_LATEST, nullptr));
  embstore_table_t* r = nullptr;
  ok(embstore_table_get(other, "t", &r));
  CHECK(present(r, {1, 2}) == std::vector<int64_t>{2});
}

TEST_CASE("a captured row evicted before it is written keeps its captured value", "[eviction]") {
  TempDir dir;
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.staging_bytes = size_t{1} << 20;  // far fewer rows than the table's fit in staging
  StoreGuard store(make_store(sc));
  embstore_table_config_t c = config("t", 16);
  c.evict_idle_steps = 1;
  embstore_table_t* t = make_table(store, c);
  std::vector<int64_t> keys(20000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i) * 3;
  touch(store, t, 1, keys);
  const std::vector<float> at_capture = lookup_ok(t, keys, 0);
  uint64_t v = 0;
  {
    // Nothing is written until the eviction runs; then the rows that the drain has not put in
    // staging (most: staging holds a few thousand) must be copied out by the eviction, which
    // waits for room once the writer is let go.
    HeldWriter held;
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v));
    std::thread releaser([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      held.release();
    });
    ok(embstore_step(store, 10));  // evicts every row
    releaser.join();
    REQUIRE(stats(t).evicted == keys.size());
    REQUIRE(stats(t).rows == 0);
    // Their rows are reused by new keys at once.
    std::vector<int64_t> other(keys.size());
    for (size_t i = 0; i < other.size(); ++i) other[i] = -1 - static_cast<int64_t>(i);
    touch(store, t, 11, other);
    ok(embstore_checkpoint_wait(store, v));
  }
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  CHECK(cs.copy_on_write_rows > 0);  // the eviction wrote rows the drain had not reached
  StoreGuard restored(make_store());
  ok(embstore_restore(restored, dir.path().c_str(), v, nullptr));
  embstore_table_t* r = nullptr;
  ok(embstore_table_get(restored, "t", &r));
  CHECK(lookup_ok(r, keys, 0) == at_capture);
  CHECK(stats(r).rows == keys.size());
}

TEST_CASE("every version of a chain with evictions restores the state training had", "[eviction]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t", 8);
  c.evict_idle_steps = 6;
  c.max_capacity = 300;
  c.initial_capacity = 64;  // grows, then evicts at the bound too
  embstore_table_t* t = make_table(store, c);
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.incremental_every_steps = 3;
  p.full_every_steps = 20;
  ok(embstore_checkpoint_set_policy(store, &p));

  // Keys drift over the run, so old ones go idle; 400 keys for 300 rows.
  std::vector<int64_t> universe(400);
  for (size_t i = 0; i < universe.size(); ++i) universe[i] = static_cast<int64_t>(i) * 11 - 900;
  std::map<uint64_t, std::vector<float>> state;  // step -> every key's value
  std::map<uint64_t, uint64_t> rows;
  for (uint64_t s = 1; s <= 45; ++s) {
    ok(embstore_step(store, s));
    // Each policy checkpoint is finished before the next step, so none is deferred.
    embstore_checkpoint_info_t info;
    info.struct_size = sizeof(info);
    if (embstore_checkpoint_info(store, s, &info) == EMBSTORE_OK) {
      ok(embstore_checkpoint_wait(store, s));
    }
    state[s] = lookup_ok(t, universe, 0);
    rows[s] = stats(t).rows;
    std::mt19937_64 rng(s);
    std::vector<int64_t> batch(48);
    for (auto& k : batch) k = universe[(s * 6 + rng() % 64) % universe.size()];
    lookup_ok(t, batch);
    std::vector<float> g(batch.size() * 8);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& x : g) x = u(rng);
    apply_ok(t, batch, g);
  }
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  CHECK(cs.deferred == 0);
  CHECK(cs.committed == 17);  // deltas at 3, 6, ..., 45 (the first full), fulls at 20 and 40
  CHECK(stats(t).evicted > 100);

  std::vector<embstore::io::VersionDir> versions;
  REQUIRE(embstore::io::list_versions(dir.path(), &versions) == 0);
  REQUIRE(versions.size() >= 12);
  size_t deltas_with_tombstones = 0;
  for (const embstore::io::VersionDir& vd : versions) {
    StoreGuard other(make_store());
    uint64_t restored = 0;
    ok(embstore_restore(other, dir.path().c_str(), vd.version, &restored));
    REQUIRE(restored == vd.version);
    embstore_table_t* r = nullptr;
    ok(embstore_table_get(other, "t", &r));
    INFO("version " << vd.name);
    // A policy checkpoint at step s holds the state after embstore_step(s).
    CHECK(lookup_ok(r, universe, 0) == state.at(vd.version));
    CHECK(stats(r).rows == rows.at(vd.version));
    if (!vd.full) {
      embstore::io::Manifest m;
      std::string detail;
      REQUIRE(embstore::io::read_manifest(dir.file(vd.name), &m, &detail) == 0);
      REQUIRE(m.tables.size() == 1);
      if (m.tables[0].rows > 0) {
        std::unique_ptr<embstore::io::RowFileReader> reader;
        REQUIRE(embstore::io::RowFileReader::open(
                    dir.file(vd.name) + "/" + m.tables[0].files[0].path, {}, &reader) == 0);
        embstore::io::RowBlock b;
        bool tomb = false;
        while (reader->next_block(&b) == 1)
          tomb |= b.kind == embstore::io::RowBlockKind::kTombstones;
        deltas_with_tombstones += tomb;
      }
    }
  }
  CHECK(deltas_with_tombstones >= 3);
}

TEST_CASE("a restore forgets the step times of the abandoned run (injected clock)", "[eviction]") {
  TempDir dir;
  StoreGuard store(make_store());
  FakeClock clock(store);
  embstore_table_config_t c = config("t");
  c.evict_idle_seconds = 64;
  embstore_table_t* t = make_table(store, c);
  for (uint64_t s = 1; s <= 5; ++s, clock.now += 10) touch(store, t, s, {1, 2});
  uint64_t v = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v));
  ok(embstore_checkpoint_wait(store, v));
  REQUIRE(v == 5);
  for (uint64_t s = 6; s <= 10; ++s, clock.now += 10) touch(store, t, s, {2});  // to 1100
  ok(embstore_restore(store, dir.path().c_str(), v, nullptr));
  REQUIRE(stats(t).rows == 2);
  // The abandoned run noted step 6 at 1050: its marks would make the restored rows (step 5)
  // idle by 1114. They must get the full 64 s from the restore instead.
  for (uint64_t s = 6; s <= 10; ++s) {
    clock.now += 10;  // 1110 ... 1150
    ok(embstore_step(store, s));
    INFO("step " << s);
    CHECK(stats(t).rows == 2);
  }
  clock.now = 1175;  // step 6 began at 1110 after the restore: more than 64 s ago
  ok(embstore_step(store, 11));
  CHECK(stats(t).rows == 0);
}
