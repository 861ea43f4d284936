// Sharded stores over MPI, run by ctest under `mpirun -np W`: each rank creates its store with
// MPI_COMM_WORLD (embstore duplicates it), trains sharded and checks itself against one process
// on the concatenated batches (sharded_scenario.hpp). Also a config whose world_size disagrees
// with the communicator. Exit 0 when every rank passes. Not Catch2: the ranks agree on the
// outcome through MPI.
#include <mpi.h>

#include <cstdio>

#include "shard/sharded_scenario.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_SERIALIZED, &provided);
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  MPI_Comm comm = MPI_COMM_WORLD;

  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = EMBSTORE_BACKEND_HOST;
  c.host_threads = 1;
  c.rank = rank;
  c.world_size = world;
  c.mpi_comm = &comm;
  embstore_test::sharded::Outcome outcome = embstore_test::sharded::run(c, rank, world);

  // A communicator of another size than the config's: refused before anything collective.
  embstore_store_config_t wrong = c;
  wrong.world_size = world + 1;
  embstore_store_t* store = nullptr;
  outcome.expect_status(embstore_store_create(&wrong, &store), EMBSTORE_INVALID_ARGUMENT,
                        "a config of world_size " + std::to_string(world + 1) + " over " +
                            std::to_string(world) + " MPI ranks");

  // The trainer's own collectives still work beside embstore's (no message was matched).
  long failures = outcome.failures, total = 0;
  MPI_Allreduce(&failures, &total, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  if (outcome.failures > 0) {
    std::fprintf(stderr, "rank %d: %ld failures, first: %s\n", rank, outcome.failures,
                 outcome.first.c_str());
  }
  if (rank == 0) std::printf("mpi_sharded_test: %d ranks, %ld failures\n", world, total);
  MPI_Finalize();
  return total == 0 ? 0 : 1;
}
