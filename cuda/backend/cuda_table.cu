// The CUDA backend: a table in the device memory of one GPU. Kernels are thin wrappers over
// the portable per-row logic in cuda/row/, so every row they compute is bit-identical to the
// host backend's. What lives here is CUDA-only: the concurrent find-or-insert, launch
// configuration, CUB sorts and scans, growth, streams and events.
//
// Ordering: each call waits (on the device) for an event recorded at the end of the table's
// previous call, so a table's work runs in call order whatever streams the caller uses, and
// the grow-only scratch buffer is never used by two calls at once.

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <bit>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <cuda/atomic>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"
#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/table.hpp"

namespace embstore::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "find_or_insert_kernel spins within a warp: it needs independent thread scheduling (sm_70+)"
#endif

inline constexpr int kBlock = 256;
inline constexpr uint32_t kFullMask = 0xffffffffu;
// Scratch sub-buffers start on this boundary (CUB wants 256 bytes for its temp storage).
inline constexpr size_t kScratchAlign = 256;

// Device-resident counters. unsigned long long: the type atomicAdd takes.
struct DeviceCounters {
  unsigned long long rows;          // row ids handed out; the next id
  unsigned long long inserted;      // rows ever inserted
  unsigned long long skipped_keys;  // gradient keys without a row
  unsigned long long dirty_rows;    // result slot of counters()
  unsigned long long new_keys;      // result slot of the max_capacity check
};

// ------------------------------------------------------------------------------ kernels --

template <int BlockSize>
__device__ __forceinline__ uint64_t grid_thread() {
  return uint64_t{blockIdx.x} * BlockSize + threadIdx.x;
}

template <int BlockSize>
__device__ __forceinline__ uint64_t grid_threads() {
  return uint64_t{gridDim.x} * BlockSize;
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

// Row id per key (no_row where absent); positions and missing are optional.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    resolve_rows_kernel(row::IndexRef index, const int64_t* keys, uint64_t n, uint32_t no_row,
                        uint32_t* rows, uint32_t* positions, unsigned long long* missing) {
  unsigned long long local = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const uint32_t r = index.find(keys[i]);
    const bool found = r != row::kNoRow;
    rows[i] = found ? r : no_row;
    if (positions != nullptr) positions[i] = static_cast<uint32_t>(i);
    local += found ? 0 : 1;
  }
  if (missing != nullptr) block_add<BlockSize>(local, missing);
}

// One thread per key. A slot is claimed by CAS on its row field (empty -> locked); the winner
// writes the key and publishes a fresh row id with a release store. Others wait out the lock
// and then compare the key, so duplicates in a batch share the winner's row.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    find_or_insert_kernel(row::IndexRef index, row::ArenaRef arena, const int64_t* keys, uint64_t n,
                          uint64_t step, uint32_t* rows, uint8_t* created,
                          DeviceCounters* counters) {
  using RowRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
  unsigned long long local = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = keys[i];
    uint32_t found = row::kNoRow;
    uint8_t mine = 0;
    for (uint64_t s = index.home(key);; s = index.next(s)) {
      row::Slot& slot = index.slots[s];
      RowRef ref(slot.row);
      uint32_t r = ref.load(cuda::memory_order_acquire);
      if (r == row::kEmptyRow) {
        if (ref.compare_exchange_strong(r, row::kLockedRow, cuda::memory_order_acquire,
                                        cuda::memory_order_acquire)) {
          slot.key = key;
          found = static_cast<uint32_t>(atomicAdd(&counters->rows, 1ull));
          // The row's key goes with its id: an index rebuild reads keys from the metadata, so
          // it must never see an id whose metadata a later kernel was to write.
          *arena.row_meta(found) = row::RowMeta{key, step};
          ref.store(found, cuda::memory_order_release);  // publishes the key too
          mine = 1;
          break;
        }
        // Lost the race: r holds the winner's value, locked or already published.
      }
      while (r == row::kLockedRow) {
        __nanosleep(32);
        r = ref.load(cuda::memory_order_acquire);
      }
      if (slot.key == key) {  // ordered after the acquire that saw the published row
        found = r;
        break;
      }
    }
    rows[i] = found;
    created[i] = mine;
    local += mine;
  }
  block_add<BlockSize>(local, &counters->inserted);
}

// Fills the values and state of each row created by find_or_insert_kernel exactly once: a tile of
// 2^tile_shift threads per position, the tile's threads striding over the row's record.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    init_rows_kernel(row::ArenaRef arena, row::InitParams init, row::OptParams opt,
                     const int64_t* keys, const uint32_t* rows, const uint8_t* created, uint64_t n,
                     uint32_t tile_shift, uint64_t* dirty) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  const uint32_t stride = arena.stride;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    if (created[i] == 0) continue;
    const uint32_t r = rows[i];
    const int64_t key = keys[i];
    float* record = arena.row(r);
    const uint64_t seed = row::init_row_seed(init, key);
    for (uint32_t c = t; c < stride; c += tile) {
      record[c] =
          c < dim ? row::init_value_at(init, seed, c) : row::initial_state(opt, dim, c - dim);
    }
    if (t == 0) row::bitmap_set<true>(dirty, r);
  }
}

// out[i] = value of rows[i] (zeros for kNoRow). Reads leave the row's step alone: as on the
// host backend, a row's step is that of its insert or its last update.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    gather_rows_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n, uint32_t tile_shift,
                       float* out) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    const uint32_t r = rows[i];
    float* dst = out + i * dim;
    if (r == row::kNoRow) {
      for (uint32_t c = t; c < dim; c += tile) dst[c] = 0.0f;
      continue;
    }
    const float* src = arena.row(r);
    for (uint32_t c = t; c < dim; c += tile) dst[c] = src[c];
  }
}

// Counts the distinct keys of a sorted batch that have no row (the max_capacity check).
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    count_new_keys_kernel(row::IndexRef index, const int64_t* sorted_keys, uint64_t n,
                          unsigned long long* total) {
  unsigned long long local = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = sorted_keys[i];
    const bool first = i == 0 || sorted_keys[i - 1] != key;
    if (first && index.find(key) == row::kNoRow) ++local;
  }
  block_add<BlockSize>(local, total);
}

// Reinserts rows [0, rows) into an empty index. Keys are distinct, so a claimed slot is final
// and nothing reads the index until the kernel ends.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    rebuild_index_kernel(row::IndexRef index, row::ArenaRef arena, uint64_t rows) {
  for (uint64_t r = grid_thread<BlockSize>(); r < rows; r += grid_threads<BlockSize>()) {
    const int64_t key = arena.row_meta(r)->key;
    for (uint64_t s = index.home(key);; s = index.next(s)) {
      if (atomicCAS(&index.slots[s].row, row::kEmptyRow, static_cast<uint32_t>(r)) ==
          row::kEmptyRow) {
        index.slots[s].key = key;
        break;
      }
    }
  }
}

template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    count_dirty_kernel(const uint64_t* words, uint64_t n_words, unsigned long long* total) {
  unsigned long long local = 0;
  for (uint64_t w = grid_thread<BlockSize>(); w < n_words; w += grid_threads<BlockSize>()) {
    local += row::bitmap_count(words, w, w + 1);
  }
  block_add<BlockSize>(local, total);
}

// One warp per unique row of a gradient batch (runs of the row-sorted positions). Lane l owns
// columns l, l+32, ...; the per-row steps follow row::apply_row so the host gets the same bits.
template <row::OptKind Kind, bool Dirty, int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    fused_update_kernel(row::ArenaRef arena, uint64_t* dirty, row::OptParams p, const float* grads,
                        const uint32_t* run_rows, const uint32_t* run_lengths,
                        const uint32_t* run_offsets, const uint32_t* positions,
                        const uint32_t* num_runs, uint32_t no_row, uint64_t step) {
  static_assert(BlockSize % row::kLanes == 0);
  const uint32_t lane = threadIdx.x % row::kLanes;
  const uint32_t dim = arena.dim;
  const uint64_t runs = *num_runs;
  for (uint64_t w = grid_thread<BlockSize>() / row::kLanes; w < runs;
       w += grid_threads<BlockSize>() / row::kLanes) {
    const uint32_t r = run_rows[w];
    if (r == no_row) continue;  // the keys without a row; warp-uniform
    const uint32_t* pos = positions + run_offsets[w];
    const uint32_t len = run_lengths[w];
    float* value = arena.row(r);
    float* state = value + dim;
    // Summed gradient of column c: batch order, starting from the first occurrence.
    auto grad_sum = [&](uint32_t c) {
      float g = grads[uint64_t{pos[0]} * dim + c];
      for (uint32_t k = 1; k < len; ++k) g = g + grads[uint64_t{pos[k]} * dim + c];
      return g;
    };
    float sum_sq = 0.0f;
    if constexpr (Kind == row::OptKind::kRowwiseAdagrad) {
      float s = row::lane_sum_sq_at(p, dim, lane, grad_sum, value);
      // Same additions as row::butterfly_sum; every lane ends with the same value.
      for (uint32_t m = row::kLanes / 2; m > 0; m /= 2) s = s + __shfl_xor_sync(kFullMask, s, m);
      sum_sq = s;
    }
    const row::RowScalars rs = row::begin_row(p, dim, state, sum_sq);
    // Columns never touch the row-level state that begin_row read; lane 0 rewrites that only
    // in end_row, after the barrier below.
    for (uint32_t c = lane; c < dim; c += row::kLanes) {
      row::update_column_k<Kind>(p, rs, dim, c, row::effective_grad(p, grad_sum(c), value[c]),
                                 value, state);
    }
    __syncwarp();
    if (lane == 0) {
      row::end_row(p, rs, dim, state);
      if constexpr (Dirty) row::bitmap_set<true>(dirty, r);
      arena.row_meta(r)->step = step;
    }
  }
}

// ---------------------------------------------------------------------------- host side --
// Internal linkage: other translation units may define helpers of the same names.
namespace {

[[noreturn]] void throw_cuda(cudaError_t e, const char* what) {
  (void)cudaGetLastError();  // clear a non-sticky error so the next check does not see it
  if (e == cudaErrorMemoryAllocation) {
    fail(EMBSTORE_OUT_OF_MEMORY, "{}: {}", what, cudaGetErrorString(e));
  }
  fail(EMBSTORE_DEVICE_ERROR, "{}: {} ({})", what, cudaGetErrorString(e), cudaGetErrorName(e));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw_cuda(e, what);
}

void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// Makes `device` current for a scope and restores the previous device after it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) {
      check(cudaSetDevice(device), "cudaSetDevice");
      switched_ = true;
    }
  }
  // For destructors: never throws; failures leave the current device as it was.
  DeviceGuard(int device, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) {
      switched_ = cudaSetDevice(device) == cudaSuccess;
    }
    (void)cudaGetLastError();
  }
  ~DeviceGuard() {
    if (switched_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

// Owning device allocation (cudaMalloc / cudaFree).
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(size_t bytes, const char* what) : bytes_(bytes) {
    if (bytes == 0) return;
    void* p = nullptr;
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (e == cudaErrorMemoryAllocation) {
        fail(EMBSTORE_OUT_OF_MEMORY, "cudaMalloc of {} bytes for {}: {}", bytes, what,
             cudaGetErrorString(e));
      }
      fail(EMBSTORE_DEVICE_ERROR, "cudaMalloc of {} bytes for {}: {}", bytes, what,
           cudaGetErrorString(e));
    }
    ptr_ = p;
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(std::exchange(o.ptr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void reset() noexcept {
    if (ptr_ != nullptr) (void)cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  template <typename T = void>
  T* get() const {
    return static_cast<T*>(ptr_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Offsets of the sub-buffers of one call's scratch, each aligned for CUB.
struct ScratchLayout {
  size_t bytes = 0;
  size_t take(size_t n) {
    const size_t offset = (bytes + kScratchAlign - 1) / kScratchAlign * kScratchAlign;
    bytes = offset + n;
    return offset;
  }
};

// Threads per position for row copies: the row's width rounded up to a power of two, at most
// a warp, so narrow rows do not leave most lanes idle.
uint32_t tile_shift_for(uint32_t columns) {
  const uint32_t width = std::min<uint32_t>(std::bit_ceil(std::max<uint32_t>(columns, 1)), 32);
  return static_cast<uint32_t>(std::countr_zero(width));
}

class CudaTable final : public Table {
 public:
  CudaTable(TableSpec spec, int device);
  ~CudaTable() override;

  void lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
              void* stream) override;
  void apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                       void* stream) override;
  TableCounters counters() override;
  void set_dirty_tracking(bool on) override {
    std::lock_guard lock(mutex_);
    dirty_tracking_ = on;
  }

 private:
  // Orders a call after the table's previous call and marks its end for the next one.
  class CallScope {
   public:
    CallScope(cudaEvent_t done, cudaStream_t stream) : done_(done), stream_(stream) {
      check(cudaStreamWaitEvent(stream, done, 0), "cudaStreamWaitEvent");
    }
    ~CallScope() {
      // Also after a failure part-way: the next call must wait for what was enqueued. If the
      // event cannot be recorded, wait here instead, so no later call can overtake this one.
      if (cudaEventRecord(done_, stream_) != cudaSuccess) {
        (void)cudaGetLastError();
        (void)cudaStreamSynchronize(stream_);
        (void)cudaGetLastError();
      }
    }
    CallScope(const CallScope&) = delete;
    CallScope& operator=(const CallScope&) = delete;

   private:
    cudaEvent_t done_;
    cudaStream_t stream_;
  };

  // What every data-path call holds: the table's lock, its device, and its place in the
  // table's call order.
  struct Call {
    Call(CudaTable& t, void* stream_ptr)
        : lock(t.mutex_),
          guard(t.device_),
          stream(static_cast<cudaStream_t>(stream_ptr)),
          scope(t.done_, stream) {}
    std::lock_guard<std::mutex> lock;
    DeviceGuard guard;
    cudaStream_t stream;
    CallScope scope;
  };

  uint64_t capacity_rows() const { return row::arena_capacity(chunks_, arena_.base_shift); }
  row::IndexRef index_ref() const {
    return row::IndexRef{index_.get<row::Slot>(), index_slots_ - 1};
  }
  DeviceCounters* device_counters() const { return counters_.get<DeviceCounters>(); }
  unsigned blocks_for(uint64_t threads) const {
    const uint64_t blocks = (threads + kBlock - 1) / kBlock;
    return static_cast<unsigned>(std::clamp<uint64_t>(blocks, 1, max_blocks_));
  }
  void check_batch(size_t n) const;
  char* scratch(size_t bytes, cudaStream_t stream);
  DeviceCounters read_counters(cudaStream_t stream);
  void reserve_rows(const int64_t* keys, size_t n, cudaStream_t stream);
  uint64_t count_new_keys(const int64_t* keys, size_t n, cudaStream_t stream);
  void grow(uint64_t need, uint64_t rows, cudaStream_t stream);
  void release() noexcept;

  int device_;
  uint64_t max_blocks_ = 1;
  std::mutex mutex_;
  row::ArenaRef arena_{};
  uint32_t chunks_ = 0;
  std::array<DeviceBuffer, row::kMaxChunks> values_;
  std::array<DeviceBuffer, row::kMaxChunks> meta_;
  DeviceBuffer index_;
  uint64_t index_slots_ = 0;
  DeviceBuffer dirty_;
  uint64_t dirty_words_ = 0;
  DeviceBuffer counters_;
  DeviceBuffer scratch_;
  cudaEvent_t done_ = nullptr;
  cudaStream_t own_stream_ = nullptr;  // counters() and setup; never the caller's work
  // >= the true row count: the count at the last synchronization plus every row an insert
  // enqueued since may have created. The insert path synchronizes only when this bound says
  // the table might have to grow or pass its limit (about every capacity/n insert calls).
  uint64_t rows_bound_ = 0;
  bool dirty_tracking_ = true;
};

CudaTable::CudaTable(TableSpec spec, int device) : Table(std::move(spec)), device_(device) {
  DeviceGuard guard(device_);
  try {
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_),
          "cudaDeviceGetAttribute");
    // Grid-stride kernels: a few waves of full occupancy are enough to saturate memory.
    max_blocks_ = static_cast<uint64_t>(std::max(sms, 1)) * (2048 / kBlock) * 4;
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");

    // Chunk 0 holds at least initial_capacity rows (and at least 64: one bitmap word).
    const uint32_t base_shift = row::base_shift_for(this->spec().initial_capacity);
    arena_.base_shift = base_shift;
    arena_.dim = this->spec().dim;
    arena_.stride = this->spec().stride();

    const uint64_t rows0 = row::chunk_rows(0, base_shift);
    values_[0] = DeviceBuffer(rows0 * arena_.stride * sizeof(float), "arena values");
    meta_[0] = DeviceBuffer(rows0 * sizeof(row::RowMeta), "arena metadata");
    arena_.values[0] = values_[0].get<float>();
    arena_.meta[0] = meta_[0].get<row::RowMeta>();
    chunks_ = 1;

    dirty_words_ = row::bitmap_words(capacity_rows());
    dirty_ = DeviceBuffer(dirty_words_ * sizeof(uint64_t), "dirty bitmap");
    check(cudaMemsetAsync(dirty_.get(), 0, dirty_.bytes(), own_stream_), "cudaMemsetAsync");

    index_slots_ = row::index_slots_for(capacity_rows());
    index_ = DeviceBuffer(index_slots_ * sizeof(row::Slot), "index");
    check(cudaMemsetAsync(index_.get(), 0xFF, index_.bytes(), own_stream_),  // all kEmptyRow
          "cudaMemsetAsync");

    counters_ = DeviceBuffer(sizeof(DeviceCounters), "counters");
    check(cudaMemsetAsync(counters_.get(), 0, counters_.bytes(), own_stream_), "cudaMemsetAsync");
    check(cudaStreamSynchronize(own_stream_), "cudaStreamSynchronize");
  } catch (...) {
    release();
    throw;
  }
}

CudaTable::~CudaTable() {
  DeviceGuard guard(device_, std::nothrow);
  if (done_ != nullptr) (void)cudaEventSynchronize(done_);
  if (own_stream_ != nullptr) (void)cudaStreamSynchronize(own_stream_);
  release();
  (void)cudaGetLastError();
}

void CudaTable::release() noexcept {
  for (auto& b : values_) b.reset();
  for (auto& b : meta_) b.reset();
  index_.reset();
  dirty_.reset();
  counters_.reset();
  scratch_.reset();
  if (done_ != nullptr) (void)cudaEventDestroy(done_);
  if (own_stream_ != nullptr) (void)cudaStreamDestroy(own_stream_);
  done_ = nullptr;
  own_stream_ = nullptr;
  chunks_ = 0;
}

// Row ids and positions are 32-bit and CUB's run-length encoding counts items in an int.
void CudaTable::check_batch(size_t n) const {
  if (n > static_cast<size_t>(INT_MAX)) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}' (CUDA): at most {} keys per call, got {}",
         spec().name, INT_MAX, n);
  }
}

// The grow-only scratch buffer, at least `bytes`. Growing waits for the stream, which (after
// the CallScope wait) covers every earlier use of the old buffer.
char* CudaTable::scratch(size_t bytes, cudaStream_t stream) {
  if (bytes > scratch_.bytes()) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const size_t grown = std::max(bytes, scratch_.bytes() + scratch_.bytes() / 2);
    scratch_.reset();
    scratch_ = DeviceBuffer(grown, "scratch");
  }
  return scratch_.get<char>();
}

DeviceCounters CudaTable::read_counters(cudaStream_t stream) {
  DeviceCounters host{};
  check(cudaMemcpyAsync(&host, counters_.get(), sizeof(host), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return host;
}

// Makes room for up to n new rows before an insert is enqueued, or throws CAPACITY_EXCEEDED
// without inserting anything. Synchronizes only when the cheap upper bound says it might
// need to grow or might pass the row limit.
void CudaTable::reserve_rows(const int64_t* keys, size_t n, cudaStream_t stream) {
  const uint64_t limit = row::row_limit(spec().max_capacity);
  if (rows_bound_ + n <= capacity_rows() && rows_bound_ + n <= limit) {
    rows_bound_ += n;
    return;
  }
  const uint64_t rows = read_counters(stream).rows;  // syncs: every earlier insert is done
  rows_bound_ = rows;
  uint64_t need = rows + n;
  if (need > limit || need > capacity_rows()) {
    // Count the batch's distinct new keys exactly, so growth and the limit see the rows this
    // insert really adds (a batch of known or duplicate keys must not double the arena).
    const uint64_t fresh = count_new_keys(keys, n, stream);
    if (rows + fresh > limit) {
      fail(EMBSTORE_CAPACITY_EXCEEDED,
           "table '{}': {} new rows on top of {} would pass the limit of {} rows "
           "(max_capacity {}); nothing was inserted",
           spec().name, fresh, rows, limit, spec().max_capacity);
    }
    need = rows + fresh;
  }
  if (need > capacity_rows()) grow(need, rows, stream);
  rows_bound_ = need;
}

// Exact number of distinct keys of the batch that have no row: sort, then count the first
// occurrence of each key that the index does not hold. Synchronous.
uint64_t CudaTable::count_new_keys(const int64_t* keys, size_t n, cudaStream_t stream) {
  size_t temp_bytes = 0;
  check(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, static_cast<const int64_t*>(nullptr),
                                       static_cast<int64_t*>(nullptr), static_cast<int>(n), 0, 64,
                                       stream),
        "cub::DeviceRadixSort::SortKeys");
  ScratchLayout layout;
  const size_t sorted_at = layout.take(n * sizeof(int64_t));
  const size_t temp_at = layout.take(temp_bytes);
  char* base = scratch(layout.bytes, stream);
  auto* sorted = reinterpret_cast<int64_t*>(base + sorted_at);

  check(cub::DeviceRadixSort::SortKeys(base + temp_at, temp_bytes, keys, sorted,
                                       static_cast<int>(n), 0, 64, stream),
        "cub::DeviceRadixSort::SortKeys");
  unsigned long long* total = &device_counters()->new_keys;
  check(cudaMemsetAsync(total, 0, sizeof(*total), stream), "cudaMemsetAsync");
  count_new_keys_kernel<kBlock>
      <<<blocks_for(n), kBlock, 0, stream>>>(index_ref(), sorted, n, total);
  check_launch("count_new_keys_kernel");
  return read_counters(stream).new_keys;
}

// Adds arena chunks until `need` rows fit, with the dirty bitmap and the index sized to the
// new capacity; rows never move, the index is rebuilt from the rows' keys. The stream is idle
// (the caller synchronized it). Nothing is committed until every allocation has succeeded.
void CudaTable::grow(uint64_t need, uint64_t rows, cudaStream_t stream) {
  uint32_t chunks = chunks_;
  row::ArenaRef arena = arena_;
  while (row::arena_capacity(chunks, arena.base_shift) < need) {
    if (chunks == row::kMaxChunks) {
      fail(EMBSTORE_CAPACITY_EXCEEDED, "table '{}': the arena cannot hold {} rows", spec().name,
           need);
    }
    const uint64_t chunk = row::chunk_rows(chunks, arena.base_shift);
    values_[chunks] = DeviceBuffer(chunk * arena.stride * sizeof(float), "arena values");
    meta_[chunks] = DeviceBuffer(chunk * sizeof(row::RowMeta), "arena metadata");
    arena.values[chunks] = values_[chunks].get<float>();
    arena.meta[chunks] = meta_[chunks].get<row::RowMeta>();
    ++chunks;
  }
  const uint64_t capacity = row::arena_capacity(chunks, arena.base_shift);

  const uint64_t words = row::bitmap_words(capacity);
  DeviceBuffer dirty(words * sizeof(uint64_t), "dirty bitmap");
  check(cudaMemsetAsync(dirty.get(), 0, dirty.bytes(), stream), "cudaMemsetAsync");
  check(cudaMemcpyAsync(dirty.get(), dirty_.get(), dirty_words_ * sizeof(uint64_t),
                        cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync");

  const uint64_t slots = row::index_slots_for(capacity);
  DeviceBuffer index(slots * sizeof(row::Slot), "index");
  check(cudaMemsetAsync(index.get(), 0xFF, index.bytes(), stream), "cudaMemsetAsync");
  const row::IndexRef ref{index.get<row::Slot>(), slots - 1};
  if (rows > 0) {
    rebuild_index_kernel<kBlock><<<blocks_for(rows), kBlock, 0, stream>>>(ref, arena, rows);
    check_launch("rebuild_index_kernel");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

  arena_ = arena;
  chunks_ = chunks;
  dirty_ = std::move(dirty);  // frees the old bitmap and index; nothing uses them now
  dirty_words_ = words;
  index_ = std::move(index);
  index_slots_ = slots;
}

void CudaTable::lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
                       void* stream_ptr) {
  if (n == 0) return;
  check_batch(n);
  Call call(*this, stream_ptr);
  const cudaStream_t stream = call.stream;

  if (insert) reserve_rows(keys, n, stream);
  ScratchLayout layout;
  const size_t rows_at = layout.take(n * sizeof(uint32_t));
  const size_t created_at = layout.take(n * sizeof(uint8_t));
  char* base = scratch(layout.bytes, stream);
  auto* rows = reinterpret_cast<uint32_t*>(base + rows_at);
  auto* created = reinterpret_cast<uint8_t*>(base + created_at);

  const uint32_t dim_shift = tile_shift_for(arena_.dim);
  if (insert) {
    find_or_insert_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
        index_ref(), arena_, keys, n, step, rows, created, device_counters());
    check_launch("find_or_insert_kernel");
    const uint32_t shift = tile_shift_for(arena_.stride);
    init_rows_kernel<kBlock><<<blocks_for(uint64_t{n} << shift), kBlock, 0, stream>>>(
        arena_, spec().init, spec().opt, keys, rows, created, n, shift, dirty_.get<uint64_t>());
    check_launch("init_rows_kernel");
    gather_rows_kernel<kBlock><<<blocks_for(uint64_t{n} << dim_shift), kBlock, 0, stream>>>(
        arena_, rows, n, dim_shift, values_out);
    check_launch("gather_rows_kernel");
  } else {
    resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
        index_ref(), keys, n, row::kNoRow, rows, nullptr, nullptr);
    check_launch("resolve_rows_kernel");
    gather_rows_kernel<kBlock><<<blocks_for(uint64_t{n} << dim_shift), kBlock, 0, stream>>>(
        arena_, rows, n, dim_shift, values_out);
    check_launch("gather_rows_kernel");
  }
}

template <row::OptKind Kind, bool Dirty>
void launch_fused_update(unsigned blocks, cudaStream_t stream, const row::ArenaRef& arena,
                         uint64_t* dirty, const row::OptParams& p, const float* grads,
                         const uint32_t* run_rows, const uint32_t* run_lengths,
                         const uint32_t* run_offsets, const uint32_t* positions,
                         const uint32_t* num_runs, uint32_t no_row, uint64_t step) {
  fused_update_kernel<Kind, Dirty, kBlock>
      <<<blocks, kBlock, 0, stream>>>(arena, dirty, p, grads, run_rows, run_lengths, run_offsets,
                                      positions, num_runs, no_row, step);
  check_launch("fused_update_kernel");
}

void CudaTable::apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                                void* stream_ptr) {
  if (n == 0) return;
  check_batch(n);
  Call call(*this, stream_ptr);
  const cudaStream_t stream = call.stream;
  const int count = static_cast<int>(n);

  // Sort only the bits a row id can use: every id is below rows_bound_, and keys without a
  // row get the all-ones value of that width, so they sort last and form one run.
  const int bits = std::max(1, static_cast<int>(std::bit_width(rows_bound_)));
  const uint32_t no_row = bits >= 32 ? row::kNoRow : (uint32_t{1} << bits) - 1;

  size_t sort_bytes = 0, encode_bytes = 0, scan_bytes = 0;
  {
    cub::DoubleBuffer<uint32_t> k(nullptr, nullptr), v(nullptr, nullptr);
    check(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, k, v, count, 0, bits, stream),
          "cub::DeviceRadixSort::SortPairs");
    uint32_t* u = nullptr;
    check(cub::DeviceRunLengthEncode::Encode(nullptr, encode_bytes, u, u, u, u, count, stream),
          "cub::DeviceRunLengthEncode::Encode");
    check(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, u, u, count, stream),
          "cub::DeviceScan::ExclusiveSum");
  }
  const size_t temp_bytes = std::max({sort_bytes, encode_bytes, scan_bytes});
  const size_t array = n * sizeof(uint32_t);
  ScratchLayout layout;
  const size_t rows0_at = layout.take(array), rows1_at = layout.take(array);
  const size_t pos0_at = layout.take(array), pos1_at = layout.take(array);
  const size_t run_rows_at = layout.take(array), run_lengths_at = layout.take(array);
  const size_t run_offsets_at = layout.take(array), num_runs_at = layout.take(sizeof(uint32_t));
  const size_t temp_at = layout.take(temp_bytes);
  char* base = scratch(layout.bytes, stream);
  auto at = [base](size_t offset) { return reinterpret_cast<uint32_t*>(base + offset); };
  uint32_t* run_rows = at(run_rows_at);
  uint32_t* run_lengths = at(run_lengths_at);
  uint32_t* run_offsets = at(run_offsets_at);
  uint32_t* num_runs = at(num_runs_at);
  void* temp = base + temp_at;

  // (1) Row id and position of every key; keys without a row counted per block.
  resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      index_ref(), keys, n, no_row, at(rows0_at), at(pos0_at), &device_counters()->skipped_keys);
  check_launch("resolve_rows_kernel");

  // (2) Group positions by row; radix sort is stable, so each row keeps batch order.
  cub::DoubleBuffer<uint32_t> sorted_rows(at(rows0_at), at(rows1_at));
  cub::DoubleBuffer<uint32_t> sorted_pos(at(pos0_at), at(pos1_at));
  check(cub::DeviceRadixSort::SortPairs(temp, sort_bytes, sorted_rows, sorted_pos, count, 0, bits,
                                        stream),
        "cub::DeviceRadixSort::SortPairs");

  // (3) Unique rows, run lengths and offsets. The run count stays on the device; lengths past
  // it are zeroed so the scan reads defined memory.
  check(cudaMemsetAsync(run_lengths, 0, array, stream), "cudaMemsetAsync");
  check(cub::DeviceRunLengthEncode::Encode(temp, encode_bytes, sorted_rows.Current(), run_rows,
                                           run_lengths, num_runs, count, stream),
        "cub::DeviceRunLengthEncode::Encode");
  check(cub::DeviceScan::ExclusiveSum(temp, scan_bytes, run_lengths, run_offsets, count, stream),
        "cub::DeviceScan::ExclusiveSum");

  // (4) One warp per unique row: as many warps as there can be runs, capped (grid-stride).
  const unsigned blocks = blocks_for(uint64_t{n} * row::kLanes);
  const uint32_t* positions = sorted_pos.Current();
  uint64_t* dirty = dirty_.get<uint64_t>();
  const bool tracking = dirty_tracking_;
  row::dispatch_opt(spec().opt.kind, [&](auto kind) {
    constexpr row::OptKind Kind = decltype(kind)::value;
    if (tracking) {
      launch_fused_update<Kind, true>(blocks, stream, arena_, dirty, spec().opt, grads, run_rows,
                                      run_lengths, run_offsets, positions, num_runs, no_row, step);
    } else {
      launch_fused_update<Kind, false>(blocks, stream, arena_, dirty, spec().opt, grads, run_rows,
                                       run_lengths, run_offsets, positions, num_runs, no_row, step);
    }
  });
}

TableCounters CudaTable::counters() {
  std::lock_guard lock(mutex_);
  DeviceGuard guard(device_);
  check(cudaEventSynchronize(done_), "cudaEventSynchronize");  // every earlier call is done

  unsigned long long* dirty_total = &device_counters()->dirty_rows;
  check(cudaMemsetAsync(dirty_total, 0, sizeof(*dirty_total), own_stream_), "cudaMemsetAsync");
  count_dirty_kernel<kBlock><<<blocks_for(dirty_words_), kBlock, 0, own_stream_>>>(
      dirty_.get<uint64_t>(), dirty_words_, dirty_total);
  check_launch("count_dirty_kernel");
  const DeviceCounters d = read_counters(own_stream_);
  rows_bound_ = d.rows;  // exact now: nothing of this table is in flight

  TableCounters c;
  c.rows = d.rows;
  c.capacity = capacity_rows();
  c.dirty_rows = d.dirty_rows;
  c.inserted = d.inserted;
  c.evicted = 0;
  c.pending_admission = 0;
  c.skipped_keys = d.skipped_keys;
  return c;
}

}  // namespace
}  // namespace embstore::detail

namespace embstore {

bool cuda_built() { return true; }

bool cuda_device_usable(int device, std::string* why) {
  auto refuse = [why](const char* reason) {
    try {
      if (why != nullptr) *why = reason;
    } catch (...) {
    }
    return false;
  };
  try {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      return refuse(fmt::format("no CUDA device: {}", cudaGetErrorString(e)).c_str());
    }
    if (count == 0) return refuse("no CUDA device: none visible");
    if (device < 0 || device >= count) {
      return refuse(
          fmt::format("CUDA device {} does not exist ({} visible)", device, count).c_str());
    }
    detail::DeviceGuard guard(device);
    // Loading a kernel proves the device can run this build's code (SASS for its
    // architecture, or PTX the driver can compile).
    cudaFuncAttributes attributes{};
    e = cudaFuncGetAttributes(&attributes, detail::gather_rows_kernel<detail::kBlock>);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      int major = 0, minor = 0;
      (void)cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
      (void)cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
      (void)cudaGetLastError();
      return refuse(fmt::format("CUDA device {} (compute capability {}.{}) cannot run this "
                                "build's kernels: {}",
                                device, major, minor, cudaGetErrorString(e))
                        .c_str());
    }
  } catch (const std::exception& error) {
    return refuse(error.what());
  } catch (...) {
    return refuse("CUDA device check failed");
  }
  return true;
}

std::unique_ptr<Table> make_cuda_table(TableSpec spec, int device) {
  return std::make_unique<detail::CudaTable>(std::move(spec), device);
}

}  // namespace embstore
