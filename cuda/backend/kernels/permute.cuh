// The sharded calls' row permutation on the device: row i of dst is row from[i] of src. It puts
// gradients in send order and the rows that come back in the caller's order (the permutations
// themselves are planned on the host by host/shard/routing.hpp, the same for both backends).
#pragma once

#include <cstdint>

#include "cuda/backend/device.cuh"

namespace embstore::cuda_backend {

template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    permute_rows_kernel(float* dst, const float* src, const uint32_t* from, uint64_t n,
                        uint32_t dim) {
  const uint64_t total = n * dim;
  for (uint64_t i = grid_thread<BlockSize>(); i < total; i += grid_threads<BlockSize>()) {
    const uint64_t r = i / dim, c = i - r * dim;
    dst[i] = src[uint64_t{from[r]} * dim + c];
  }
}

}  // namespace embstore::cuda_backend
