// Sharded stores over the callback table (embstore_comm_callbacks_t): W ranks as W threads of
// this process, exchanging through shared memory. The same scenario as the MPI test
// (sharded_scenario.hpp), so it also runs under the sanitizers, which leave MPI out.
#include <embstore/embstore.h>

#include <barrier>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"
#include "shard/collective_scenario.hpp"
#include "shard/sharded_scenario.hpp"
#include "shard/thread_group.hpp"
#include "tests/io/io_fixtures.hpp"

namespace {

using namespace embstore_test::threads;

}  // namespace

TEST_CASE("W ranks training sharded equal one process on their concatenated batches", "[sharded]") {
  for (int world = 1; world <= 4; ++world) {
    const std::vector<embstore_test::sharded::Outcome> outcomes = on_ranks(
        world,
        [&](embstore_store_config_t c, int r) { return embstore_test::sharded::run(c, r, world); });
    for (int r = 0; r < world; ++r) {
      INFO("world " << world << ": " << outcomes[r].first);
      CHECK(outcomes[r].failures == 0);
    }
  }
}

TEST_CASE("A failing exchange fails the sharded call with COMM_ERROR on every rank", "[sharded]") {
  constexpr int kWorld = 3;
  Group group(kWorld);
  std::vector<Member> members(kWorld);
  std::vector<embstore_status_t> first(kWorld), second(kWorld);
  std::vector<std::string> messages(kWorld);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    members[r] = {&group, r};
    ranks.emplace_back([&, r] {
      embstore_comm_callbacks_t callbacks;
      const embstore_store_config_t c = config_for(&members[r], &callbacks);
      embstore_store_t* store = nullptr;
      if (embstore_store_create(&c, &store) != EMBSTORE_OK) return;
      embstore_table_config_t tc;
      embstore_table_config_init(&tc);
      tc.name = "t";
      tc.dim = 4;
      embstore_table_t* table = nullptr;
      embstore_table_create(store, &tc, &table);
      const int64_t keys[3] = {r * 10 + 1, r * 10 + 2, 7};
      float rows[12];
      first[r] = embstore_sharded_lookup(table, keys, 3, rows, EMBSTORE_LOOKUP_INSERT, nullptr);
      group.barrier.arrive_and_wait();
      if (r == 0) group.fail_all_to_all_from = members[0].all_to_all_calls;  // from now on
      group.barrier.arrive_and_wait();
      second[r] = embstore_sharded_lookup(table, keys, 3, rows, EMBSTORE_LOOKUP_INSERT, nullptr);
      messages[r] = embstore_last_error();
      embstore_store_destroy(store);
    });
  }
  for (std::thread& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) {
    INFO("rank " << r << ": " << messages[r]);
    CHECK(first[r] == EMBSTORE_OK);
    CHECK(second[r] == EMBSTORE_COMM_ERROR);
    CHECK(messages[r].find("all_to_all callback returned 5") != std::string::npos);
  }
}

TEST_CASE("A communicator failing while a checkpoint is written fails that checkpoint only",
          "[sharded][checkpoint]") {
  // embstore_step first settles a checkpoint in flight with an all_gather. When that one
  // exchange fails while this rank's writer still works on the version, the version fails (wait
  // reports COMM_ERROR), the step itself goes on, and so does the store: the writer finishes
  // with the job before the job ends (it once ended under the writer, a use after free).
  constexpr int kWorld = 2;
  const embstore_test::TempDir dir;
  for (int round = 0; round < 3; ++round) {
    Group group(kWorld);
    group.fail_all_gather_count = 1;
    std::vector<Member> members(kWorld);
    std::vector<embstore_status_t> step(kWorld), wait(kWorld), later(kWorld), destroy(kWorld);
    std::vector<std::string> messages(kWorld);
    std::vector<std::thread> ranks;
    for (int r = 0; r < kWorld; ++r) {
      members[r] = {&group, r};
      ranks.emplace_back([&, r] {
        // No Catch2 assertion on these threads (it is not thread-safe): outcomes are checked
        // after the join. A setup failure here would leave the other rank in a barrier, so
        // the setup cannot fail short of a broken library, which then aborts the test.
        const auto ok = [](embstore_status_t s) {
          if (s != EMBSTORE_OK) std::abort();
        };
        embstore_comm_callbacks_t callbacks;
        const embstore_store_config_t c = config_for(&members[r], &callbacks);
        embstore_store_t* store = nullptr;
        ok(embstore_store_create(&c, &store));
        embstore_table_config_t tc;
        embstore_table_config_init(&tc);
        tc.name = "t";
        tc.dim = 64;
        embstore_table_t* table = nullptr;
        ok(embstore_table_create(store, &tc, &table));
        // Enough rows that the writer is still at work when step settles.
        std::vector<int64_t> keys(20000);
        for (size_t i = 0; i < keys.size(); ++i) keys[i] = int64_t(i) * kWorld + r;
        std::vector<float> rows(keys.size() * 64);
        ok(embstore_sharded_lookup(table, keys.data(), keys.size(), rows.data(),
                                   EMBSTORE_LOOKUP_INSERT, nullptr));
        ok(embstore_step(store, 1));
        uint64_t version = 0;
        const std::string d = dir.path() + "/round" + std::to_string(round);
        ok(embstore_checkpoint(store, d.c_str(), EMBSTORE_CKPT_FULL, &version));
        group.barrier.arrive_and_wait();
        if (r == 0) group.fail_all_gather_from = members[0].all_gather_calls;  // from now on
        group.barrier.arrive_and_wait();
        step[r] = embstore_step(store, 2);
        wait[r] = embstore_checkpoint_wait(store, version);
        messages[r] = embstore_last_error();
        later[r] =
            embstore_sharded_lookup(table, keys.data(), keys.size(), rows.data(), 0, nullptr);
        destroy[r] = embstore_store_destroy(store);
      });
    }
    for (std::thread& t : ranks) t.join();
    for (int r = 0; r < kWorld; ++r) {
      INFO("round " << round << " rank " << r << ": " << messages[r]);
      CHECK(step[r] == EMBSTORE_OK);  // a checkpoint's failure, not the step's
      CHECK(wait[r] == EMBSTORE_COMM_ERROR);
      CHECK(messages[r].find("all_gather callback returned 6") != std::string::npos);
      CHECK(later[r] == EMBSTORE_OK);
      CHECK(destroy[r] == EMBSTORE_OK);
    }
  }
}

TEST_CASE("Sharded store configs are checked", "[sharded]") {
  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = EMBSTORE_BACKEND_HOST;
  c.world_size = 2;
  c.rank = 1;
  embstore_store_t* store = nullptr;
  CHECK(embstore_store_create(&c, &store) == EMBSTORE_INVALID_ARGUMENT);  // no communicator
  CHECK(std::string(embstore_last_error()).find("neither") != std::string::npos);
  CHECK(store == nullptr);

  Group group(2);
  Member member{&group, 1};
  embstore_comm_callbacks_t callbacks;
  c = config_for(&member, &callbacks);
  int not_mpi = 0;
  c.mpi_comm = &not_mpi;
  CHECK(embstore_store_create(&c, &store) == EMBSTORE_INVALID_ARGUMENT);  // both
  CHECK(std::string(embstore_last_error()).find("both") != std::string::npos);

  c.mpi_comm = nullptr;
  callbacks.all_to_all = nullptr;
  CHECK(embstore_store_create(&c, &store) == EMBSTORE_INVALID_ARGUMENT);  // a NULL function
  callbacks.all_to_all = all_to_all;
  callbacks.struct_size = sizeof(size_t);
  CHECK(embstore_store_create(&c, &store) == EMBSTORE_INVALID_ARGUMENT);  // struct_size
  callbacks.struct_size = sizeof(callbacks);
  c.rank = 2;
  CHECK(embstore_store_create(&c, &store) == EMBSTORE_INVALID_ARGUMENT);  // rank outside
  c.rank = 1;
  // A sharded CUDA store needs nccl_comm beside the control communicator; without a usable
  // device (or NCCL) it is UNSUPPORTED first.
  embstore_store_config_t one;
  embstore_store_config_init(&one);
  one.backend = EMBSTORE_BACKEND_CUDA;
  embstore_store_t* probe = nullptr;
  const bool cuda_usable = embstore_store_create(&one, &probe) == EMBSTORE_OK;
  embstore_store_destroy(probe);
  c.backend = EMBSTORE_BACKEND_CUDA;
  CHECK(embstore_store_create(&c, &store) ==
        (cuda_usable ? EMBSTORE_INVALID_ARGUMENT : EMBSTORE_UNSUPPORTED));
  CHECK(store == nullptr);
  if (!cuda_usable) {
    // AUTO takes nccl_comm as asking for CUDA (never left to a device check that could differ
    // between ranks), and says why it cannot.
    int not_nccl = 0;
    c.backend = EMBSTORE_BACKEND_AUTO;
    c.nccl_comm = &not_nccl;
    CHECK(embstore_store_create(&c, &store) == EMBSTORE_UNSUPPORTED);
    CHECK(std::string(embstore_last_error()).find("nccl_comm") != std::string::npos);
    c.nccl_comm = nullptr;
  }

  // A rank may create its sharded store alone (callbacks are not called at create).
  c.backend = EMBSTORE_BACKEND_HOST;
  REQUIRE(embstore_store_create(&c, &store) == EMBSTORE_OK);
  embstore_table_config_t tc;
  embstore_table_config_init(&tc);
  tc.name = "t";
  tc.dim = 2;
  embstore_table_t* table = nullptr;
  REQUIRE(embstore_table_create(store, &tc, &table) == EMBSTORE_OK);
  int64_t own = 0;
  while (embstore_shard_of(own, 2) != 1) ++own;
  float row[2];
  CHECK(embstore_lookup(table, &own, 1, row, EMBSTORE_LOOKUP_INSERT, nullptr) == EMBSTORE_OK);
  CHECK(embstore_sharded_lookup(nullptr, &own, 1, row, 0, nullptr) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(embstore_store_destroy(store) == EMBSTORE_OK);
}

TEST_CASE("Collective checkpoints of W ranks restore into W' ranks as one process's tables",
          "[sharded][checkpoint]") {
  namespace collective = embstore_test::collective;
  for (int writers = 1; writers <= 4; ++writers) {
    embstore_test::TempDir dir;
    const std::string ckpt = dir.path() + "/ckpt";
    REQUIRE(write_checkpoint(writers, ckpt) == "");
    for (int world = 1; world <= 4; ++world) {
      for (uint64_t version : collective::kVersions) {
        std::vector<embstore_test::sharded::Outcome> outcomes;
        if (world == 1) {  // one process, without any communicator
          embstore_store_config_t c;
          embstore_store_config_init(&c);
          c.backend = EMBSTORE_BACKEND_HOST;
          c.host_threads = 1;
          outcomes.push_back(collective::restore(c, 0, 1, ckpt, writers, version));
        } else {
          outcomes = on_ranks(world, [&](embstore_store_config_t c, int r) {
            return collective::restore(c, r, world, ckpt, writers, version);
          });
        }
        for (const auto& o : outcomes) {
          INFO(o.first);
          CHECK(o.failures == 0);
        }
      }
    }
  }
}

TEST_CASE("A restore into another world size reads each row file on one rank only",
          "[sharded][checkpoint]") {
  embstore_test::TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  REQUIRE(write_checkpoint(3, ckpt) == "");
  // A flipped byte in rank 1's file of "users" at version 2: the restore into 2 ranks fails
  // on both, and only the rank that read the file names it (the other was told).
  const std::string name =
      embstore::io::row_file_path(embstore::io::kManifestFormatVersion, "users", 1, 3);
  const std::string file = ckpt + "/00000000000000000002.full/" + name;
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(f.good());
    f.seekp(200);
    f.put('\x33');
  }
  std::vector<std::string> errors(2);
  for (const auto& o : on_ranks(2, [&](embstore_store_config_t c, int r) {
         embstore_test::sharded::Outcome out;
         embstore_store_t* store = nullptr;
         out.expect_status(embstore_store_create(&c, &store), EMBSTORE_OK, "store_create");
         out.expect_status(embstore_restore(store, ckpt.c_str(), 2, nullptr), EMBSTORE_CORRUPT,
                           "restore");
         errors[r] = embstore_last_error();
         embstore_table_t* t = nullptr;
         out.expect_status(embstore_table_get(store, "users", &t), EMBSTORE_NOT_FOUND,
                           "no table after the failed restore");
         out.expect_status(embstore_store_destroy(store), EMBSTORE_OK, "store_destroy");
         return out;
       })) {
    INFO(o.first);
    CHECK(o.failures == 0);
  }
  INFO("rank 0: " << errors[0] << "\nrank 1: " << errors[1]);
  const int naming =
      (errors[0].find(name) != std::string::npos) + (errors[1].find(name) != std::string::npos);
  CHECK(naming == 1);
}

TEST_CASE("Warm start from three ranks' versions into W' ranks equals one process's",
          "[sharded][warm_start]") {
  namespace collective = embstore_test::collective;
  constexpr int kWriters = 3;
  embstore_test::TempDir dir;
  const std::string ckpt = dir.path() + "/ckpt";
  REQUIRE(write_checkpoint(kWriters, ckpt) == "");
  for (int world : {2, 4}) {
    for (const auto& o : on_ranks(world, [&](embstore_store_config_t c, int r) {
           return collective::warm_start(c, r, world, ckpt, kWriters);
         })) {
      INFO(o.first);
      CHECK(o.failures == 0);
    }
  }
}

TEST_CASE("A checkpoint policy of a sharded store: rank 0 commits, decides and keeps keep_full",
          "[sharded][checkpoint]") {
  namespace collective = embstore_test::collective;
  namespace sharded = embstore_test::sharded;
  constexpr int kWorld = 3;
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  for (const auto& o : on_ranks(kWorld, [&](embstore_store_config_t c, int r) {
         sharded::Outcome out;
         const std::string at = "rank " + std::to_string(r) + ": ";
         embstore_store_t* store = nullptr;
         out.expect_status(embstore_store_create(&c, &store), EMBSTORE_OK, at + "create");
         if (store == nullptr) return out;
         const auto tables = collective::create_tables(store, out, at);
         embstore_checkpoint_policy_t policy;
         embstore_checkpoint_policy_init(&policy);
         policy.dir = dir.c_str();
         policy.full_every_steps = 4;
         policy.incremental_every_steps = 2;
         policy.keep_full = 1;
         policy.rebaseline_fraction = 0;
         // Every rank sets it; only rank 0 takes the directory's writer lock.
         out.expect_status(embstore_checkpoint_set_policy(store, &policy), EMBSTORE_OK,
                           at + "set_policy");
         for (int step = 1; step <= 8; ++step) {
           out.expect_status(embstore_step(store, step), EMBSTORE_OK,
                             at + "step " + std::to_string(step));
           collective::train_step(tables, r, kWorld, true, step, out, at);
           // Steps 2, 4, 6 and 8 take one each (4 and 8 full). These steps are faster than
           // the writes: without the wait, one would still be in flight when the next is due
           // (and that one deferred).
           if (step % 2 == 0) {
             out.expect_status(embstore_checkpoint_wait(store, step), EMBSTORE_OK,
                               at + "wait " + std::to_string(step));
           }
         }
         embstore_checkpoint_stats_t s{};
         s.struct_size = sizeof(s);
         embstore_checkpoint_stats(store, &s);
         // Step 2's incremental is taken as full: there is no parent yet.
         out.expect(s.committed == 4 && s.deltas_committed == 1 && s.failed == 0,
                    at + std::to_string(s.committed) + " committed, " +
                        std::to_string(s.deltas_committed) + " deltas");
         out.expect_status(embstore_store_destroy(store), EMBSTORE_OK, at + "destroy");
         return out;
       })) {
    INFO(o.first);
    CHECK(o.failures == 0);
  }
  // keep_full 1: version 8 alone is left (rank 0 retired 2, 4 and 6), and restores as one
  // process's tables after 7 steps (the step boundary of step 8 took it, before its training).
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name != "embstore.lock") names.push_back(name);
  }
  CHECK(names == std::vector<std::string>{"00000000000000000008.full"});
  embstore_store_config_t one;
  embstore_store_config_init(&one);
  one.backend = EMBSTORE_BACKEND_HOST;
  const auto o = collective::restore(one, 0, 1, dir, kWorld, 8, 0, 7);
  INFO(o.first);
  CHECK(o.failures == 0);
}

TEST_CASE("A policy set on rank 0 only fails the step on every rank, without a hang",
          "[sharded][checkpoint]") {
  constexpr int kWorld = 2;
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  std::vector<embstore_status_t> at_step_2(kWorld);
  on_ranks(kWorld, [&](embstore_store_config_t c, int r) {
    embstore_test::sharded::Outcome out;
    embstore_store_t* store = nullptr;
    if (embstore_store_create(&c, &store) != EMBSTORE_OK) return out;
    if (r == 0) {
      embstore_checkpoint_policy_t policy;
      embstore_checkpoint_policy_init(&policy);
      policy.dir = dir.c_str();
      policy.full_every_steps = 2;
      embstore_checkpoint_set_policy(store, &policy);
    }
    embstore_step(store, 1);
    at_step_2[r] = embstore_step(store, 2);
    embstore_store_destroy(store);
    return out;
  });
  CHECK(at_step_2[0] == EMBSTORE_INVALID_ARGUMENT);
  CHECK(at_step_2[1] == EMBSTORE_INVALID_ARGUMENT);
}

TEST_CASE("Ranks passing different lookup flags fail together", "[sharded]") {
  constexpr int kWorld = 2;
  std::vector<embstore_status_t> got(kWorld);
  std::vector<uint64_t> rows(kWorld);
  on_ranks(kWorld, [&](embstore_store_config_t c, int r) {
    embstore_test::sharded::Outcome out;
    embstore_store_t* store = nullptr;
    if (embstore_store_create(&c, &store) != EMBSTORE_OK) return out;
    embstore_table_config_t tc;
    embstore_table_config_init(&tc);
    tc.name = "t";
    tc.dim = 2;
    embstore_table_t* table = nullptr;
    embstore_table_create(store, &tc, &table);
    const int64_t keys[4] = {1, 2, 3, 4};
    float values[8];
    got[r] = embstore_sharded_lookup(table, keys, 4, values, r == 0 ? EMBSTORE_LOOKUP_INSERT : 0,
                                     nullptr);
    embstore_table_stats_t s{};
    s.struct_size = sizeof(s);
    embstore_table_stats(table, &s);
    rows[r] = s.rows;
    embstore_store_destroy(store);
    return out;
  });
  CHECK(got[0] == EMBSTORE_INVALID_ARGUMENT);
  CHECK(got[1] == EMBSTORE_INVALID_ARGUMENT);
  CHECK(rows[0] + rows[1] == 0);  // nothing inserted anywhere
}

namespace {

// A communicator that exchanges nothing and says it did: every buffer comes back zeroed.
int zeros_all_gather(void*, const void*, size_t bytes, void* recv) {
  std::memset(recv, 0, 2 * bytes);
  return 0;
}
int zeros_all_to_all(void*, const void*, const size_t*, void* recv, const size_t* recv_bytes) {
  std::memset(recv, 0, recv_bytes[0] + recv_bytes[1]);
  return 0;
}

}  // namespace

TEST_CASE("A communicator that hands back zeros fails collectives with COMM_ERROR, never OK",
          "[sharded]") {
  // It used to make a restore from a directory without a checkpoint return OK (version 0), and
  // a checkpoint return OK without writing one.
  embstore_test::TempDir dir;
  embstore_comm_callbacks_t callbacks;
  embstore_comm_callbacks_init(&callbacks);
  callbacks.all_gather = zeros_all_gather;
  callbacks.all_to_all = zeros_all_to_all;
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    embstore_store_config_t c;
    embstore_store_config_init(&c);
    c.backend = EMBSTORE_BACKEND_HOST;
    c.rank = rank;
    c.world_size = 2;
    c.comm_callbacks = &callbacks;
    embstore_store_t* store = nullptr;
    const embstore_status_t created = embstore_store_create(&c, &store);
    if (created != EMBSTORE_OK) {
      REQUIRE(created == EMBSTORE_COMM_ERROR);
      continue;
    }
    uint64_t version = 12345;
    const embstore_status_t restored =
        embstore_restore(store, dir.path().c_str(), EMBSTORE_LATEST, &version);
    INFO(embstore_last_error());
    CHECK(restored == EMBSTORE_COMM_ERROR);
    CHECK(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version) !=
          EMBSTORE_OK);
    embstore_store_destroy(store);
  }
}
