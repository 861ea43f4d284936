// Leases (io/format/lease.hpp) and the trainer's retention: a live follower's lease keeps its
// version's chain; an expired lease, a lease file that does not parse, and a follower without a
// lease do not; a follower whose version was deleted anyway loads the newest version whole and
// says so in its stats.
#include "io/format/lease.hpp"

#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/format/commit.hpp"
#include "tests/io/io_fixtures.hpp"
#include "tests/serving/follower_fixtures.hpp"

namespace {

using namespace embstore_test::serving;
namespace io = embstore::io;

std::vector<uint64_t> versions_in(const std::string& dir) {
  std::vector<io::VersionDir> listed;
  REQUIRE(io::list_versions(dir, &listed) == 0);
  std::vector<uint64_t> out;
  for (const io::VersionDir& v : listed) out.push_back(v.version);
  return out;
}

// Retention in dir: the newest full checkpoint is kept with its deltas, the rest goes.
void keep_newest_full(Trainer& trainer, const std::string& dir) {
  embstore_checkpoint_policy_t policy;
  embstore_checkpoint_policy_init(&policy);
  policy.dir = dir.c_str();
  policy.keep_full = 1;
  policy.max_chain_length = 0;
  policy.rebaseline_fraction = 0;
  REQUIRE(embstore_checkpoint_set_policy(trainer.store, &policy) == EMBSTORE_OK);
}

embstore_follower_t* follow_with_lease(const std::string& dir, uint32_t lease_seconds) {
  embstore_follower_config_t c = follower_config(dir);
  c.lease_seconds = lease_seconds;
  return follow_with(c);
}

std::vector<io::Lease> leases_in(const std::string& dir) {
  std::vector<io::Lease> leases;
  REQUIRE(io::read_leases(dir, &leases, nullptr) == 0);
  return leases;
}

TEST_CASE("A lease file reads back; hostile ones are no lease", "[serving][lease]") {
  io::Lease l;
  l.id = io::new_lease_id();
  l.pid = 42;
  l.host = "serving-3";
  l.version = 77;
  l.expires_ms = 1'900'000'000'000;
  l.what = "follower in test";
  io::Lease back;
  std::string why;
  REQUIRE(io::parse_lease(io::format_lease(l), &back, &why) == 0);
  CHECK(back.pid == 42);
  CHECK(back.host == "serving-3");
  CHECK(back.version == 77);
  CHECK(back.expires_ms == l.expires_ms);
  CHECK(back.what == l.what);
  for (const char* bad : {"", "[]", "{\"embstore_lease\":1}", "not json",
                          "{\"embstore_lease\":2,\"pid\":1,\"version\":1,\"expires_ms\":1}",
                          "{\"embstore_lease\":1,\"pid\":1,\"version\":-1,\"expires_ms\":1}",
                          "{\"embstore_lease\":1,\"pid\":1,\"version\":\"7\",\"expires_ms\":1}"}) {
    INFO(bad);
    CHECK(io::parse_lease(bad, &back, &why) == -EBADMSG);
    CHECK(!why.empty());
  }
  CHECK(io::parse_lease(std::string(5000, ' '), &back, &why) == -EBADMSG);

  embstore_test::TempDir tmp;
  REQUIRE(io::write_lease(tmp.path(), l, &why) == 0);
  std::ofstream(tmp.path() + "/" + io::kLeasePrefix + "garbage") << "{";
  std::ofstream(tmp.path() + "/" + io::kLeasePrefix + "half.tmp") << "{";
  std::ofstream(tmp.path() + "/" + io::kLeasePrefix + "big") << std::string(10000, ' ');
  std::vector<io::Lease> leases;
  std::vector<std::string> skipped;
  REQUIRE(io::read_leases(tmp.path(), &leases, &skipped) == 0);
  REQUIRE(leases.size() == 1);
  CHECK(leases[0].id == l.id);
  CHECK(skipped.size() == 2);  // garbage, big; the .tmp is being written
  io::Lease bad_id = l;
  bad_id.id = "../escape";
  CHECK(io::write_lease(tmp.path(), bad_id, &why) == -EINVAL);
  REQUIRE(io::remove_lease(tmp.path(), l.id) == 0);
  REQUIRE(io::read_leases(tmp.path(), &leases, nullptr) == 0);
  CHECK(leases.empty());
}

TEST_CASE("A live lease keeps its chain from retention; the next poll lets it go",
          "[serving][lease]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  Trainer trainer;
  keep_newest_full(trainer, dir);
  trainer.step(1);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  embstore_follower_t* f = follow_with_lease(dir, 60);
  {
    const std::vector<io::Lease> leases = leases_in(dir);
    REQUIRE(leases.size() == 1);
    CHECK(leases[0].version == 2);
  }
  for (uint64_t s = 3; s <= 4; ++s) {  // two rebases: without the lease 1 and 2 would go at 3
    trainer.step(s);
    trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  }
  CHECK(versions_in(dir) == std::vector<uint64_t>{1, 2, 3, 4});
  check_equals_restore(f, dir, 2);  // still readable, still served
  uint64_t v = 0;
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  CHECK(v == 4);
  CHECK(leases_in(dir).at(0).version == 4);
  trainer.step(5);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  CHECK(versions_in(dir) == std::vector<uint64_t>{4, 5});  // the lease needs 4
  CHECK(stats_of(f).chain_lost == 0);
  embstore_follower_destroy(f);
  CHECK(leases_in(dir).empty());  // destroy removed it
  trainer.step(6);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  CHECK(versions_in(dir) == std::vector<uint64_t>{6});
}

TEST_CASE("Expired and unreadable leases keep nothing; stale ones are removed",
          "[serving][lease]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  Trainer trainer;
  keep_newest_full(trainer, dir);
  trainer.step(1);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  const int64_t now = io::wall_clock_ms();
  std::string why;
  io::Lease expired;
  expired.id = "expired";
  expired.pid = 1;
  expired.version = 1;
  expired.expires_ms = now - 1000;
  io::Lease stale = expired;
  stale.id = "stale";
  stale.expires_ms = now - io::kStaleLeaseMs - 1000;
  io::Lease elsewhere = expired;  // live, for a version this directory does not have
  elsewhere.id = "elsewhere";
  elsewhere.version = 999;
  elsewhere.expires_ms = now + 600'000;
  io::Lease hostile = expired;  // an expiry no subtraction may take
  hostile.id = "hostile";
  hostile.expires_ms = INT64_MIN;
  for (const io::Lease& l : {expired, stale, elsewhere, hostile}) {
    REQUIRE(io::write_lease(dir, l, &why) == 0);
  }
  std::ofstream(dir + "/" + io::kLeasePrefix + "garbage") << "{\"version\": 1";
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  CHECK(versions_in(dir) == std::vector<uint64_t>{2});
  std::vector<std::string> ids;
  for (const io::Lease& l : leases_in(dir)) ids.push_back(l.id);
  // The stale one went, and the one expired since INT64_MIN ms.
  CHECK(ids == std::vector<std::string>{"elsewhere", "expired"});
}

TEST_CASE("A follower whose version was deleted loads the newest whole and says so",
          "[serving][lease]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  Trainer trainer;
  keep_newest_full(trainer, dir);
  trainer.step(1);
  trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  trainer.step(2);
  trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);

  SECTION("without a lease, retention deletes it") {
    embstore_follower_t* f = follow_with_lease(dir, 0);
    CHECK(leases_in(dir).empty());
    trainer.step(3);
    trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
    trainer.step(4);
    trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
    CHECK(versions_in(dir) == std::vector<uint64_t>{3, 4});
    uint64_t v = 0;
    REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
    check_equals_restore(f, dir, 4);
    const embstore_follower_stats_t st = stats_of(f);
    CHECK(st.chain_lost == 1);
    CHECK(st.full_loads == 2);
    CHECK(st.last_poll_status == EMBSTORE_OK);
    embstore_follower_destroy(f);
  }
  SECTION("removed by hand while a lease held it") {
    embstore_follower_t* f = follow_with_lease(dir, 60);
    trainer.step(3);
    trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
    CHECK(versions_in(dir) == std::vector<uint64_t>{1, 2, 3});  // the lease keeps 1 and 2
    for (const char* name : {"/00000000000000000002.delta", "/00000000000000000001.full"}) {
      std::filesystem::remove_all(dir + name);
    }
    uint64_t v = 0;
    REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
    check_equals_restore(f, dir, 3);
    CHECK(stats_of(f).chain_lost == 1);
    embstore_follower_destroy(f);
  }
}

}  // namespace
