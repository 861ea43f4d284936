// What every part of the CUDA backend shares on the device: launch and staging constants, the
// table's device-resident counters, grid-stride helpers and a block-wide sum.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cub/block/block_reduce.cuh>

#include "cuda/row/index.h"

namespace embstore::cuda_backend {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "find_or_insert_kernel spins within a warp: it needs independent thread scheduling (sm_70+)"
#endif

inline constexpr int kBlock = 256;
inline constexpr uint32_t kFullMask = 0xffffffffu;
// Scratch sub-buffers start on this boundary (CUB wants 256 bytes for its temp storage).
inline constexpr size_t kScratchAlign = 256;

// Device staging of the snapshot paths (copy-on-write, load_rows) holds at most about this much
// at a time, larger amounts going in pieces; the drain's holds two such pieces (its copies, and
// the ones it keeps) and its listing scratch.
inline constexpr uint64_t kStageBytes = uint64_t{32} << 20;
// Bitmap words drain scans per pass: at least twice the words of a staging piece (at most
// kStageBytes / 16 bytes = 2^21 rows, 2^15 words), so a sparse bitmap takes a bounded number of
// passes per piece, and few enough that a dense one does not scan far past the rows it takes.
inline constexpr uint64_t kDrainWords = uint64_t{1} << 16;
static_assert(kDrainWords >= 2 * (kStageBytes / 16) / 64);

// Device-resident counters. unsigned long long: the type atomicAdd takes.
struct DeviceCounters {
  unsigned long long rows;          // row ids handed out; the next fresh id
  unsigned long long free_rows;     // evicted rows waiting on the free list for a new key
  unsigned long long free_taken;    // free rows claimed by the insert in flight (then settled)
  unsigned long long inserted;      // rows ever inserted
  unsigned long long skipped_keys;  // gradient keys without a row
  unsigned long long dirty_rows;    // result slot of counters()
  unsigned long long new_keys;      // result slot of the max_capacity check
  unsigned long long captured;      // result slot of capture()
  unsigned long long cow_rows;      // result slot of one copy-on-write pass
  unsigned long long selected;      // result slot of a row selection (eviction, admission)
  unsigned long long tier_up;       // a prefetch's rows in host memory to move up
  unsigned long long tier_down;     // a prefetch's idle device rows that may make room
  unsigned long long tier_moved;    // rows traded between device and host memory, ever
};

// The drain's own result slots (it runs on its own stream, beside the table's calls): one
// listing pass (rows in the window, the word where the listing stopped) and one compaction.
struct DrainCounters {
  unsigned long long listed;
  unsigned long long cut_word;
  unsigned long long kept;
};

template <int BlockSize>
__device__ __forceinline__ uint64_t grid_thread() {
  return uint64_t{blockIdx.x} * BlockSize + threadIdx.x;
}

template <int BlockSize>
__device__ __forceinline__ uint64_t grid_threads() {
  return uint64_t{gridDim.x} * BlockSize;
}

// Places `key`, known absent, in the first empty slot of its probe with row r, beside other
// threads doing the same for other keys (a rebuild, a load, rows put in). A claimed slot is
// final; nothing may read the index until the kernel ends (the key is written after the claim).
__device__ __forceinline__ void insert_absent_concurrent(const row::IndexRef& index, int64_t key,
                                                         uint32_t r) {
  for (uint64_t s = index.home(key);; s = index.next(s)) {
    if (atomicCAS(&index.slots[s].row, row::kEmptyRow, r) == row::kEmptyRow) {
      index.slots[s].key = key;
      return;
    }
  }
}

// Sums `local` over the block and adds it with one atomic. Every thread of the block calls it,
// at most once per kernel (the static shared storage is not reused safely).
template <int BlockSize>
__device__ __forceinline__ void block_add(unsigned long long local, unsigned long long* total) {
  using Reduce = cub::BlockReduce<unsigned long long, BlockSize>;
  __shared__ typename Reduce::TempStorage temp;
  const unsigned long long sum = Reduce(temp).Sum(local);
  if (threadIdx.x == 0 && sum != 0) atomicAdd(total, sum);
}

}  // namespace embstore::cuda_backend
