// Followers (embstore_follower_*) through the public API: after every poll a follower serves
// what a restore of the same version holds (values; evicted keys gone, pending keys absent),
// across deltas applied one or several at a time and a rebase to a new full checkpoint; a
// serving layout of its own over a checkpoint of three ranks; a corrupt delta refused.
#include <embstore/embstore.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "host/backend/backends.hpp"
#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"
#include "shard/thread_group.hpp"
#include "tests/io/io_fixtures.hpp"
#include "tests/serving/follower_fixtures.hpp"

namespace {

using namespace embstore_test::serving;

TEST_CASE("A follower serves what a restore of each version holds", "[serving][follower]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  embstore_follower_t* f = follow(dir);
  check_equals_restore(f, dir, 1);
  uint64_t v = 0;
  for (uint64_t s = 2; s <= 5; ++s) {  // deltas (with tombstones: keys leave the window)
    trainer.step(s);
    trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
    if (s == 3) continue;  // two deltas in one poll at step 4
    REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
    CHECK(v == s);
    check_equals_restore(f, dir, s);
  }
  embstore_table_stats_t items{};
  items.struct_size = sizeof items;
  REQUIRE(embstore_table_stats(trainer.items, &items) == EMBSTORE_OK);
  CHECK(items.evicted > 0);  // the deltas held tombstones
  // A rebase: a full checkpoint, then deltas on it.
  trainer.step(6);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  trainer.step(7);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  check_equals_restore(f, dir, 7);
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);  // nothing new
  CHECK(v == 7);
  embstore_follower_stats_t st{};
  st.struct_size = sizeof st;
  REQUIRE(embstore_follower_stats(f, &st) == EMBSTORE_OK);
  CHECK(st.version == 7);
  CHECK(st.versions_applied == 4);  // 2, 3 and 4, 5
  CHECK(st.full_loads == 2);        // at create, and version 7's chain from the rebase at 6
  CHECK(st.lookups > 0);
  embstore_follower_destroy(f);
}

TEST_CASE("Lookups on other threads go on while polls apply deltas and a rebase",
          "[serving][follower]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  embstore_follower_t* f = follow(dir);
  std::atomic<bool> done{false};
  std::atomic<long> batches{0}, failures{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      std::vector<int64_t> keys;
      for (int64_t k = -kKeys; k < kKeys; k += 3) keys.push_back(k);
      std::vector<float> rows(keys.size() * 4);
      while (!done.load()) {
        if (embstore_follower_lookup(f, "items", keys.data(), keys.size(), rows.data(), nullptr) !=
            EMBSTORE_OK) {
          ++failures;
        }
        ++batches;
      }
    });
  }
  uint64_t v = 0;
  for (uint64_t s = 2; s <= 8; ++s) {
    trainer.step(s);
    trainer.checkpoint(dir, s == 6 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL);
    REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  }
  const long seen = batches.load();
  while (batches.load() < seen + 10) std::this_thread::yield();
  done = true;
  for (std::thread& t : readers) t.join();
  CHECK(failures.load() == 0);
  check_equals_restore(f, dir, 8);
  embstore_follower_destroy(f);
}

TEST_CASE("A corrupt delta is refused and never served", "[serving][follower]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  embstore_follower_t* f = follow(dir);
  trainer.step(3);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  {
    const std::string file =
        dir + "/00000000000000000003.delta/" +
        embstore::io::row_file_path(embstore::io::kManifestFormatVersion, "items", 0, 1);
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(io.good());
    io.seekp(120);
    io.put('\x42');
  }
  uint64_t v = 0;
  CHECK(embstore_follower_poll(f, &v) == EMBSTORE_CORRUPT);
  check_equals_restore(f, dir, 2);  // still version 2
  // A new full checkpoint moves it on.
  trainer.step(4);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  check_equals_restore(f, dir, 4);
  embstore_follower_destroy(f);
}

TEST_CASE("Followers serve a checkpoint of three ranks in layouts of their own",
          "[serving][follower]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  REQUIRE(embstore_test::threads::write_checkpoint(3, dir) == "");
  // One follower of every key, and rank 1 of a layout of 2.
  for (const auto& [rank, world] : std::vector<std::pair<int, int>>{{0, 1}, {1, 2}}) {
    embstore_follower_t* f = follow(dir, rank, world);
    embstore_store_t* restored = host_store();
    REQUIRE(embstore_restore(restored, dir.c_str(), EMBSTORE_LATEST, nullptr) == EMBSTORE_OK);
    for (const auto& shape : embstore_test::sharded::kTables) {
      std::vector<int64_t> keys;
      for (int64_t k = -400; k < 500; ++k) {
        if (embstore_shard_of(k, static_cast<uint32_t>(world)) == static_cast<uint32_t>(rank)) {
          keys.push_back(k);
        }
      }
      embstore_table_t* t = nullptr;
      REQUIRE(embstore_table_get(restored, shape.name, &t) == EMBSTORE_OK);
      std::vector<float> want(keys.size() * shape.dim), got(keys.size() * shape.dim);
      REQUIRE(embstore_lookup(t, keys.data(), keys.size(), want.data(), 0, nullptr) == EMBSTORE_OK);
      REQUIRE(embstore_follower_lookup(f, shape.name, keys.data(), keys.size(), got.data(),
                                       nullptr) == EMBSTORE_OK);
      INFO(shape.name << ", rank " << rank << " of " << world);
      CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
    }
    if (world > 1) {
      int64_t other = 0;
      while (embstore_shard_of(other, 2) == static_cast<uint32_t>(rank)) ++other;
      float row[8];
      CHECK(embstore_follower_lookup(f, "items", &other, 1, row, nullptr) ==
            EMBSTORE_INVALID_ARGUMENT);
    }
    embstore_store_destroy(restored);
    embstore_follower_destroy(f);
  }
}

TEST_CASE("Keys without a row read as zeros, or as the initializer gives them",
          "[serving][follower]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  const int64_t absent = 1'000'000;  // never trained
  float init[4], zeros[4], fresh[4];
  embstore_follower_t* z = follow(dir);
  embstore_follower_t* i = follow(dir, 0, 1, EMBSTORE_FOLLOWER_INITIAL_VALUES);
  REQUIRE(embstore_follower_lookup(z, "items", &absent, 1, zeros, nullptr) == EMBSTORE_OK);
  REQUIRE(embstore_follower_lookup(i, "items", &absent, 1, init, nullptr) == EMBSTORE_OK);
  REQUIRE(embstore_lookup(trainer.items, &absent, 1, fresh, EMBSTORE_LOOKUP_INSERT, nullptr) ==
          EMBSTORE_OK);
  for (int d = 0; d < 4; ++d) {
    CHECK(zeros[d] == 0.0f);
    CHECK(init[d] == fresh[d]);
  }
  embstore_follower_destroy(z);
  embstore_follower_destroy(i);
}

TEST_CASE("A rebase that changes a served table's dim is refused", "[serving][follower]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  {
    Trainer trainer;  // items: dim 4
    trainer.step(1);
    trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  }
  embstore_follower_t* f = follow(dir);
  {
    // Another run writes "items" with dim 8 into the same directory.
    embstore_store_t* store = host_store();
    embstore_table_config_t c;
    embstore_table_config_init(&c);
    c.name = "items";
    c.dim = 8;
    embstore_table_t* t = nullptr;
    REQUIRE(embstore_table_create(store, &c, &t) == EMBSTORE_OK);
    c.name = "counted";
    c.dim = 3;
    REQUIRE(embstore_table_create(store, &c, &t) == EMBSTORE_OK);
    REQUIRE(embstore_step(store, 2) == EMBSTORE_OK);
    uint64_t v = 0;
    REQUIRE(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, &v) == EMBSTORE_OK);
    REQUIRE(embstore_checkpoint_wait(store, v) == EMBSTORE_OK);
    embstore_store_destroy(store);
  }
  uint64_t v = 0;
  CHECK(embstore_follower_poll(f, &v) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(std::string(embstore_last_error()).find("dim 8") != std::string::npos);
  REQUIRE(embstore_follower_version(f, &v) == EMBSTORE_OK);
  CHECK(v == 1);  // still serving version 1, with dim 4
  uint32_t dim = 0;
  REQUIRE(embstore_follower_table_dim(f, "items", &dim) == EMBSTORE_OK);
  CHECK(dim == 4);
  check_equals_restore(f, dir, 1);
  embstore_follower_destroy(f);
}

TEST_CASE("Follower arguments are checked", "[serving][follower]") {
  embstore_test::TempDir tmp;
  embstore_follower_config_t c;
  embstore_follower_config_init(&c);
  embstore_follower_t* f = nullptr;
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_INVALID_ARGUMENT);  // dir NULL
  const std::string missing = tmp.path() + "/missing";
  c.dir = missing.c_str();
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_NOT_FOUND);
  c.rank = 2;
  c.world_size = 2;
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_INVALID_ARGUMENT);
  c.rank = 0;
  c.flags = 4;
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_INVALID_ARGUMENT);
  c.flags = 0;
  c.backend = EMBSTORE_BACKEND_CUDA;
  c.device = -1;
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_INVALID_ARGUMENT);
  c.device = 0;
  if (!embstore::cuda_device_usable(0, nullptr)) {
    CHECK(embstore_follower_create(&c, &f) == EMBSTORE_UNSUPPORTED);
  }
  c.backend = EMBSTORE_BACKEND_AUTO;
  c.struct_size = 8;
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(f == nullptr);
  // A regex that selects nothing, or does not compile.
  const std::string dir = tmp.path() + "/run";
  {
    Trainer trainer;
    trainer.step(1);
    trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  }
  embstore_follower_config_init(&c);
  c.dir = dir.c_str();
  c.tables_regex = "users";
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_NOT_FOUND);
  c.tables_regex = "(";
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_INVALID_ARGUMENT);
  c.tables_regex = "items";
  REQUIRE(embstore_follower_create(&c, &f) == EMBSTORE_OK);
  float row[4];
  const int64_t key = 1;
  CHECK(embstore_follower_lookup(f, "counted", &key, 1, row, nullptr) ==
        EMBSTORE_INVALID_ARGUMENT);  // not served
  CHECK(embstore_follower_lookup(f, "items", &key, 1, row, nullptr) == EMBSTORE_OK);
  uint32_t dim = 0;
  CHECK(embstore_follower_table_dim(f, "items", &dim) == EMBSTORE_OK);
  CHECK(dim == 4);
  CHECK(embstore_follower_table_dim(f, "counted", &dim) == EMBSTORE_NOT_FOUND);  // not served
  CHECK(embstore_follower_table_dim(f, nullptr, &dim) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(embstore_follower_table_dim(f, "items", nullptr) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(embstore_follower_poll(nullptr, nullptr) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(embstore_follower_destroy(nullptr) == EMBSTORE_OK);
  embstore_follower_destroy(f);
}

// A follower's tables_regex comes from its caller: at most EMBSTORE_MAX_TABLES_REGEX_BYTES,
// RE2's syntax, matched in time linear in the name. The patterns below backtrack exponentially
// in the name's length in std::regex (tens of seconds at 31 bytes; the 128-byte name never
// finishes), and 25,000 nested parentheses overflowed its compiler's stack: a regression
// crashes this test or holds it until ctest's timeout.
TEST_CASE("A follower's tables_regex: a length limit, RE2 syntax, linear time",
          "[serving][follower][regex]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  const std::string a30b = std::string(30, 'a') + "b";
  const std::string a127b = std::string(127, 'a') + "b";  // the longest name
  {
    embstore_store_t* s = host_store();
    for (const std::string& name : {a30b, a127b}) {
      embstore_table_config_t c;
      embstore_table_config_init(&c);
      c.name = name.c_str();
      c.dim = 4;
      embstore_table_t* t = nullptr;
      REQUIRE(embstore_table_create(s, &c, &t) == EMBSTORE_OK);
      const int64_t keys[] = {1, 2, 3};
      float rows[3 * 4];
      REQUIRE(embstore_lookup(t, keys, 3, rows, EMBSTORE_LOOKUP_INSERT, nullptr) == EMBSTORE_OK);
    }
    uint64_t v = 0;
    REQUIRE(embstore_checkpoint(s, dir.c_str(), EMBSTORE_CKPT_FULL, &v) == EMBSTORE_OK);
    REQUIRE(embstore_checkpoint_wait(s, v) == EMBSTORE_OK);
    embstore_store_destroy(s);
  }
  // The status of a follower of regex; where it was created, which of the tables it serves.
  struct Outcome {
    embstore_status_t status;
    std::string error;
    bool a30b = false, a127b = false;
  };
  const auto follow_regex = [&](const std::string& regex) {
    embstore_follower_config_t c = follower_config(dir);
    c.tables_regex = regex.c_str();
    c.lease_seconds = 0;
    embstore_follower_t* f = nullptr;
    Outcome o{embstore_follower_create(&c, &f), embstore_last_error()};
    if (o.status == EMBSTORE_OK) {
      uint32_t dim = 0;
      o.a30b = embstore_follower_table_dim(f, a30b.c_str(), &dim) == EMBSTORE_OK;
      o.a127b = embstore_follower_table_dim(f, a127b.c_str(), &dim) == EMBSTORE_OK;
      embstore_follower_destroy(f);
    }
    return o;
  };
  const auto is = [](const Outcome& o, embstore_status_t status, const std::string& mentions) {
    INFO("last_error: " << o.error);
    CHECK(o.status == status);
    CHECK(o.error.find(mentions) != std::string::npos);
  };

  // At most EMBSTORE_MAX_TABLES_REGEX_BYTES.
  std::string longest = a30b + "|";
  longest.resize(EMBSTORE_MAX_TABLES_REGEX_BYTES, 'x');
  is(follow_regex(longest + "x"), EMBSTORE_INVALID_ARGUMENT,
     "1025 bytes, more than EMBSTORE_MAX_TABLES_REGEX_BYTES (1024)");
  is(follow_regex(std::string(100000, 'a')), EMBSTORE_INVALID_ARGUMENT,
     "EMBSTORE_MAX_TABLES_REGEX_BYTES");
  Outcome o = follow_regex(longest);
  REQUIRE(o.status == EMBSTORE_OK);
  CHECK(o.a30b);
  CHECK_FALSE(o.a127b);
  // Deep nesting: over the limit, or compiled without recursion.
  is(follow_regex(std::string(25000, '(') + "a" + std::string(25000, ')')),
     EMBSTORE_INVALID_ARGUMENT, "EMBSTORE_MAX_TABLES_REGEX_BYTES");
  const std::string nested = std::string(500, '(') + "a+b" + std::string(500, ')');
  REQUIRE(nested.size() <= EMBSTORE_MAX_TABLES_REGEX_BYTES);
  o = follow_regex(nested);
  REQUIRE(o.status == EMBSTORE_OK);
  CHECK(o.a30b);
  CHECK(o.a127b);
  // Patterns that backtrack exponentially match nothing, promptly; and what they should match,
  // they match.
  for (const char* regex : {"(a+)+$", "(a|a)*$", "(.*a){20}$", "((a*)*)*c", "(a|aa)+", "(a*)*"}) {
    INFO("tables_regex " << regex);
    is(follow_regex(regex), EMBSTORE_NOT_FOUND, "no table matches");
  }
  o = follow_regex("(a|a)*b");
  REQUIRE(o.status == EMBSTORE_OK);
  CHECK(o.a30b);
  CHECK(o.a127b);
  // No backreferences or lookaround.
  for (const char* regex : {"(a)\\1*b", "(?=a)a*b", ".*(?<!b)"}) {
    INFO("tables_regex " << regex);
    is(follow_regex(regex), EMBSTORE_INVALID_ARGUMENT, "not an RE2 regular expression");
  }
}

}  // namespace

TEST_CASE("A cancelled follower's poll gives up at once, later polls fail, lookups go on",
          "[serving][follower]") {
  // embstore_follower_cancel: what Python's close() calls, so that a paced poll on another
  // thread does not keep it waiting for as long as its pace takes.
  Run run;
  embstore_follower_config_t c = follower_config(run.dir);
  c.apply_bytes_per_second = 64;  // a delta of a few KB: about a minute
  embstore_follower_t* f = follow_with(c);
  const std::vector<int64_t> keys = {1, 2, 3};
  std::vector<float> before(keys.size() * 4), after(keys.size() * 4);
  REQUIRE(embstore_follower_lookup(f, "items", keys.data(), keys.size(), before.data(), nullptr) ==
          EMBSTORE_OK);
  run.trainer.step(2);
  run.trainer.checkpoint(run.dir, EMBSTORE_CKPT_INCREMENTAL);

  std::atomic<int> polled{-1};
  std::thread poller([&] {
    uint64_t v = 0;
    polled = embstore_follower_poll(f, &v);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // pacing its reads
  const auto cancelled = std::chrono::steady_clock::now();
  REQUIRE(embstore_follower_cancel(f) == EMBSTORE_OK);
  poller.join();
  CHECK(std::chrono::steady_clock::now() - cancelled < std::chrono::seconds(5));
  CHECK(polled.load() == EMBSTORE_BUSY);
  uint64_t v = 0;
  CHECK(embstore_follower_poll(f, &v) == EMBSTORE_BUSY);
  CHECK(std::string(embstore_last_error()).find("being closed") != std::string::npos);
  REQUIRE(embstore_follower_lookup(f, "items", keys.data(), keys.size(), after.data(), nullptr) ==
          EMBSTORE_OK);
  CHECK(after == before);  // still version 1: the cancelled poll applied nothing
  REQUIRE(embstore_follower_version(f, &v) == EMBSTORE_OK);
  CHECK(v == 1);
  CHECK(embstore_follower_cancel(nullptr) == EMBSTORE_INVALID_ARGUMENT);
  REQUIRE(embstore_follower_destroy(f) == EMBSTORE_OK);
}
