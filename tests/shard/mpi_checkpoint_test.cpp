// Collective checkpoints over MPI, run by ctest under `mpirun -np 4`:
//   mpi_checkpoint_test W DIR   ranks 0..W-1 (a communicator split off MPI_COMM_WORLD) train
//                               and checkpoint into DIR; then, for every W' in 1..4, ranks
//                               0..W'-1 restore each version and compare with one process
//                               (collective_scenario.hpp); W' = 1 is one store without any
//                               communicator. With W = 3, ranks 0 and 1 also warm-start from
//                               three of its versions (collective_scenario.hpp).
//   mpi_checkpoint_test kill W DIR MS
//                               W ranks train and checkpoint at step 2 (waited for) and step 4,
//                               where rank 1 kills itself with SIGKILL MS milliseconds after the
//                               capture (0: while its files are being written; 300: after, while
//                               the others wait for it to settle): mpirun then ends every rank
//   mpi_checkpoint_test check-killed W DIR
//                               (one process) after that: version 2 is the newest, it restores
//                               as one process's tables, and no part of version 4 is visible
// Exit 0 when every rank passes. Not Catch2: the ranks agree on the outcome through MPI.
#include <mpi.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "shard/collective_scenario.hpp"

namespace {

embstore_store_config_t config_of(MPI_Comm* comm, int rank, int world) {
  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = EMBSTORE_BACKEND_HOST;
  c.host_threads = 1;
  c.rank = rank;
  c.world_size = world;
  if (world > 1) c.mpi_comm = comm;
  return c;
}

// Ranks below `world` as a communicator of their own (MPI_COMM_NULL for the others).
MPI_Comm first_ranks(int world) {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm part;
  MPI_Comm_split(MPI_COMM_WORLD, rank < world ? 0 : MPI_UNDEFINED, rank, &part);
  return part;
}

// W ranks train and checkpoint at steps 2 and 4; rank 1 dies during the second.
int write_until_killed(int writers, const std::string& dir, int delay_ms) {
  namespace collective = embstore_test::collective;
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Comm comm = MPI_COMM_WORLD;
  embstore_store_t* store = nullptr;
  const embstore_store_config_t c = config_of(&comm, rank, writers);
  if (embstore_store_create(&c, &store) != EMBSTORE_OK) return 1;
  embstore_test::sharded::Outcome out;
  const std::vector<embstore_table_t*> tables = collective::create_tables(store, out, "");
  for (int step = 1; step <= 6; ++step) {
    embstore_step(store, static_cast<uint64_t>(step));
    collective::train_step(tables, rank, writers, true, step, out, "");
    if (step == 2 || step == 4) {
      const std::string note = collective::attachment_of(rank, static_cast<uint64_t>(step));
      embstore_checkpoint_attach(store, "note", note.data(), note.size());
      if (embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, nullptr) != EMBSTORE_OK) {
        std::fprintf(stderr, "rank %d: checkpoint %d: %s\n", rank, step, embstore_last_error());
        return 1;
      }
      if (step == 2 && embstore_checkpoint_wait(store, 2) != EMBSTORE_OK) return 1;
      if (step == 4 && rank == 1) {
        ::usleep(static_cast<useconds_t>(delay_ms) * 1000);
        ::raise(SIGKILL);
      }
    }
  }
  // Not reached by any rank: rank 1 is gone, so version 4 never settles, and mpirun ends the
  // others when it sees rank 1 die.
  std::fprintf(stderr, "rank %d: went on past a dead rank\n", rank);
  return 3;
}

// One process: version 2 restores as one process's tables; version 4 left nothing visible.
int check_killed(int writers, const std::string& dir) {
  namespace collective = embstore_test::collective;
  embstore_test::sharded::Outcome out;
  int versions = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name == "embstore.lock") continue;  // ignored by readers
    ++versions;
    out.expect(name == "00000000000000000002.full", "a version directory '" + name + "'");
  }
  out.expect(versions == 1, std::to_string(versions) + " version directories");
  embstore_store_config_t c = config_of(nullptr, 0, 1);
  embstore_store_t* store = nullptr;
  embstore_store_create(&c, &store);
  uint64_t restored = 0;
  out.expect_status(embstore_restore(store, dir.c_str(), EMBSTORE_LATEST, &restored), EMBSTORE_OK,
                    "restore of the latest version");
  out.expect(restored == 2, "the latest version is " + std::to_string(restored));
  embstore_store_destroy(store);
  const embstore_test::sharded::Outcome o = collective::restore(c, 0, 1, dir, writers, 2);
  out.failures += o.failures;
  if (out.first.empty()) out.first = o.first;
  if (out.failures > 0) std::fprintf(stderr, "check-killed: %s\n", out.first.c_str());
  std::printf("check-killed: %ld failures\n", out.failures);
  return out.failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc == 5 && std::string(argv[1]) == "kill") {
    const int code = write_until_killed(std::atoi(argv[2]), argv[3], std::atoi(argv[4]));
    MPI_Finalize();
    return code;
  }
  if (argc == 4 && std::string(argv[1]) == "check-killed") {
    const int code = check_killed(std::atoi(argv[2]), argv[3]);
    MPI_Finalize();
    return code;
  }
  if (argc != 3) {
    if (rank == 0) {
      std::fprintf(stderr, "usage: mpi_checkpoint_test [kill|check-killed] W DIR\n");
    }
    MPI_Finalize();
    return 2;
  }
  const int writers = std::atoi(argv[1]);
  const std::string dir = argv[2];
  namespace collective = embstore_test::collective;
  embstore_test::sharded::Outcome out;
  if (rank == 0) {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
  MPI_Barrier(MPI_COMM_WORLD);

  MPI_Comm comm = first_ranks(writers);
  if (comm != MPI_COMM_NULL) {
    out = collective::write(config_of(&comm, rank, writers), rank, writers, dir);
    MPI_Comm_free(&comm);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  for (int world = 1; world <= size; ++world) {
    for (uint64_t version : collective::kVersions) {
      MPI_Comm part = first_ranks(world);
      if (part == MPI_COMM_NULL) continue;
      const embstore_test::sharded::Outcome o =
          collective::restore(config_of(&part, rank, world), rank, world, dir, writers, version);
      if (o.failures > 0 && out.failures == 0) out.first = o.first;
      out.failures += o.failures;
      MPI_Comm_free(&part);
    }
  }
  // Warm start from three versions of three ranks into two (mpirun -np 4 for every W).
  if (writers == 3) {
    MPI_Comm part = first_ranks(2);
    if (part != MPI_COMM_NULL) {
      const embstore_test::sharded::Outcome o =
          collective::warm_start(config_of(&part, rank, 2), rank, 2, dir, writers);
      if (o.failures > 0 && out.failures == 0) out.first = o.first;
      out.failures += o.failures;
      MPI_Comm_free(&part);
    }
  }

  long failures = out.failures, total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (out.failures > 0) {
    std::fprintf(stderr, "rank %d: %ld failures, first: %s\n", rank, out.failures,
                 out.first.c_str());
  }
  if (rank == 0) {
    std::printf("mpi_checkpoint_test: %d writers, restored into 1..%d ranks%s: %ld failures\n",
                writers, size, writers == 3 ? " and warm-started into 2" : "", total);
    std::error_code ec;
    // EMBSTORE_TEST_KEEP=1 keeps the checkpoint for a look (embstore-ckpt ls DIR).
    if (total == 0 && std::getenv("EMBSTORE_TEST_KEEP") == nullptr) {
      std::filesystem::remove_all(dir, ec);
    }
  }
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
