// Backend factories. The store picks one at creation (host/store/store.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "host/table/table.hpp"

namespace embstore {

class ThreadPool;
namespace shard {
class Communicator;
struct LocalCheck;
}  // namespace shard

std::unique_ptr<Table> make_host_table(TableSpec spec, ThreadPool& pool);

// The CUDA backend lives in cuda/backend/; a build without CUDA links
// host/backend/cuda_unavailable.cpp instead.
bool cuda_built();
// True when `device` can run the CUDA backend; otherwise *why says why.
bool cuda_device_usable(int device, std::string* why);
// Throws Error(UNSUPPORTED) without a CUDA build, Error(DEVICE_ERROR) on CUDA failures.
std::unique_ptr<Table> make_cuda_table(TableSpec spec, int device);
// Page-locks host memory that device copies target (the checkpoint staging ring), so they run
// as DMA. Without CUDA, or where it fails, the memory stays pageable: copies still work.
void pin_host_memory(void* p, size_t bytes, int device);
void unpin_host_memory(void* p, int device);
// keys[0..n) of the device's memory, copied to the host (enqueued on stream, then waited for):
// the plain calls of a sharded CUDA store check ownership on the host. Error(DEVICE_ERROR).
std::vector<int64_t> copy_keys_to_host(const int64_t* keys, size_t n, int device, void* stream);
// n floats of host memory copied to the device's memory at dst (enqueued on stream, then waited
// for, so that src may go): a follower's rows for device callers. Error(DEVICE_ERROR).
void copy_floats_to_device(const float* src, float* dst, size_t n, int device, void* stream);

// The data path of a sharded store on CUDA (cuda/backend/nccl_exchange.cu): the sharded calls
// with device pointers, their keys, rows and gradients carried between the ranks' devices by a
// duplicate of the trainer's NCCL communicator; their plan, counts and outcomes as on the host
// backend (host/shard/sharded_calls.hpp), through the store's control communicator.
class DeviceExchange {
 public:
  virtual ~DeviceExchange() = default;
  virtual void sharded_lookup(Table& table, shard::Communicator& control,
                              const shard::LocalCheck& check, const int64_t* keys, size_t n,
                              float* values_out, bool insert, bool per_occurrence, uint64_t step,
                              void* stream) = 0;
  virtual void sharded_apply_gradients(Table& table, shard::Communicator& control,
                                       const shard::LocalCheck& check, const int64_t* keys,
                                       const float* grads, size_t n, uint64_t step,
                                       void* stream) = 0;
};
// nccl_comm: the trainer's ncclComm_t, checked against rank, world_size and device, and
// duplicated (ncclCommSplit: collective). Throws Error: UNSUPPORTED in a build without CUDA or
// NCCL, INVALID_ARGUMENT on a mismatch, COMM_ERROR, DEVICE_ERROR.
std::unique_ptr<DeviceExchange> make_nccl_exchange(void* nccl_comm, int rank, int world_size,
                                                   int device);
// Whether this build carries the NCCL exchange.
bool nccl_built();

}  // namespace embstore
