// A build without MPI: sharded stores take callbacks only.
#include "host/error.hpp"
#include "host/shard/communicator.hpp"

namespace embstore::shard {

bool mpi_built() { return false; }

std::unique_ptr<Communicator> make_mpi_communicator(void* /*mpi_comm*/, int /*rank*/,
                                                    int /*world_size*/) {
  fail(EMBSTORE_UNSUPPORTED,
       "mpi_comm given, but this build of embstore has no MPI (build where CMake finds MPI, or "
       "pass comm_callbacks)");
}

}  // namespace embstore::shard
