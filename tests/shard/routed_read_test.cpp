// The routed read (host/checkpoint/routed_read.hpp): ranks as threads read shares of a chain's
// row files and route rows to their owners, in rounds small enough that every file takes many.
// Each rank must end with exactly its keys' newest rows, as one process's read_chain_rows gives
// them; a failure anywhere (a corrupt file, a sink that refuses rows) must end every rank's
// read, the failing rank with its own error, without a hang.
#include "host/checkpoint/routed_read.hpp"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>

#include "cuda/row/shard.h"
#include "host/checkpoint/restore_plan.hpp"
#include "host/shard/communicator.hpp"
#include "shard/collective_scenario.hpp"
#include "shard/thread_group.hpp"
#include "tests/io/io_fixtures.hpp"

namespace {

namespace ck = embstore::checkpoint;
using embstore_test::threads::on_ranks;
using embstore_test::threads::write_checkpoint;
using Rows = std::map<int64_t, std::vector<float>>;

void add_rows(const embstore::io::RowBlock& b, Rows* rows, bool keep_first, int* repeats) {
  for (uint32_t i = 0; i < b.rows; ++i) {
    std::vector<float> r(b.values + size_t{i} * b.dim, b.values + size_t{i + 1} * b.dim);
    if (b.state_dim > 0) {
      r.insert(r.end(), b.state + size_t{i} * b.state_dim, b.state + size_t{i + 1} * b.state_dim);
    }
    if (!rows->emplace(b.keys[i], std::move(r)).second) {
      ++*repeats;
      if (!keep_first) FAIL("key " << b.keys[i] << " handed over twice");
    }
  }
}

struct Plan {
  embstore::io::CheckpointDir dir;
  ck::RestorePlan plan;
  explicit Plan(const std::string& path, uint64_t version = EMBSTORE_LATEST) {
    const size_t i = ck::choose_version(path, version, std::nullopt, &dir, nullptr);
    plan = ck::plan_version(dir, i);
  }
};

// Every table's rows at the newest version of path, read by one process.
std::map<std::string, Rows> one_process(const std::string& path) {
  Plan p(path);
  std::map<std::string, Rows> out;
  for (const ck::TablePlan& t : p.plan.tables) {
    embstore::io::ChainReadOptions o;
    o.unique_keys = true;
    int repeats = 0;
    ck::read_table(p.plan, t, o,
                   [&](const embstore::io::RowBlock& b, std::string*) {
                     add_rows(b, &out[t.entry->name], false, &repeats);
                     return 0;
                   },
                   {});
  }
  return out;
}

struct RankRead {
  std::map<std::string, Rows> rows;
  std::vector<embstore::shard::LocalCheck> outcomes;  // one per table
  int repeats = 0;
};

// world ranks route every table of path's newest version, in rounds of round_bytes. fail_at:
// the rank whose sink refuses its n-th block ({-1, 0}: none).
std::vector<RankRead> routed(const std::string& path, int world, bool sink_skips_held,
                             size_t round_bytes, std::pair<int, int> fail_at = {-1, 0},
                             uint64_t version = EMBSTORE_LATEST) {
  std::vector<RankRead> reads(world);
  on_ranks(world, [&](embstore_store_config_t c, int rank) {
    auto comm = embstore::shard::make_callback_communicator(*c.comm_callbacks, rank, world);
    Plan p(path, version);
    RankRead& mine = reads[rank];
    int blocks = 0;
    for (const ck::TablePlan& t : p.plan.tables) {
      embstore::io::ChainReadOptions o;
      o.sink_skips_held = sink_skips_held;
      Rows& rows = mine.rows[t.entry->name];
      const embstore::io::RowSink sink = [&](const embstore::io::RowBlock& b, std::string* why) {
        if (rank == fail_at.first && blocks++ == fail_at.second) {
          *why = "the test's sink refuses this block";
          return -EBADMSG;
        }
        for (uint32_t i = 0; i < b.rows; ++i) {
          if (embstore::row::shard_of(b.keys[i], world) != static_cast<uint32_t>(rank)) {
            *why = "a key of another rank";
            return -EBADMSG;
          }
        }
        add_rows(b, &rows, sink_skips_held, &mine.repeats);
        return 0;
      };
      mine.outcomes.push_back(ck::read_table_routed(*comm, p.plan, t, o, sink, round_bytes));
    }
    return embstore_test::sharded::Outcome{};
  });
  return reads;
}

// A chain of one process with tombstones: a full checkpoint, rows evicted and others updated,
// then a delta.
void write_chain_with_tombstones(const std::string& dir) {
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  embstore_store_t* store = nullptr;
  REQUIRE(embstore_store_create(&sc, &store) == EMBSTORE_OK);
  embstore_table_config_t tc;
  embstore_table_config_init(&tc);
  tc.name = "evicting";
  tc.dim = 6;
  tc.optimizer = EMBSTORE_OPT_ADAGRAD;
  tc.evict_idle_steps = 2;
  embstore_table_t* table = nullptr;
  REQUIRE(embstore_table_create(store, &tc, &table) == EMBSTORE_OK);
  std::vector<int64_t> keys(3000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = static_cast<int64_t>(i * 7919) - 5000;
  std::vector<float> rows(keys.size() * 6), grads(keys.size() * 6, 0.25f);
  REQUIRE(embstore_step(store, 1) == EMBSTORE_OK);
  REQUIRE(embstore_lookup(table, keys.data(), keys.size(), rows.data(), EMBSTORE_LOOKUP_INSERT,
                          nullptr) == EMBSTORE_OK);
  uint64_t v = 0;
  REQUIRE(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, &v) == EMBSTORE_OK);
  REQUIRE(embstore_checkpoint_wait(store, v) == EMBSTORE_OK);
  // At step 2 the first half is touched again; at step 4 the rest is idle and evicted (by
  // embstore_step or embstore_table_evict).
  REQUIRE(embstore_step(store, 2) == EMBSTORE_OK);
  const size_t half = keys.size() / 2;
  REQUIRE(embstore_apply_gradients(table, keys.data(), grads.data(), half, nullptr) == EMBSTORE_OK);
  REQUIRE(embstore_step(store, 4) == EMBSTORE_OK);
  REQUIRE(embstore_table_evict(table, nullptr) == EMBSTORE_OK);
  embstore_table_stats_t stats{};
  stats.struct_size = sizeof stats;
  REQUIRE(embstore_table_stats(table, &stats) == EMBSTORE_OK);
  REQUIRE(stats.evicted == keys.size() - half);
  REQUIRE(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) == EMBSTORE_OK);
  REQUIRE(embstore_checkpoint_wait(store, v) == EMBSTORE_OK);
  REQUIRE(embstore_store_destroy(store) == EMBSTORE_OK);
}

// Each rank holds exactly the reference's rows of the keys it owns.
void check_against(const std::map<std::string, Rows>& reference,
                   const std::vector<RankRead>& reads) {
  const int world = static_cast<int>(reads.size());
  for (const auto& [table, rows] : reference) {
    INFO("table " << table << ", " << world << " ranks");
    size_t total = 0;
    for (int r = 0; r < world; ++r) {
      for (const auto& o : reads[r].outcomes) CHECK(o.status == EMBSTORE_OK);
      const Rows& got = reads[r].rows.at(table);
      total += got.size();
      for (const auto& [key, row] : got) {
        REQUIRE(rows.count(key) == 1);
        CHECK(row == rows.at(key));
      }
    }
    CHECK(total == rows.size());
  }
}

TEST_CASE("Routed reads give each rank its keys' newest rows, tombstones applied",
          "[sharded][routed]") {
  embstore_test::TempDir dir;
  const std::string chain = dir.path() + "/chain";
  write_chain_with_tombstones(chain);
  const auto reference = one_process(chain);
  REQUIRE(reference.at("evicting").size() == 1500);
  for (int world : {2, 3}) {
    for (bool skips_held : {false, true}) {
      INFO(world << " ranks, sink skips held keys: " << skips_held);
      check_against(reference, routed(chain, world, skips_held, 4096));
    }
  }
}

TEST_CASE("Routed reads of three ranks' chain into 2 and 4 ranks", "[sharded][routed]") {
  embstore_test::TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  REQUIRE(write_checkpoint(3, ckpt) == "");
  const auto reference = one_process(ckpt);
  for (int world : {2, 4}) {
    for (bool skips_held : {false, true}) {
      INFO(world << " ranks, sink skips held keys: " << skips_held);
      check_against(reference, routed(ckpt, world, skips_held, 512));
    }
  }
}

TEST_CASE("A failure on one rank ends every rank's routed read", "[sharded][routed]") {
  embstore_test::TempDir dir;
  const std::string chain = dir.path() + "/chain";
  write_chain_with_tombstones(chain);

  SECTION("a sink that refuses a block, after a round delivered one") {
    namespace collective = embstore_test::collective;
    const std::string ckpt = dir.path() + "/ckpt";
    REQUIRE(write_checkpoint(3, ckpt) == "");
    const auto reads = routed(ckpt, 3, false, 512, {1, 1});
    // The first table fails on rank 1 (its second delivery); the others stop there without a
    // failure of their own, and the later tables (the test goes on) read as usual.
    const auto& failing = reads[1].outcomes;
    REQUIRE(failing.size() == collective::kTableCount);
    CHECK(failing[0].status == EMBSTORE_CORRUPT);
    CHECK_THAT(failing[0].message, Catch::Contains("the test's sink refuses"));
    for (size_t t = 1; t < failing.size(); ++t) CHECK(failing[t].status == EMBSTORE_OK);
    for (int r : {0, 2}) {
      for (const auto& o : reads[r].outcomes) CHECK(o.status == EMBSTORE_OK);
    }
  }
  SECTION("a sink that refuses rows of the round that ends the last version") {
    // One version (a full checkpoint), in rounds larger than it: its rows all move in the round
    // that ends it. The failing rank must still find every rank in its next round.
    const std::string ckpt = dir.path() + "/ckpt";
    REQUIRE(write_checkpoint(3, ckpt) == "");
    const auto reads = routed(ckpt, 2, false, size_t{1} << 30, {1, 0}, 2);
    CHECK(reads[1].outcomes[0].status == EMBSTORE_CORRUPT);
    CHECK(reads[0].outcomes[0].status == EMBSTORE_OK);  // stopped: rank 1 failed
    for (int r : {0, 1}) {
      for (size_t t = 1; t < reads[r].outcomes.size(); ++t) {
        CHECK(reads[r].outcomes[t].status == EMBSTORE_OK);
      }
    }
  }
  SECTION("a corrupt row file: only the rank that reads it finds it") {
    std::string delta;
    for (const auto& e : std::filesystem::recursive_directory_iterator(chain)) {
      if (e.path().extension() == ".rows" &&
          e.path().string().find(".delta") != std::string::npos) {
        delta = e.path().string();
      }
    }
    REQUIRE(!delta.empty());
    {
      std::fstream f(delta, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(300);
      f.put('\x5a');
    }
    const auto reads = routed(chain, 2, false, 1024);
    int corrupt = 0;
    for (const RankRead& r : reads) {
      const auto& o = r.outcomes.back();
      if (o.status == EMBSTORE_CORRUPT) {
        ++corrupt;
        CHECK_THAT(o.message, Catch::Contains(".rows"));
      } else {
        CHECK(o.status == EMBSTORE_OK);
      }
    }
    CHECK(corrupt == 1);  // one rank read the file: the other never did
  }
}

}  // namespace
