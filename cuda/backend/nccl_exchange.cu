// The data path of a sharded store on CUDA (DeviceExchange, host/backend/backends.hpp): the
// sharded calls' keys, rows and gradients travel between the ranks' devices through a duplicate
// of the trainer's NCCL communicator, as grouped sends and receives on the caller's stream. What
// is planned (which key goes where, and the permutations) comes from the host code both backends
// share (host/shard/routing.hpp, sharded_calls.hpp): the rank's keys are copied to the host for
// it. Counts, argument checks and outcomes go through the store's control communicator (MPI or
// callbacks), as on the host backend.
#include <nccl.h>

#include <cstring>
#include <vector>

#include "cuda/backend/device_memory.cuh"
#include "cuda/backend/kernels/permute.cuh"
#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/shard/sharded_calls.hpp"

namespace embstore {
namespace cuda_backend {
namespace {

void check_nccl(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return;
  fail(r == ncclInvalidArgument || r == ncclInvalidUsage ? EMBSTORE_INVALID_ARGUMENT
                                                         : EMBSTORE_COMM_ERROR,
       "{}: {}", what, ncclGetErrorString(r));
}

unsigned blocks_for(uint64_t threads) {
  const uint64_t blocks = (threads + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::clamp<uint64_t>(blocks, 1, 65535));
}

// A host vector in a new device buffer (enqueued on stream; the vector must outlive the copy:
// the callers synchronize before returning).
template <typename T>
DeviceBuffer upload(const std::vector<T>& v, cudaStream_t stream, const char* what) {
  DeviceBuffer b(v.size() * sizeof(T), what);
  if (!v.empty()) {
    check(cudaMemcpyAsync(b.get(), v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice, stream),
          what);
  }
  return b;
}

uint64_t total(const std::vector<uint64_t>& counts) {
  uint64_t sum = 0;
  for (uint64_t c : counts) sum += c;
  return sum;
}

class NcclExchange final : public DeviceExchange {
 public:
  NcclExchange(void* nccl_comm, int rank, int world_size, int device) : device_(device) {
    const DeviceGuard guard(device);
    auto given = static_cast<ncclComm_t>(nccl_comm);
    int count = 0, user_rank = 0, cu_device = 0;
    check_nccl(ncclCommCount(given, &count), "ncclCommCount of nccl_comm");
    check_nccl(ncclCommUserRank(given, &user_rank), "ncclCommUserRank of nccl_comm");
    check_nccl(ncclCommCuDevice(given, &cu_device), "ncclCommCuDevice of nccl_comm");
    if (count != world_size || user_rank != rank || cu_device != device) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "nccl_comm is rank {} of {} on device {}; the store is rank {} of {} on device {}",
           user_rank, count, cu_device, rank, world_size, device);
    }
    // A duplicate (collective: every rank creates its store together), so no operation of
    // embstore's can match the trainer's own on its communicator.
    check_nccl(ncclCommSplit(given, 0, rank, &comm_, nullptr), "ncclCommSplit of nccl_comm");
  }

  ~NcclExchange() override {
    const DeviceGuard guard(device_, std::nothrow);
    (void)ncclCommDestroy(comm_);
  }

  void sharded_lookup(Table& table, shard::Communicator& control,
                      const shard::LocalCheck& arguments, const int64_t* keys, size_t n,
                      float* values_out, bool insert, bool per_occurrence, uint64_t step,
                      void* stream_arg) override {
    const DeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(stream_arg);
    const uint32_t world = static_cast<uint32_t>(control.size());
    const size_t dim = table.spec().dim;
    // Stage 1: the plan, on the host, from the rank's keys.
    std::vector<int64_t> host_keys;
    shard::LookupPlan plan;
    const shard::LocalCheck planned =
        shard::plan_lookup(keys_on_host(arguments, keys, n, stream, &host_keys), host_keys.data(),
                           n, per_occurrence, world, &plan);
    // Stage 2: counts, every rank's checks and flags.
    const std::vector<uint64_t> asked_counts =
        shard::exchange_counts(control, plan.route.counts, planned, insert ? 1u : 0u);
    // Stage 3: the keys to their owners; the owner's part; the rows back.
    DeviceBuffer send_keys = upload(plan.send_keys, stream, "the keys a rank sends");
    DeviceBuffer asked(total(asked_counts) * sizeof(int64_t), "the keys a rank is asked");
    all_to_all(send_keys.get(), plan.route.counts, asked.get(), asked_counts, sizeof(int64_t),
               stream);
    DeviceBuffer answers(total(asked_counts) * dim * sizeof(float), "the rows a rank answers");
    shard::agree(control, shard::run_stage([&] {
                   if (total(asked_counts) > 0) {
                     table.lookup(asked.get<int64_t>(), total(asked_counts), answers.get<float>(),
                                  insert, step, stream);
                   }
                   check(cudaStreamSynchronize(stream), "the owner's part of a sharded lookup");
                 }),
                 "its part of the sharded call");
    DeviceBuffer rows(total(plan.route.counts) * dim * sizeof(float), "the rows sent back");
    all_to_all(answers.get(), asked_counts, rows.get(), plan.route.counts, dim * sizeof(float),
               stream);
    // Stage 4: each position of the caller's batch gets its key's row.
    const std::vector<uint32_t> at = shard::gather_order(plan.route, plan.sent.slot_of);
    DeviceBuffer from = upload(at, stream, "the caller's order");
    if (n > 0) {
      permute_rows_kernel<kBlock><<<blocks_for(n * dim), kBlock, 0, stream>>>(
          values_out, rows.get<float>(), from.get<uint32_t>(), n, static_cast<uint32_t>(dim));
      check_launch("permute_rows_kernel");
    }
    // The buffers go when this returns: the call ends when its work has.
    check(cudaStreamSynchronize(stream), "a sharded lookup");
  }

  void sharded_apply_gradients(Table& table, shard::Communicator& control,
                               const shard::LocalCheck& arguments, const int64_t* keys,
                               const float* grads, size_t n, uint64_t step,
                               void* stream_arg) override {
    const DeviceGuard guard(device_);
    const auto stream = static_cast<cudaStream_t>(stream_arg);
    const uint32_t world = static_cast<uint32_t>(control.size());
    const size_t dim = table.spec().dim;
    std::vector<int64_t> host_keys;
    shard::GradientPlan plan;
    const shard::LocalCheck planned = shard::plan_gradients(
        keys_on_host(arguments, keys, n, stream, &host_keys), host_keys.data(), n, world, &plan);
    // The gradients in send order, on the device.
    DeviceBuffer order = upload(plan.route.order, stream, "the send order");
    DeviceBuffer grads_sent(plan.route.order.size() * dim * sizeof(float), "gradients to send");
    if (!plan.route.order.empty()) {
      permute_rows_kernel<kBlock><<<blocks_for(plan.route.order.size() * dim), kBlock, 0, stream>>>(
          grads_sent.get<float>(), grads, order.get<uint32_t>(), plan.route.order.size(),
          static_cast<uint32_t>(dim));
      check_launch("permute_rows_kernel");
    }
    const std::vector<uint64_t> got_counts =
        shard::exchange_counts(control, plan.route.counts, planned, 0);
    DeviceBuffer send_keys = upload(plan.send_keys, stream, "the keys a rank sends");
    DeviceBuffer got_keys(total(got_counts) * sizeof(int64_t), "the keys a rank gets");
    DeviceBuffer got_grads(total(got_counts) * dim * sizeof(float), "the gradients a rank gets");
    all_to_all(send_keys.get(), plan.route.counts, got_keys.get(), got_counts, sizeof(int64_t),
               stream);
    all_to_all(grads_sent.get(), plan.route.counts, got_grads.get(), got_counts,
               dim * sizeof(float), stream);
    shard::agree(control, shard::run_stage([&] {
                   if (total(got_counts) > 0) {
                     table.apply_gradients(got_keys.get<int64_t>(), got_grads.get<float>(),
                                           total(got_counts), step, stream);
                   }
                   check(cudaStreamSynchronize(stream), "the owner's part of sharded gradients");
                 }),
                 "its part of the sharded call");
  }

 private:
  // The rank's keys on the host, for the plan (not copied after a failed argument check); a
  // failed copy is this rank's failure.
  shard::LocalCheck keys_on_host(const shard::LocalCheck& arguments, const int64_t* keys, size_t n,
                                 cudaStream_t stream, std::vector<int64_t>* out) {
    if (arguments.status != EMBSTORE_OK) return arguments;
    return shard::run_stage([&] { *out = copy_keys_to_host(keys, n, device_, stream); });
  }

  // Items of item_bytes: send_counts[q] of send to rank q, recv_counts[q] into recv from rank q,
  // both packed in rank order. One NCCL group of sends and receives on stream; this rank's own
  // part is a device copy.
  void all_to_all(const void* send, const std::vector<uint64_t>& send_counts, void* recv,
                  const std::vector<uint64_t>& recv_counts, size_t item_bytes,
                  cudaStream_t stream) {
    const int self = static_cast<int>(rank_of());
    size_t send_at = 0, recv_at = 0;
    check_nccl(ncclGroupStart(), "ncclGroupStart");
    ncclResult_t r = ncclSuccess;
    for (size_t q = 0; q < send_counts.size() && r == ncclSuccess; ++q) {
      const size_t out = send_counts[q] * item_bytes, in = recv_counts[q] * item_bytes;
      const char* s = static_cast<const char*>(send) + send_at;
      char* d = static_cast<char*>(recv) + recv_at;
      if (static_cast<int>(q) == self) {
        if (out > 0) {
          const cudaError_t e = cudaMemcpyAsync(d, s, out, cudaMemcpyDeviceToDevice, stream);
          if (e != cudaSuccess) r = ncclUnhandledCudaError;
        }
      } else {
        if (out > 0) r = ncclSend(s, out, ncclUint8, static_cast<int>(q), comm_, stream);
        if (r == ncclSuccess && in > 0) {
          r = ncclRecv(d, in, ncclUint8, static_cast<int>(q), comm_, stream);
        }
      }
      send_at += out;
      recv_at += in;
    }
    const ncclResult_t end = ncclGroupEnd();
    check_nccl(r != ncclSuccess ? r : end, "the NCCL exchange of a sharded call");
  }

  uint32_t rank_of() const {
    int rank = 0;
    check_nccl(ncclCommUserRank(comm_, &rank), "ncclCommUserRank");
    return static_cast<uint32_t>(rank);
  }

  int device_;
  ncclComm_t comm_ = nullptr;
};

}  // namespace
}  // namespace cuda_backend

bool nccl_built() { return true; }

std::unique_ptr<DeviceExchange> make_nccl_exchange(void* nccl_comm, int rank, int world_size,
                                                   int device) {
  return std::make_unique<cuda_backend::NcclExchange>(nccl_comm, rank, world_size, device);
}

}  // namespace embstore
