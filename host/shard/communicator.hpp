// The exchanges a sharded store makes with its other ranks, over the trainer's process group:
// a duplicate of its MPI communicator, or its C callbacks (embstore_comm_callbacks_t). Every
// call is collective (every rank makes it, in the same order) and runs on the calling thread.
// A failed exchange throws Error(COMM_ERROR).
#pragma once

#include <embstore/embstore.h>

#include <cstddef>
#include <memory>

namespace embstore::shard {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Every rank sends `bytes` bytes; recv gets size() * bytes, rank q's at q * bytes.
  virtual void all_gather(const void* send, size_t bytes, void* recv) = 0;
  // send_bytes[q] bytes of send go to rank q, recv_bytes[q] bytes of recv come from rank q;
  // both packed in rank order.
  virtual void all_to_all(const void* send, const size_t* send_bytes, void* recv,
                          const size_t* recv_bytes) = 0;
};

// A duplicate of *(MPI_Comm*)mpi_comm, checked against rank and world_size. Throws
// Error(UNSUPPORTED) in a build without MPI, Error(INVALID_ARGUMENT) on a mismatch or when MPI
// is not initialized.
std::unique_ptr<Communicator> make_mpi_communicator(void* mpi_comm, int rank, int world_size);

// Callbacks (copied), checked for struct_size and NULL functions.
std::unique_ptr<Communicator> make_callback_communicator(const embstore_comm_callbacks_t& callbacks,
                                                         int rank, int world_size);

// Whether this build carries the MPI communicator.
bool mpi_built();

}  // namespace embstore::shard
