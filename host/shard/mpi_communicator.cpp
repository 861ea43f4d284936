// The MPI communicator of a sharded store: a duplicate of the trainer's, with errors returned
// (not fatal) so that a failed exchange becomes COMM_ERROR. Built where CMake finds MPI.
#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "host/error.hpp"
#include "host/shard/communicator.hpp"

namespace embstore::shard {

namespace {

// MPI counts are ints: larger messages travel in pieces of this many bytes. Messages between
// two ranks on one communicator and tag arrive in the order they were sent.
constexpr size_t kPieceBytes = size_t{1} << 30;
constexpr int kTag = 16016;

std::string mpi_error_text(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<size_t>(length));
}

void check(int code, int rank, const char* what) {
  if (code != MPI_SUCCESS) {
    fail(EMBSTORE_COMM_ERROR, "rank {}: {} failed: {}", rank, what, mpi_error_text(code));
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}

  ~MpiCommunicator() override {
    int finalized = 1;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_gather(const void* send, size_t bytes, void* recv) override {
    if (bytes > static_cast<size_t>(INT_MAX)) {
      fail(EMBSTORE_INTERNAL, "all_gather of {} bytes per rank", bytes);
    }
    const int count = static_cast<int>(bytes);
    check(MPI_Allgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_), rank_,
          "MPI_Allgather");
  }

  void all_to_all(const void* send, const size_t* send_bytes, void* recv,
                  const size_t* recv_bytes) override {
    if (send_bytes[rank_] != recv_bytes[rank_]) {  // before anything is posted
      fail(EMBSTORE_INTERNAL, "rank {} sends itself {} bytes but expects {}", rank_,
           send_bytes[rank_], recv_bytes[rank_]);
    }
    std::vector<MPI_Request> requests;
    const auto* out = static_cast<const char*>(send);
    auto* in = static_cast<char*>(recv);
    size_t send_at = 0, recv_at = 0, self_send_at = 0, self_recv_at = 0;
    for (int q = 0; q < size_; ++q) {
      if (q == rank_) {
        self_recv_at = recv_at;
        self_send_at = send_at;
      } else {
        post(in + recv_at, recv_bytes[q], q, /*receive=*/true, &requests);
        post(const_cast<char*>(out + send_at), send_bytes[q], q, /*receive=*/false, &requests);
      }
      send_at += send_bytes[q];
      recv_at += recv_bytes[q];
    }
    if (send_bytes[rank_] > 0)
      std::memcpy(in + self_recv_at, out + self_send_at, send_bytes[rank_]);
    check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE),
          rank_, "MPI_Waitall of the all-to-all");
  }

 private:
  void post(char* data, size_t bytes, int peer, bool receive, std::vector<MPI_Request>* requests) {
    for (size_t at = 0; at < bytes; at += kPieceBytes) {
      const int count = static_cast<int>(std::min(kPieceBytes, bytes - at));
      MPI_Request request;
      const int code = receive ? MPI_Irecv(data + at, count, MPI_BYTE, peer, kTag, comm_, &request)
                               : MPI_Isend(data + at, count, MPI_BYTE, peer, kTag, comm_, &request);
      if (code != MPI_SUCCESS) {
        // Requests already posted still refer to the buffers: finish them before throwing.
        MPI_Waitall(static_cast<int>(requests->size()), requests->data(), MPI_STATUSES_IGNORE);
        check(code, rank_, receive ? "MPI_Irecv" : "MPI_Isend");
      }
      requests->push_back(request);
    }
  }

  MPI_Comm comm_;
  int rank_, size_;
};

}  // namespace

bool mpi_built() { return true; }

std::unique_ptr<Communicator> make_mpi_communicator(void* mpi_comm, int rank, int world_size) {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) {
    fail(EMBSTORE_INVALID_ARGUMENT, "mpi_comm given but MPI is {}",
         finalized ? "finalized" : "not initialized");
  }
  const MPI_Comm given = *static_cast<const MPI_Comm*>(mpi_comm);
  int given_rank = -1, given_size = 0;
  if (MPI_Comm_rank(given, &given_rank) != MPI_SUCCESS ||
      MPI_Comm_size(given, &given_size) != MPI_SUCCESS) {
    fail(EMBSTORE_INVALID_ARGUMENT, "mpi_comm is not a valid communicator");
  }
  if (given_rank != rank || given_size != world_size) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "mpi_comm has rank {} of {}, but the config says rank {} of world_size {}", given_rank,
         given_size, rank, world_size);
  }
  MPI_Comm dup;
  check(MPI_Comm_dup(given, &dup), rank, "MPI_Comm_dup");
  MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
  return std::make_unique<MpiCommunicator>(dup, rank, world_size);
}

}  // namespace embstore::shard
