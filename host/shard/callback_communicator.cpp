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

  void all_gather(const void* send, size_t bytes, void* recv) override {
    check(callbacks_.all_gather(callbacks_.context, send, bytes, recv), "all_gather");
  }

  void all_to_all(const void* send, const size_t* send_bytes, void* recv,
                  const size_t* recv_bytes) override {
    check(callbacks_.all_to_all(callbacks_.context, send, send_bytes, recv, recv_bytes),
          "all_to_all");
  }

 private:
  void check(int result, const char* what) const {
    if (result != 0) {
      fail(EMBSTORE_COMM_ERROR, "rank {}: the {} callback returned {}", rank_, what, result);
    }
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
