#include <cstring>

#include "host/error.hpp"
#include "host/shard/communicator.hpp"

namespace embstore::shard {

namespace {

class CallbackCommunicator final : public Communicator {
 public:
  CallbackCommunicator(const embstore_comm_callbacks_t& callbacks, int rank, int size)
      : callbacks_(callbacks), rank_(rank), size_(size) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // A caller's callbacks are checked where they can be: a rank's own part must come back as
  // it was sent (a communicator that hands back zeros used to make a restore from an empty
  // directory, or a checkpoint that wrote nothing, return OK).
  void all_gather(const void* send, size_t bytes, void* recv) override {
    check(callbacks_.all_gather(callbacks_.context, send, bytes, recv), "all_gather");
    const char* own = static_cast<const char*>(recv) + size_t(rank_) * bytes;
    if (bytes > 0 && std::memcmp(own, send, bytes) != 0) impossible("all_gather");
  }

  void all_to_all(const void* send, const size_t* send_bytes, void* recv,
                  const size_t* recv_bytes) override {
    check(callbacks_.all_to_all(callbacks_.context, send, send_bytes, recv, recv_bytes),
          "all_to_all");
    size_t sent_before = 0, received_before = 0;
    for (int r = 0; r < rank_; ++r) {
      sent_before += send_bytes[r];
      received_before += recv_bytes[r];
    }
    const size_t own = send_bytes[rank_];
    if (recv_bytes[rank_] != own ||
        (own > 0 && std::memcmp(static_cast<const char*>(recv) + received_before,
                                static_cast<const char*>(send) + sent_before, own) != 0)) {
      impossible("all_to_all");
    }
  }

 private:
  void check(int result, const char* what) const {
    if (result != 0) {
      fail(EMBSTORE_COMM_ERROR, "rank {}: the {} callback returned {}", rank_, what, result);
    }
  }
  [[noreturn]] void impossible(const char* what) const {
    fail(EMBSTORE_COMM_ERROR,
         "rank {}: the {} callback returned 0 but not this rank's own part as sent: the "
         "communicator does not exchange what it is given",
         rank_, what);
  }

  embstore_comm_callbacks_t callbacks_;
  int rank_, size_;
};

}  // namespace

std::unique_ptr<Communicator> make_callback_communicator(const embstore_comm_callbacks_t& callbacks,
                                                         int rank, int world_size) {
  if (callbacks.struct_size < sizeof(embstore_comm_callbacks_t)) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "comm_callbacks struct_size is {}, expected {}: fill it with "
         "embstore_comm_callbacks_init",
         callbacks.struct_size, sizeof(embstore_comm_callbacks_t));
  }
  if (callbacks.all_gather == nullptr || callbacks.all_to_all == nullptr) {
    fail(EMBSTORE_INVALID_ARGUMENT, "comm_callbacks: all_gather and all_to_all must be set");
  }
  return std::make_unique<CallbackCommunicator>(callbacks, rank, world_size);
}

}  // namespace embstore::shard
