// Followers that poll by themselves (poll_interval_ms): they reach each committed version and
// serve what a restore holds; a commit wakes them before their interval ends (inotify);
// destroy stops them at once; the stats carry the lag from commit to visibility; a table
// created after the load is served after the next poll; configurations of the first version
// of the API still work.
#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstddef>
#include <filesystem>
#include <string>
#include <thread>

#include "tests/io/io_fixtures.hpp"
#include "tests/serving/follower_fixtures.hpp"

namespace {

using namespace embstore_test::serving;
using Clock = std::chrono::steady_clock;

embstore_follower_t* follow_in_background(const std::string& dir, uint32_t interval_ms,
                                          uint32_t lease_seconds) {
  embstore_follower_config_t c = follower_config(dir);
  c.poll_interval_ms = interval_ms;
  c.lease_seconds = lease_seconds;
  return follow_with(c);
}

// Waits (up to 30 s: a bound for a hung test, not a timing goal) for f to serve version.
bool reaches(embstore_follower_t* f, uint64_t version) {
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  uint64_t v = 0;
  while (Clock::now() < deadline) {
    REQUIRE(embstore_follower_version(f, &v) == EMBSTORE_OK);
    if (v == version) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return false;
}

TEST_CASE("A background follower reaches each version and reports its lag",
          "[serving][background]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  embstore_follower_t* f = follow_in_background(dir, 20, 60);
  // The version loaded at create is not a lag: it may have been committed long before.
  CHECK(stats_of(f).last_lag_seconds == 0);
  for (uint64_t s = 3; s <= 7; ++s) {
    trainer.step(s);
    trainer.checkpoint(dir, s == 4 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL);
    REQUIRE(reaches(f, s));
    check_equals_restore(f, dir, s);
  }
  const embstore_follower_stats_t st = stats_of(f);
  CHECK(st.polls >= 5);
  CHECK(st.versions_applied >= 3);  // 3, 5, 6, 7 unless two came in one poll
  CHECK(st.last_poll_status == EMBSTORE_OK);
  // Seconds, not milliseconds: each version was visible within the 30 s of reaches().
  CHECK(st.last_lag_seconds > 0);
  CHECK(st.lag_p50_seconds > 0);
  CHECK(st.lag_p50_seconds <= st.lag_p99_seconds);
  CHECK(st.lag_p99_seconds < 30);
  embstore_follower_destroy(f);
}

TEST_CASE("A commit wakes a background follower; destroy stops it at once",
          "[serving][background]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  // An interval of an hour (no lease to renew): only the directory's change can wake it.
  embstore_follower_t* f = follow_in_background(dir, 3'600'000, 0);
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  CHECK(reaches(f, 2));  // inotify: local file systems report renames
  check_equals_restore(f, dir, 2);
  const auto started = Clock::now();
  embstore_follower_destroy(f);
  CHECK(Clock::now() - started < std::chrono::seconds(30));
}

TEST_CASE("An interval-only follower is woken by its interval, not by commits",
          "[serving][background]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  embstore_follower_config_t c = follower_config(dir);
  c.flags = EMBSTORE_FOLLOWER_INTERVAL_ONLY;
  c.poll_interval_ms = 3'600'000;
  c.lease_seconds = 0;
  embstore_follower_t* slow = follow_with(c);
  c.poll_interval_ms = 50;
  embstore_follower_t* fast = follow_with(c);
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  CHECK(reaches(fast, 2));  // its interval
  // inotify wakes a follower within milliseconds of a commit; this one has not polled at all.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  uint64_t v = 0;
  REQUIRE(embstore_follower_version(slow, &v) == EMBSTORE_OK);
  CHECK(v == 1);
  CHECK(stats_of(slow).polls == 0);
  embstore_follower_destroy(slow);
  embstore_follower_destroy(fast);
}

TEST_CASE("A paced poll takes its bytes over the rate and serves what a restore holds",
          "[serving][follower]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  embstore_follower_config_t c = follower_config(dir);
  c.apply_bytes_per_second = 20'000;
  embstore_follower_t* f = follow_with(c);  // whole loads are not paced
  trainer.step(2);
  const uint64_t v = trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  embstore_checkpoint_info_t info{};
  info.struct_size = sizeof info;
  REQUIRE(embstore_checkpoint_info(trainer.store, v, &info) == EMBSTORE_OK);
  REQUIRE(info.rows_written > 100);
  uint64_t served = 0;
  REQUIRE(embstore_follower_poll(f, &served) == EMBSTORE_OK);
  CHECK(served == 2);
  // Every row of the delta is at least its 8-byte key (about 0.1 s of them at this rate).
  const double least = static_cast<double>(info.rows_written) * 8 / 20'000;
  CHECK(stats_of(f).last_apply_seconds >= 0.99 * least);
  check_equals_restore(f, dir, 2);
  embstore_follower_destroy(f);
}

TEST_CASE("Destroy cancels a paced background poll", "[serving][background]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  embstore_follower_config_t c = follower_config(dir);
  c.poll_interval_ms = 10;
  c.apply_bytes_per_second = 1;  // a delta would take hours
  embstore_follower_t* f = follow_with(c);
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the poll is reading it
  uint64_t v = 0;
  REQUIRE(embstore_follower_version(f, &v) == EMBSTORE_OK);
  CHECK(v == 1);
  const auto started = Clock::now();
  embstore_follower_destroy(f);
  CHECK(Clock::now() - started < std::chrono::seconds(30));  // not hours
}

TEST_CASE("A failing background poll keeps the version served and says why",
          "[serving][background]") {
  Run run;
  embstore_test::TempDir& tmp = run.tmp;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  // A delta whose manifest does not parse, committed (renamed in) after the follower started.
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  const std::string delta = dir + "/00000000000000000002.delta", held = tmp.path() + "/held";
  std::filesystem::rename(delta, held);
  embstore_follower_t* f = follow_in_background(dir, 20, 0);
  std::filesystem::resize_file(held + "/MANIFEST.json", 10);
  std::filesystem::rename(held, delta);
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (stats_of(f).last_poll_status == EMBSTORE_OK && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const embstore_follower_stats_t st = stats_of(f);
  CHECK(st.last_poll_status == EMBSTORE_CORRUPT);
  CHECK(st.version == 1);
  check_equals_restore(f, dir, 1);
  // The trainer's next full checkpoint moves it on.
  trainer.step(3);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  CHECK(reaches(f, 3));
  check_equals_restore(f, dir, 3);
  embstore_follower_destroy(f);
}

TEST_CASE("A table created after the load is served after the next poll", "[serving][follower]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  embstore_follower_t* f = follow(dir);
  embstore_table_config_t c;
  embstore_table_config_init(&c);
  c.name = "later";
  c.dim = 2;
  embstore_table_t* later = nullptr;
  REQUIRE(embstore_table_create(trainer.store, &c, &later) == EMBSTORE_OK);
  const int64_t keys[3] = {5, 6, 7};
  float rows[6], served[6] = {};
  REQUIRE(embstore_lookup(later, keys, 3, rows, EMBSTORE_LOOKUP_INSERT, nullptr) == EMBSTORE_OK);
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  CHECK(embstore_follower_lookup(f, "later", keys, 3, served, nullptr) ==
        EMBSTORE_INVALID_ARGUMENT);
  uint64_t v = 0;
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  check_equals_restore(f, dir, 2);
  REQUIRE(embstore_follower_lookup(f, "later", keys, 3, served, nullptr) == EMBSTORE_OK);
  for (int i = 0; i < 6; ++i) CHECK(served[i] == rows[i]);
  embstore_follower_destroy(f);
}

TEST_CASE("Follower structs of the first API version still work", "[serving][follower]") {
  Run run;
  const std::string& dir = run.dir;
  Trainer& trainer = run.trainer;
  embstore_follower_config_t c;
  embstore_follower_config_init(&c);
  c.dir = dir.c_str();
  c.struct_size = offsetof(embstore_follower_config_t, poll_interval_ms);
  embstore_follower_t* f = nullptr;
  REQUIRE(embstore_follower_create(&c, &f) == EMBSTORE_OK);
  embstore_follower_stats_t st{};
  st.struct_size = offsetof(embstore_follower_stats_t, polls);
  st.polls = 12345;
  REQUIRE(embstore_follower_stats(f, &st) == EMBSTORE_OK);
  CHECK(st.version == 1);
  CHECK(st.polls == 12345);  // past its struct_size: untouched
  st.struct_size = offsetof(embstore_follower_stats_t, polls) - 1;
  CHECK(embstore_follower_stats(f, &st) == EMBSTORE_INVALID_ARGUMENT);
  embstore_follower_destroy(f);
  // The second version: polling and leases, no pacing.
  c.struct_size = offsetof(embstore_follower_config_t, apply_bytes_per_second);
  c.poll_interval_ms = 10;
  c.apply_bytes_per_second = 1;  // past its struct_size: never read (it would take hours)
  f = follow_with(c);
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  CHECK(reaches(f, 2));
  embstore_follower_destroy(f);
  c.poll_interval_ms = 0;
  c.apply_bytes_per_second = 0;
  // An interval the lease would not survive.
  c.struct_size = sizeof c;
  c.lease_seconds = 10;
  c.poll_interval_ms = 6000;
  CHECK(embstore_follower_create(&c, &f) == EMBSTORE_INVALID_ARGUMENT);
  c.poll_interval_ms = 5000;
  REQUIRE(embstore_follower_create(&c, &f) == EMBSTORE_OK);
  embstore_follower_destroy(f);
}

}  // namespace
