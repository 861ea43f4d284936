// The CUDA backend: a table in the device memory of one GPU. Kernels are thin wrappers over
// the portable per-row logic in cuda/row/, so every row they compute is bit-identical to the
// host backend's. What lives here is CUDA-only: the concurrent find-or-insert, launch
// configuration, CUB sorts and scans, growth, streams and events.
//
// Ordering: each call waits (on the device) for an event recorded at the end of the table's
// previous call, so a table's work runs in call order whatever streams the caller uses, and
// the grow-only scratch buffer is never used by two calls at once.

#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <climits>
#include <cstdint>
#include <cub/block/block_reduce.cuh>
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_run_length_encode.cuh>
#include <cub/device/device_scan.cuh>
#include <cub/device/device_select.cuh>
#include <cuda/atomic>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <utility>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/eviction.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"
#include "cuda/row/snapshot.h"
#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/table/key_ledger.hpp"
#include "host/table/table.hpp"

namespace embstore::detail {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 700
#error "find_or_insert_kernel spins within a warp: it needs independent thread scheduling (sm_70+)"
#endif

inline constexpr int kBlock = 256;
inline constexpr uint32_t kFullMask = 0xffffffffu;
// Scratch sub-buffers start on this boundary (CUB wants 256 bytes for its temp storage).
inline constexpr size_t kScratchAlign = 256;

// Device staging of the snapshot paths (drain, copy-on-write, load_rows) holds at most about
// this much at a time; larger amounts go in pieces.
inline constexpr uint64_t kStageBytes = uint64_t{32} << 20;
// Bitmap words drain scans per pass: enough for a bounded number of passes per piece on a
// sparse bitmap, few enough that a dense one does not scan far past the rows it takes.
inline constexpr uint64_t kMinDrainWords = uint64_t{1} << 16;
inline constexpr uint64_t kMaxDrainWords = uint64_t{1} << 22;  // 2^28 rows: counts fit uint32

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
  unsigned long long drain_total;   // result slots of one drain pass: captured rows in the
  unsigned long long drain_word;    //   window, and the word where the pass stopped taking
  unsigned long long cow_rows;      // result slot of one copy-on-write pass
  unsigned long long selected;      // result slot of a row selection (eviction, admission)
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

// Where find_or_insert_kernel takes row ids from, and what it does beside inserting.
struct InsertParams {
  // Evicted rows, taken from the top (free_list[free_rows - 1] first) before fresh ids; the
  // count of the list is counters->free_rows, fixed for the kernel. Null: no eviction.
  const uint32_t* free_list;
  uint64_t* freed;  // a reused row's bit is cleared
  // Positions whose key is pending admission (nonzero): they neither insert nor probe and
  // read the key's initial values (gather_rows_kernel). Null: none.
  const uint8_t* pending;
  bool touch;  // tables that evict: stamp the rows found with the step
};

// One thread per key. A slot is claimed by CAS on its row field (empty -> locked); the winner
// writes the key and publishes a row id (a freed one first, else a fresh one) with a release
// store. Others wait out the lock and then compare the key, so duplicates in a batch share the
// winner's row.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    find_or_insert_kernel(row::IndexRef index, row::ArenaRef arena, const int64_t* keys, uint64_t n,
                          uint64_t step, InsertParams params, uint32_t* rows, uint8_t* created,
                          DeviceCounters* counters) {
  using RowRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
  using StepRef = cuda::atomic_ref<uint64_t, cuda::thread_scope_device>;
  const unsigned long long free_rows = params.free_list != nullptr ? counters->free_rows : 0;
  unsigned long long local = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = keys[i];
    uint32_t found = row::kNoRow;
    uint8_t mine = 0;
    if (params.pending != nullptr && params.pending[i] != 0) {
      rows[i] = row::kNoRow;
      created[i] = 0;
      continue;
    }
    for (uint64_t s = index.home(key);; s = index.next(s)) {
      row::Slot& slot = index.slots[s];
      RowRef ref(slot.row);
      uint32_t r = ref.load(cuda::memory_order_acquire);
      if (r == row::kEmptyRow) {
        if (ref.compare_exchange_strong(r, row::kLockedRow, cuda::memory_order_acquire,
                                        cuda::memory_order_acquire)) {
          slot.key = key;
          const unsigned long long k =
              free_rows > 0 ? atomicAdd(&counters->free_taken, 1ull) : free_rows;
          if (k < free_rows) {
            found = params.free_list[free_rows - 1 - k];
            row::bitmap_clear<true>(params.freed, found);
          } else {
            found = static_cast<uint32_t>(atomicAdd(&counters->rows, 1ull));
          }
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
        // Duplicates store the same step.
        if (params.touch) StepRef(arena.row_meta(r)->step).store(step, cuda::memory_order_relaxed);
        break;
      }
    }
    rows[i] = found;
    created[i] = mine;
    local += mine;
  }
  block_add<BlockSize>(local, &counters->inserted);
}

// After find_or_insert_kernel (one thread): the free rows it took leave the list.
__global__ void settle_free_list_kernel(DeviceCounters* counters) {
  const unsigned long long taken = min(counters->free_taken, counters->free_rows);
  counters->free_rows -= taken;
  counters->free_taken = 0;
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
// A position pending admission (pending non-null and nonzero) reads its key's initial values.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    gather_rows_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n, uint32_t tile_shift,
                       const uint8_t* pending, row::InitParams init, const int64_t* keys,
                       float* out) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    const uint32_t r = rows[i];
    float* dst = out + i * dim;
    if (pending != nullptr && pending[i] != 0) {
      const uint64_t seed = row::init_row_seed(init, keys[i]);
      for (uint32_t c = t; c < dim; c += tile) dst[c] = row::init_value_at(init, seed, c);
      continue;
    }
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

// Reinserts the live rows of [0, rows) (those not freed; freed may be null) into an empty
// index. Keys are distinct, so a claimed slot is final and nothing reads the index until the
// kernel ends.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    rebuild_index_kernel(row::IndexRef index, row::ArenaRef arena, uint64_t rows,
                         const uint64_t* freed) {
  for (uint64_t r = grid_thread<BlockSize>(); r < rows; r += grid_threads<BlockSize>()) {
    if (freed != nullptr && row::bitmap_test(freed, r)) continue;
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

// ------------------------------------------------------------ eviction, admission kernels --

// Selection predicates (cub::DeviceSelect::If over row ids or batch positions).
// A row that an eviction with cutoff `before` may take (row::evictable).
struct EvictionCandidate {
  row::ArenaRef arena;
  const uint64_t* freed;
  const uint64_t* spared;
  uint64_t before;
  __device__ bool operator()(uint32_t r) const {
    return row::evictable(freed, spared, r, arena.row_meta(r)->step, before);
  }
};

// A batch position whose key has no row.
struct MissingAt {
  const uint32_t* rows;
  __device__ bool operator()(uint32_t i) const { return rows[i] == row::kNoRow; }
};

// Sets the bit of every row of rows[0, n) (kNoRow skipped).
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    mark_rows_kernel(const uint32_t* rows, uint64_t n, uint64_t* bits) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    if (rows[i] != row::kNoRow) row::bitmap_set<true>(bits, rows[i]);
  }
}

// mask[positions[i]] = 1.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    mark_positions_kernel(const uint32_t* positions, uint64_t n, uint8_t* mask) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    mask[positions[i]] = 1;
  }
}

template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    gather_steps_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n, uint64_t* steps) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    steps[i] = arena.row_meta(rows[i])->step;
  }
}

template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    gather_keys_kernel(const int64_t* keys, const uint32_t* positions, uint64_t n, int64_t* out) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    out[i] = keys[positions[i]];
  }
}

// Frees victims[0, n) (distinct live rows, already written to a snapshot in progress): their
// keys go to keys_out, their dirty bits are cleared, their freed bits set, and they join the
// free list at free_list[free_base + i]. The index is rebuilt afterwards.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    free_rows_kernel(row::ArenaRef arena, const uint32_t* victims, uint64_t n, uint64_t* dirty,
                     uint64_t* freed, uint32_t* free_list, uint64_t free_base, int64_t* keys_out) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const uint32_t r = victims[i];
    keys_out[i] = arena.row_meta(r)->key;
    row::release_row<true>(dirty, freed, r);
    free_list[free_base + i] = r;
  }
}

__global__ void add_free_rows_kernel(DeviceCounters* counters, unsigned long long n) {
  counters->free_rows += n;
}

// ---------------------------------------------------------------------- snapshot kernels --

// capture_word over every word of the bitmaps (freed rows left out; freed may be null);
// counts the captured rows.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    capture_kernel(bool full, uint64_t* dirty, uint64_t* captured, uint64_t n_words, uint64_t rows,
                   const uint64_t* freed, unsigned long long* total) {
  unsigned long long local = 0;
  for (uint64_t w = grid_thread<BlockSize>(); w < n_words; w += grid_threads<BlockSize>()) {
    const uint64_t gone = freed != nullptr ? freed[w] : 0;
    local += row::popcount64(row::capture_word(full, dirty, captured, w, rows, gone));
  }
  block_add<BlockSize>(local, total);
}

// dirty |= the rows a failed snapshot captured that are still live (evicted ones were written
// off with tombstones; freed may be null).
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    restore_dirty_kernel(uint64_t* dirty, const uint64_t* snapshot_set, const uint64_t* freed,
                         uint64_t n_words) {
  for (uint64_t w = grid_thread<BlockSize>(); w < n_words; w += grid_threads<BlockSize>()) {
    row::restore_dirty_word(dirty, snapshot_set, w, freed != nullptr ? freed[w] : 0);
  }
}

// Captured rows per word of the window [first_word, first_word + n_words).
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    captured_counts_kernel(const uint64_t* captured, uint64_t first_word, uint64_t n_words,
                           uint32_t* counts) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n_words; i += grid_threads<BlockSize>()) {
    counts[i] = static_cast<uint32_t>(row::popcount64(captured[first_word + i]));
  }
}

// Takes the first `want` captured rows of the window in row order: ends[i] is the inclusive
// prefix sum of the window's per-word counts, so word i's rows go to out[ends[i] - count ..].
// One thread owns a word. *total gets the captured rows of the window; *cut_word the word
// holding the want-th of them (meaningful where *total >= want): every word before it is
// empty afterwards.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    take_captured_kernel(uint64_t* captured, uint64_t first_word, uint64_t n_words,
                         const uint32_t* ends, uint64_t want, uint32_t* out,
                         unsigned long long* total, unsigned long long* cut_word) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n_words; i += grid_threads<BlockSize>()) {
    const uint64_t end = ends[i];
    if (i == n_words - 1) *total = end;
    const uint64_t word_index = first_word + i;
    uint64_t bits = captured[word_index];
    const uint64_t begin = end - static_cast<uint64_t>(row::popcount64(bits));
    if (bits == 0 || begin >= want) continue;
    if (want <= end) *cut_word = word_index;  // begin < want <= end: exactly one thread
    for (uint64_t j = begin; bits != 0 && j < want; ++j) {
      const uint64_t r =
          word_index * 64 + static_cast<uint64_t>(__ffsll(static_cast<long long>(bits)) - 1);
      bits &= bits - 1;
      (void)row::take_captured<false>(captured, r);  // the word is this thread's alone
      out[j] = static_cast<uint32_t>(r);
    }
  }
}

// Copy-on-write, first half: takes each captured row among the unique rows of a gradient batch
// and appends its id to out at *count (one atomic per warp). The loop bound is uniform within
// a block, so every warp is complete at the ballot.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    take_runs_kernel(uint64_t* captured, const uint32_t* run_rows, uint64_t n, uint32_t no_row,
                     uint32_t* out, unsigned long long* count) {
  static_assert(BlockSize % 32 == 0);
  const uint32_t lane = threadIdx.x % 32;
  for (uint64_t base = uint64_t{blockIdx.x} * BlockSize; base < n;
       base += grid_threads<BlockSize>()) {
    const uint64_t i = base + threadIdx.x;
    uint32_t r = 0;
    bool take = false;
    if (i < n) {
      r = run_rows[i];
      take = r != no_row && row::take_captured<true>(captured, r);
    }
    const uint32_t ballot = __ballot_sync(kFullMask, take);
    if (ballot == 0) continue;  // warp-uniform
    const int leader = __ffs(static_cast<int>(ballot)) - 1;
    unsigned long long first = 0;
    if (static_cast<int>(lane) == leader) {
      first = atomicAdd(count, static_cast<unsigned long long>(__popc(ballot)));
    }
    first = __shfl_sync(kFullMask, first, leader);
    if (take) out[first + static_cast<uint32_t>(__popc(ballot & ((1u << lane) - 1)))] = r;
  }
}

// One staging record per row id (row::write_record), padding zeroed; the first
// min(n, *count) ids where count is given (a count a kernel before it wrote).
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    write_records_kernel(row::ArenaRef arena, const uint32_t* rows, uint64_t n,
                         const unsigned long long* count, char* records, uint64_t record_size) {
  const uint64_t m = count != nullptr && *count < n ? *count : n;
  const uint64_t used = 8 + uint64_t{arena.stride} * 4;
  for (uint64_t i = grid_thread<BlockSize>(); i < m; i += grid_threads<BlockSize>()) {
    const uint32_t r = rows[i];
    char* record = records + i * record_size;
    row::write_record(record, arena.row_meta(r)->key, arena.row(r), arena.stride);
    if (record_size > used) memset(record + used, 0, record_size - used);
  }
}

// load_rows: row first_row + i for keys[i], keys distinct and absent from the index (checked
// before). Like rebuild_index_kernel, a claimed slot is final and nothing reads the index until
// the kernel ends.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    load_index_kernel(row::IndexRef index, row::ArenaRef arena, const int64_t* keys, uint64_t n,
                      uint64_t first_row, uint64_t step) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const int64_t key = keys[i];
    const uint32_t r = static_cast<uint32_t>(first_row + i);
    *arena.row_meta(r) = row::RowMeta{key, step};
    for (uint64_t s = index.home(key);; s = index.next(s)) {
      if (atomicCAS(&index.slots[s].row, row::kEmptyRow, r) == row::kEmptyRow) {
        index.slots[s].key = key;
        break;
      }
    }
  }
}

// load_rows: record of row first_row + i = [values[i]][state[i]], a tile per row as in
// init_rows_kernel.
template <int BlockSize>
__global__ void __launch_bounds__(BlockSize)
    load_values_kernel(row::ArenaRef arena, const float* values, const float* state, uint64_t n,
                       uint64_t first_row, uint32_t tile_shift) {
  const uint32_t tile = 1u << tile_shift;
  const uint32_t t = threadIdx.x & (tile - 1);
  const uint32_t dim = arena.dim;
  const uint32_t stride = arena.stride;
  const uint32_t state_dim = stride - dim;
  for (uint64_t i = grid_thread<BlockSize>() >> tile_shift; i < n;
       i += grid_threads<BlockSize>() >> tile_shift) {
    float* record = arena.row(first_row + i);
    for (uint32_t c = t; c < stride; c += tile) {
      record[c] = c < dim ? values[i * dim + c] : state[i * state_dim + (c - dim)];
    }
  }
}

// load_rows: the rows a load added, in the counters (one thread).
__global__ void add_loaded_rows_kernel(DeviceCounters* counters, unsigned long long rows) {
  counters->rows += rows;
  counters->inserted += rows;
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
  uint64_t capture(bool full, SnapshotSink* sink, uint64_t* live_rows) override;
  const std::vector<int64_t>& evicted_at_capture() const override {
    return ledger_.evicted_at_capture();
  }
  std::optional<io::AdmissionFile> admission_at_capture() const override {
    return ledger_.admission_at_capture();
  }
  uint64_t drain(SnapshotSink* sink, uint64_t max_rows) override;
  void end_snapshot(bool failed) override;
  uint64_t evict_before(uint64_t cutoff_step) override;
  void load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                 uint64_t step) override;
  bool load_admission(const io::AdmissionFile& counts, std::string* why) override;

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
  // Hands the sink's records to the writer on every way out of drain() and copy_on_write().
  struct FlushOnExit {
    SnapshotSink* sink;
    ~FlushOnExit() {
      try {
        sink->flush();
      } catch (...) {
      }
    }
  };

  // Counts the calls that hold or wait for mutex_: drain() stays out of their way.
  struct Caller {
    explicit Caller(std::atomic<int>& n) : n_(n) { n_.fetch_add(1, std::memory_order_acq_rel); }
    ~Caller() { n_.fetch_sub(1, std::memory_order_acq_rel); }
    Caller(const Caller&) = delete;
    Caller& operator=(const Caller&) = delete;
    std::atomic<int>& n_;
  };

  struct Call {
    Call(CudaTable& t, void* stream_ptr)
        : caller(t.callers_),
          lock(t.mutex_),
          guard(t.device_),
          stream(static_cast<cudaStream_t>(stream_ptr)),
          scope(t.done_, stream) {}
    Caller caller;
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
  void count_admission(const int64_t* keys, size_t n, uint64_t step, cudaStream_t stream);
  void reserve_rows(const int64_t* keys, size_t n, uint64_t step, const int64_t* call_keys,
                    size_t call_n, cudaStream_t stream);
  void make_room(uint64_t need, uint64_t step, const int64_t* call_keys, size_t call_n,
                 const DeviceCounters& d, cudaStream_t stream);
  template <typename Predicate>
  size_t select_bytes(Predicate predicate, uint64_t items, cudaStream_t stream) const;
  template <typename Predicate>
  uint64_t select(Predicate predicate, uint64_t items, uint32_t* out, void* temp, size_t temp_bytes,
                  cudaStream_t stream);
  void evict_rows(const uint32_t* victims, uint64_t n, int64_t* keys_out, const DeviceCounters& d,
                  cudaStream_t stream);
  uint64_t count_new_keys(const int64_t* keys, size_t n, cudaStream_t stream);
  void grow(uint64_t need, uint64_t rows, cudaStream_t stream);
  void release() noexcept;
  char* stage(size_t bytes, cudaStream_t stream);
  uint64_t stage_rows() const {
    return std::max<uint64_t>(1, kStageBytes / row::record_bytes(arena_.stride));
  }
  uint64_t drain_piece(uint64_t want, char* out, cudaStream_t stream);
  void copy_on_write(const uint32_t* rows, uint64_t n, uint32_t no_row, cudaStream_t stream);

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
  uint64_t loaded_rows_ = 0;  // by load_rows: inserted, but not admitted by training
  bool dirty_tracking_ = true;

  // Eviction (tables with a rule): the rows on the free list have their freed_ bit set;
  // free_list_ holds a row id per row of capacity, the first DeviceCounters::free_rows of them
  // free. evicted_keys_: where an eviction's keys arrive on the host.
  DeviceBuffer freed_;
  DeviceBuffer free_list_;
  std::vector<int64_t> evicted_keys_;

  // Admission counts and tombstones, in host memory as on the host backend. An inserting
  // lookup on a table with admission copies the keys without a row here and counts them in
  // batch order: admit_keys_ (device copy admit_) get rows, pending_pos_ read initial values.
  KeyLedger ledger_;
  std::vector<uint32_t> missing_pos_, pending_pos_;
  std::vector<int64_t> missing_keys_, admit_keys_;
  DeviceBuffer admit_;

  // Snapshots. captured_ and snapshot_set_ (the captured bitmap as capture left it, for
  // end_snapshot(failed)) are allocated at the first capture and then kept at dirty_words_
  // words; stage_ is the grow-only device staging of records and of load_rows input.
  DeviceBuffer captured_;
  DeviceBuffer snapshot_set_;
  DeviceBuffer stage_;
  SnapshotSink* sink_ = nullptr;
  bool snapshot_active_ = false;
  // >= the rows still captured (exact unless a call failed part-way); 0: no copy-on-write.
  uint64_t captured_left_ = 0;
  std::atomic<uint64_t> captured_left_seen_{0};  // captured_left_ as drain() last left it
  DrainTurn drain_turn_;
  std::atomic<int> callers_{0};
  // Drain resumes at this word; every word before it is empty. Captured rows lie below
  // drain_end_word_ (the live rows at capture).
  uint64_t drain_word_ = 0;
  uint64_t drain_end_word_ = 0;
};

CudaTable::CudaTable(TableSpec spec, int device)
    : Table(std::move(spec)), device_(device), ledger_(this->spec()) {
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
    if (this->spec().evicts()) {
      freed_ = DeviceBuffer(dirty_words_ * sizeof(uint64_t), "freed bitmap");
      check(cudaMemsetAsync(freed_.get(), 0, freed_.bytes(), own_stream_), "cudaMemsetAsync");
      free_list_ = DeviceBuffer(capacity_rows() * sizeof(uint32_t), "free list");
    }
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
  freed_.reset();
  free_list_.reset();
  admit_.reset();
  counters_.reset();
  scratch_.reset();
  captured_.reset();
  snapshot_set_.reset();
  stage_.reset();
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

// Makes room for up to n new rows (keys, those an insert may add) before the insert is
// enqueued: evicts at max_capacity on a table that evicts (sparing the rows of the call's keys,
// call_keys), grows, or throws CAPACITY_EXCEEDED without inserting or evicting anything.
// Synchronizes only when the cheap upper bound says it might need to grow or might pass the row
// limit.
void CudaTable::reserve_rows(const int64_t* keys, size_t n, uint64_t step, const int64_t* call_keys,
                             size_t call_n, cudaStream_t stream) {
  const uint64_t limit = row::row_limit(spec().max_capacity);
  // rows_bound_ bounds the ids handed out, so the live rows too.
  if (rows_bound_ + n <= capacity_rows() && rows_bound_ + n <= limit) {
    rows_bound_ += n;
    return;
  }
  DeviceCounters d = read_counters(stream);  // syncs: every earlier insert is done
  rows_bound_ = d.rows;
  auto fresh_ids = [&](uint64_t rows) { return rows > d.free_rows ? rows - d.free_rows : 0; };
  uint64_t fresh = n;  // the new rows: an upper bound until counted
  const uint64_t live = d.rows - d.free_rows;
  if (live + n > limit || d.rows + fresh_ids(n) > capacity_rows()) {
    // Count the batch's distinct new keys exactly, so growth and the limit see the rows this
    // insert really adds (a batch of known or duplicate keys must not double the arena).
    fresh = count_new_keys(keys, n, stream);
    if (live + fresh > limit) {
      if (!spec().evicts()) fail_over_limit(spec(), fresh, live, "new rows", "inserted");
      // Grown first to what the insert needs after the eviction, so that a failure to grow
      // evicts nothing.
      const uint64_t evict = live + fresh - limit;
      const uint64_t free_after = d.free_rows + evict;
      const uint64_t need_after = d.rows + (fresh > free_after ? fresh - free_after : 0);
      if (need_after > capacity_rows()) grow(need_after, d.rows, stream);
      make_room(evict, step, call_keys, call_n, d, stream);
      d.free_rows = free_after;
    }
  }
  const uint64_t need = d.rows + fresh_ids(fresh);
  if (need > capacity_rows()) grow(need, d.rows, stream);
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
  // A snapshot's bitmaps grow with the dirty one; new rows are never captured.
  auto grown_bitmap = [&](const DeviceBuffer& old, const char* what) {
    DeviceBuffer bitmap(words * sizeof(uint64_t), what);
    check(cudaMemsetAsync(bitmap.get(), 0, bitmap.bytes(), stream), "cudaMemsetAsync");
    check(cudaMemcpyAsync(bitmap.get(), old.get(), std::min(old.bytes(), bitmap.bytes()),
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
    return bitmap;
  };
  DeviceBuffer captured, snapshot_set;
  if (captured_.get() != nullptr) {
    captured = grown_bitmap(captured_, "captured bitmap");
    snapshot_set = grown_bitmap(snapshot_set_, "snapshot bitmap");
  }
  DeviceBuffer freed, free_list;
  if (freed_.get() != nullptr) {
    freed = grown_bitmap(freed_, "freed bitmap");
    free_list = DeviceBuffer(capacity * sizeof(uint32_t), "free list");
    check(cudaMemcpyAsync(free_list.get(), free_list_.get(), free_list_.bytes(),
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  }

  const uint64_t slots = row::index_slots_for(capacity);
  DeviceBuffer index(slots * sizeof(row::Slot), "index");
  check(cudaMemsetAsync(index.get(), 0xFF, index.bytes(), stream), "cudaMemsetAsync");
  const row::IndexRef ref{index.get<row::Slot>(), slots - 1};
  if (rows > 0) {
    rebuild_index_kernel<kBlock>
        <<<blocks_for(rows), kBlock, 0, stream>>>(ref, arena, rows, freed.get<uint64_t>());
    check_launch("rebuild_index_kernel");
  }
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

  arena_ = arena;
  chunks_ = chunks;
  dirty_ = std::move(dirty);  // frees the old bitmap and index; nothing uses them now
  dirty_words_ = words;
  if (captured.get() != nullptr) {
    captured_ = std::move(captured);
    snapshot_set_ = std::move(snapshot_set);
  }
  if (freed.get() != nullptr) {
    freed_ = std::move(freed);
    free_list_ = std::move(free_list);
  }
  index_ = std::move(index);
  index_slots_ = slots;
}

void CudaTable::lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
                       void* stream_ptr) {
  if (n == 0) return;
  check_batch(n);
  Call call(*this, stream_ptr);
  const cudaStream_t stream = call.stream;

  AdmissionCounter* const admission = insert ? ledger_.admission() : nullptr;
  const bool admitting = admission != nullptr;
  if (admitting) {
    count_admission(keys, n, step, stream);
    if (!admit_keys_.empty()) {
      reserve_rows(admit_.get<int64_t>(), admit_keys_.size(), step, keys, n, stream);
    }
  } else if (insert) {
    reserve_rows(keys, n, step, keys, n, stream);
  }
  const size_t pending_n = admitting ? pending_pos_.size() : 0;
  ScratchLayout layout;
  const size_t rows_at = layout.take(n * sizeof(uint32_t));
  const size_t created_at = layout.take(n * sizeof(uint8_t));
  const size_t mask_at = layout.take(pending_n > 0 ? n : 0);
  const size_t pending_at = layout.take(pending_n * sizeof(uint32_t));
  char* base = scratch(layout.bytes, stream);
  auto* rows = reinterpret_cast<uint32_t*>(base + rows_at);
  auto* created = reinterpret_cast<uint8_t*>(base + created_at);
  uint8_t* pending = nullptr;
  if (pending_n > 0) {
    pending = reinterpret_cast<uint8_t*>(base + mask_at);
    auto* positions = reinterpret_cast<uint32_t*>(base + pending_at);
    // Pageable source: the copy has read it when the call returns.
    check(cudaMemcpyAsync(positions, pending_pos_.data(), pending_n * sizeof(uint32_t),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaMemsetAsync(pending, 0, n, stream), "cudaMemsetAsync");
    mark_positions_kernel<kBlock>
        <<<blocks_for(pending_n), kBlock, 0, stream>>>(positions, pending_n, pending);
    check_launch("mark_positions_kernel");
  }

  const uint32_t dim_shift = tile_shift_for(arena_.dim);
  if (insert) {
    const InsertParams params{free_list_.get<uint32_t>(), freed_.get<uint64_t>(), pending,
                              spec().evicts()};
    find_or_insert_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
        index_ref(), arena_, keys, n, step, params, rows, created, device_counters());
    check_launch("find_or_insert_kernel");
    if (params.free_list != nullptr) {
      settle_free_list_kernel<<<1, 1, 0, stream>>>(device_counters());
      check_launch("settle_free_list_kernel");
    }
    const uint32_t shift = tile_shift_for(arena_.stride);
    init_rows_kernel<kBlock><<<blocks_for(uint64_t{n} << shift), kBlock, 0, stream>>>(
        arena_, spec().init, spec().opt, keys, rows, created, n, shift, dirty_.get<uint64_t>());
    check_launch("init_rows_kernel");
  } else {
    resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
        index_ref(), keys, n, row::kNoRow, rows, nullptr, nullptr);
    check_launch("resolve_rows_kernel");
  }
  gather_rows_kernel<kBlock><<<blocks_for(uint64_t{n} << dim_shift), kBlock, 0, stream>>>(
      arena_, rows, n, dim_shift, pending, spec().init, keys, values_out);
  check_launch("gather_rows_kernel");
  // Every admitted key has its row now (reserve_rows made room for all of them).
  if (admitting) {
    for (const int64_t key : admit_keys_) admission->admitted(key);
  }
}

// Counts the occurrences of the batch's keys without a row, in batch order, on the host:
// admit_keys_ gets the keys that reached admit_after (copied to admit_), pending_pos_ the
// positions of the others. Synchronous.
void CudaTable::count_admission(const int64_t* keys, size_t n, uint64_t step, cudaStream_t stream) {
  admit_keys_.clear();
  pending_pos_.clear();
  const size_t select_temp = select_bytes(MissingAt{}, n, stream);
  ScratchLayout layout;
  const size_t rows_at = layout.take(n * sizeof(uint32_t));
  const size_t positions_at = layout.take(n * sizeof(uint32_t));
  const size_t keys_at = layout.take(n * sizeof(int64_t));
  const size_t temp_at = layout.take(select_temp);
  char* base = scratch(layout.bytes, stream);
  auto* rows = reinterpret_cast<uint32_t*>(base + rows_at);
  auto* positions = reinterpret_cast<uint32_t*>(base + positions_at);
  auto* missing_keys = reinterpret_cast<int64_t*>(base + keys_at);

  resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      index_ref(), keys, n, row::kNoRow, rows, nullptr, nullptr);
  check_launch("resolve_rows_kernel");
  const uint64_t m = select(MissingAt{rows}, n, positions, base + temp_at, select_temp, stream);
  if (m == 0) return;
  gather_keys_kernel<kBlock>
      <<<blocks_for(m), kBlock, 0, stream>>>(keys, positions, m, missing_keys);
  check_launch("gather_keys_kernel");
  missing_pos_.resize(m);
  missing_keys_.resize(m);
  check(cudaMemcpyAsync(missing_pos_.data(), positions, m * sizeof(uint32_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(missing_keys_.data(), missing_keys, m * sizeof(int64_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

  for (uint64_t j = 0; j < m; ++j) {
    if (ledger_.admission()->count(missing_keys_[j], step)) {
      admit_keys_.push_back(missing_keys_[j]);
    } else {
      pending_pos_.push_back(missing_pos_[j]);
    }
  }
  if (admit_keys_.empty()) return;
  const size_t bytes = admit_keys_.size() * sizeof(int64_t);
  if (bytes > admit_.bytes()) {  // the stream is idle: nothing uses the old buffer
    admit_.reset();
    admit_ = DeviceBuffer(std::max(bytes, size_t{4096}), "admitted keys");
  }
  check(cudaMemcpyAsync(admit_.get(), admit_keys_.data(), bytes, cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
}

// cub::DeviceSelect::If's temporary storage for select(predicate, items).
template <typename Predicate>
size_t CudaTable::select_bytes(Predicate predicate, uint64_t items, cudaStream_t stream) const {
  size_t bytes = 0;
  check(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<uint32_t>(0),
                              static_cast<uint32_t*>(nullptr),
                              static_cast<unsigned long long*>(nullptr),
                              static_cast<int64_t>(items), predicate, stream),
        "cub::DeviceSelect::If");
  return bytes;
}

// The i of [0, items) for which predicate(i), in ascending order, to out; returns how many.
// Synchronous.
template <typename Predicate>
uint64_t CudaTable::select(Predicate predicate, uint64_t items, uint32_t* out, void* temp,
                           size_t temp_bytes, cudaStream_t stream) {
  unsigned long long* selected = &device_counters()->selected;
  check(cub::DeviceSelect::If(temp, temp_bytes, thrust::counting_iterator<uint32_t>(0), out,
                              selected, static_cast<int64_t>(items), predicate, stream),
        "cub::DeviceSelect::If");
  return read_counters(stream).selected;
}

// Evicts the `need` least recently used live rows touched before `step` (ties: the lowest
// row), sparing the rows of call_keys, or throws CAPACITY_EXCEEDED, evicting nothing, when
// fewer are there. A pass over the table's stamps and a sort of the candidates'. d: the
// counters, read after every earlier call.
void CudaTable::make_room(uint64_t need, uint64_t step, const int64_t* call_keys, size_t call_n,
                          const DeviceCounters& d, cudaStream_t stream) {
  const uint64_t rows = d.rows;
  size_t sort_bytes = 0;
  {
    cub::DoubleBuffer<uint64_t> k(nullptr, nullptr);
    cub::DoubleBuffer<uint32_t> v(nullptr, nullptr);
    check(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, k, v, static_cast<int64_t>(rows), 0,
                                          64, stream),
          "cub::DeviceRadixSort::SortPairs");
  }
  const size_t temp_bytes = std::max(sort_bytes, select_bytes(EvictionCandidate{}, rows, stream));
  ScratchLayout layout;
  const size_t spared_at = layout.take(row::bitmap_words(rows) * sizeof(uint64_t));
  const size_t call_rows_at = layout.take(call_n * sizeof(uint32_t));
  const size_t rows0_at = layout.take(rows * sizeof(uint32_t));
  const size_t rows1_at = layout.take(rows * sizeof(uint32_t));
  const size_t steps0_at = layout.take(rows * sizeof(uint64_t));
  const size_t steps1_at = layout.take(rows * sizeof(uint64_t));
  const size_t keys_at = layout.take(need * sizeof(int64_t));
  const size_t temp_at = layout.take(temp_bytes);
  char* base = scratch(layout.bytes, stream);
  auto* spared = reinterpret_cast<uint64_t*>(base + spared_at);
  auto* call_rows = reinterpret_cast<uint32_t*>(base + call_rows_at);
  auto* rows0 = reinterpret_cast<uint32_t*>(base + rows0_at);
  auto* steps0 = reinterpret_cast<uint64_t*>(base + steps0_at);

  check(cudaMemsetAsync(spared, 0, row::bitmap_words(rows) * sizeof(uint64_t), stream),
        "cudaMemsetAsync");
  resolve_rows_kernel<kBlock><<<blocks_for(call_n), kBlock, 0, stream>>>(
      index_ref(), call_keys, call_n, row::kNoRow, call_rows, nullptr, nullptr);
  check_launch("resolve_rows_kernel");
  mark_rows_kernel<kBlock><<<blocks_for(call_n), kBlock, 0, stream>>>(call_rows, call_n, spared);
  check_launch("mark_rows_kernel");
  const uint64_t candidates =
      select(EvictionCandidate{arena_, freed_.get<uint64_t>(), spared, step}, rows, rows0,
             base + temp_at, temp_bytes, stream);
  if (candidates < need) fail_no_room(spec(), need, candidates, step);
  gather_steps_kernel<kBlock>
      <<<blocks_for(candidates), kBlock, 0, stream>>>(arena_, rows0, candidates, steps0);
  check_launch("gather_steps_kernel");
  // Stable: rows of the same step stay in ascending order.
  cub::DoubleBuffer<uint64_t> steps(steps0, reinterpret_cast<uint64_t*>(base + steps1_at));
  cub::DoubleBuffer<uint32_t> order(rows0, reinterpret_cast<uint32_t*>(base + rows1_at));
  size_t bytes = temp_bytes;
  check(cub::DeviceRadixSort::SortPairs(base + temp_at, bytes, steps, order,
                                        static_cast<int64_t>(candidates), 0, 64, stream),
        "cub::DeviceRadixSort::SortPairs");
  evict_rows(order.Current(), need, reinterpret_cast<int64_t*>(base + keys_at), d, stream);
}

// Evicts victims[0, n) (distinct live rows, in device memory): a snapshot in progress gets them
// first, then they join the free list, the index is rebuilt without them and their keys become
// tombstones. keys_out: n keys of device scratch. d: the counters, read after every earlier
// call. Synchronous.
void CudaTable::evict_rows(const uint32_t* victims, uint64_t n, int64_t* keys_out,
                           const DeviceCounters& d, cudaStream_t stream) {
  if (n == 0) return;
  // Host room first: past this point only a device error can fail.
  evicted_keys_.resize(n);
  ledger_.reserve_evicted(n);
  if (sink_ != nullptr && captured_left_ > 0) copy_on_write(victims, n, row::kNoRow, stream);
  free_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      arena_, victims, n, dirty_.get<uint64_t>(), freed_.get<uint64_t>(),
      free_list_.get<uint32_t>(), d.free_rows, keys_out);
  check_launch("free_rows_kernel");
  add_free_rows_kernel<<<1, 1, 0, stream>>>(device_counters(), n);
  check_launch("add_free_rows_kernel");
  // Linear probing has no cheap concurrent delete: the index is rebuilt from the live rows.
  check(cudaMemsetAsync(index_.get(), 0xFF, index_.bytes(), stream), "cudaMemsetAsync");
  rebuild_index_kernel<kBlock><<<blocks_for(d.rows), kBlock, 0, stream>>>(
      index_ref(), arena_, d.rows, freed_.get<uint64_t>());
  check_launch("rebuild_index_kernel");
  check(cudaMemcpyAsync(evicted_keys_.data(), keys_out, n * sizeof(int64_t), cudaMemcpyDeviceToHost,
                        stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  ledger_.evicted(evicted_keys_.data(), n);
}

uint64_t CudaTable::evict_before(uint64_t cutoff_step) {
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  uint64_t evicted = 0;
  if (freed_.get() != nullptr) {
    const DeviceCounters d = read_counters(stream);  // exact: synchronizes after the wait
    rows_bound_ = d.rows;
    if (d.rows > d.free_rows) {
      const EvictionCandidate idle{arena_, freed_.get<uint64_t>(), nullptr, cutoff_step};
      const size_t temp_bytes = select_bytes(idle, d.rows, stream);
      ScratchLayout layout;
      const size_t victims_at = layout.take(d.rows * sizeof(uint32_t));
      const size_t keys_at = layout.take(d.rows * sizeof(int64_t));
      const size_t temp_at = layout.take(temp_bytes);
      char* base = scratch(layout.bytes, stream);
      auto* victims = reinterpret_cast<uint32_t*>(base + victims_at);
      evicted = select(idle, d.rows, victims, base + temp_at, temp_bytes, stream);
      evict_rows(victims, evicted, reinterpret_cast<int64_t*>(base + keys_at), d, stream);
    }
  }
  ledger_.forget_before(cutoff_step);
  return evicted;
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

  // (3b) Copy-on-write: captured rows among the unique rows go to the snapshot first, with the
  // contents they had at capture. Synchronous, and only while rows remain captured.
  if (sink_ != nullptr && captured_left_ > 0) {
    uint32_t runs = 0;
    check(cudaMemcpyAsync(&runs, num_runs, sizeof(runs), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    copy_on_write(run_rows, runs, no_row, stream);
  }

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
  c.rows = d.rows - d.free_rows;
  c.capacity = capacity_rows();
  c.dirty_rows = d.dirty_rows;
  c.inserted = d.inserted;
  c.admitted = d.inserted - loaded_rows_;  // every row training inserted
  c.evicted = ledger_.evicted_total();
  c.pending_admission = ledger_.pending_admission();
  c.skipped_keys = d.skipped_keys;
  return c;
}

// ---------------------------------------------------------------------------- snapshots --
// Each runs on own_stream_ in the table's call order (Call) and synchronizes before it
// returns, so the host state below always describes finished device work.

// The grow-only device staging buffer, at least `bytes`. Every earlier use of it has
// finished (each user synchronizes before it returns); growing waits for the stream anyway.
char* CudaTable::stage(size_t bytes, cudaStream_t stream) {
  if (bytes > stage_.bytes()) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    const size_t grown = std::max(bytes, stage_.bytes() + stage_.bytes() / 2);
    stage_.reset();
    stage_ = DeviceBuffer(grown, "snapshot staging");
  }
  return stage_.get<char>();
}

uint64_t CudaTable::capture(bool full, SnapshotSink* sink, uint64_t* live_rows) {
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  if (snapshot_active_) {
    fail(EMBSTORE_INTERNAL, "table '{}': capture while a snapshot is in progress", spec().name);
  }
  // Synchronizes after the wait on the previous call: the row count is exact.
  const DeviceCounters d = read_counters(stream);
  const uint64_t rows = d.rows;
  rows_bound_ = rows;

  const size_t bitmap_bytes = dirty_words_ * sizeof(uint64_t);
  if (captured_.bytes() != bitmap_bytes) {
    DeviceBuffer captured(bitmap_bytes, "captured bitmap");
    DeviceBuffer snapshot_set(bitmap_bytes, "snapshot bitmap");
    captured_ = std::move(captured);
    snapshot_set_ = std::move(snapshot_set);
  }
  // The counts are frozen before the dirty bits move; from then on only end_snapshot settles
  // them.
  ledger_.begin_capture(full);
  uint64_t captured = 0;
  try {
    unsigned long long* total = &device_counters()->captured;
    check(cudaMemsetAsync(total, 0, sizeof(*total), stream), "cudaMemsetAsync");
    // Writes every word of captured_ (and clears every word of dirty_).
    capture_kernel<kBlock><<<blocks_for(dirty_words_), kBlock, 0, stream>>>(
        full, dirty_.get<uint64_t>(), captured_.get<uint64_t>(), dirty_words_, rows,
        freed_.get<uint64_t>(), total);
    check_launch("capture_kernel");
    check(cudaMemcpyAsync(snapshot_set_.get(), captured_.get(), bitmap_bytes,
                          cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
    captured = read_counters(stream).captured;
  } catch (...) {
    ledger_.abort_capture();
    throw;
  }
  ledger_.commit_capture();
  sink_ = sink;
  snapshot_active_ = true;
  captured_left_ = captured;
  captured_left_seen_.store(captured);
  drain_word_ = 0;
  drain_end_word_ = row::bitmap_words(rows);
  *live_rows = rows - d.free_rows;
  return captured;
}

// Takes up to `want` captured rows in row order from drain_word_ and writes their records to
// host memory `out`. Returns the rows written, fewer than want only when no captured row is
// left. Synchronous.
uint64_t CudaTable::drain_piece(uint64_t want, char* out, cudaStream_t stream) {
  if (want == 0 || drain_word_ >= drain_end_word_) return 0;
  const uint64_t window =
      std::min(drain_end_word_ - drain_word_,
               std::clamp<uint64_t>(row::bitmap_words(want) * 2, kMinDrainWords, kMaxDrainWords));

  // The scan's temporary storage for the largest window serves every smaller one.
  size_t scan_bytes = 0;
  check(cub::DeviceScan::InclusiveSum(nullptr, scan_bytes, static_cast<const uint32_t*>(nullptr),
                                      static_cast<uint32_t*>(nullptr), static_cast<int>(window),
                                      stream),
        "cub::DeviceScan::InclusiveSum");
  ScratchLayout layout;
  const size_t ids_at = layout.take(want * sizeof(uint32_t));
  const size_t counts_at = layout.take(window * sizeof(uint32_t));
  const size_t ends_at = layout.take(window * sizeof(uint32_t));
  const size_t temp_at = layout.take(scan_bytes);
  char* base = scratch(layout.bytes, stream);
  auto* ids = reinterpret_cast<uint32_t*>(base + ids_at);
  auto* counts = reinterpret_cast<uint32_t*>(base + counts_at);
  auto* ends = reinterpret_cast<uint32_t*>(base + ends_at);
  // Allocated before any bit is taken, so that a failure to allocate loses no row.
  const uint64_t record = row::record_bytes(arena_.stride);
  char* records = stage(want * record, stream);
  uint64_t* captured = captured_.get<uint64_t>();
  DeviceCounters* dc = device_counters();

  uint64_t got = 0;
  while (got < want && drain_word_ < drain_end_word_) {
    const uint64_t first = drain_word_;
    const uint64_t words = std::min(drain_end_word_ - first, window);
    const uint64_t left = want - got;
    captured_counts_kernel<kBlock>
        <<<blocks_for(words), kBlock, 0, stream>>>(captured, first, words, counts);
    check_launch("captured_counts_kernel");
    size_t temp_bytes = scan_bytes;
    check(cub::DeviceScan::InclusiveSum(base + temp_at, temp_bytes, counts, ends,
                                        static_cast<int>(words), stream),
          "cub::DeviceScan::InclusiveSum");
    take_captured_kernel<kBlock><<<blocks_for(words), kBlock, 0, stream>>>(
        captured, first, words, ends, left, ids + got, &dc->drain_total, &dc->drain_word);
    check_launch("take_captured_kernel");
    const DeviceCounters d = read_counters(stream);
    if (d.drain_total > left) {  // the pass stopped inside word drain_word
      drain_word_ = d.drain_word;
      got = want;
    } else {  // took every captured row of the window
      drain_word_ = first + words;
      got += d.drain_total;
    }
  }
  if (got == 0) return 0;

  write_records_kernel<kBlock>
      <<<blocks_for(got), kBlock, 0, stream>>>(arena_, ids, got, nullptr, records, record);
  check_launch("write_records_kernel");
  check(cudaMemcpyAsync(out, records, got * record, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return got;
}

uint64_t CudaTable::drain(SnapshotSink* sink, uint64_t max_rows) {
  // Training goes first, up to the patience of drain_turn_: no drain while a call holds or
  // wants the table, or while the GPU still runs the table's earlier work (waiting for that
  // here would take training's run-ahead).
  std::unique_lock lock(mutex_, std::defer_lock);
  DeviceGuard guard(device_);
  bool busy = callers_.load(std::memory_order_acquire) > 0 || !lock.try_lock();
  if (!busy) {
    const cudaError_t q = cudaEventQuery(done_);
    if (q == cudaErrorNotReady) {
      if (cudaPeekAtLastError() == cudaErrorNotReady) (void)cudaGetLastError();
      busy = true;
    } else {
      check(q, "cudaEventQuery");
    }
  }
  if (drain_turn_.give_way(busy)) return captured_left_seen_.load();
  if (!lock.owns_lock()) lock.lock();
  if (sink_ == nullptr) return 0;  // the snapshot has ended
  CallScope scope(done_, own_stream_);
  const cudaStream_t stream = own_stream_;
  FlushOnExit flush{sink};
  uint64_t budget = std::min(max_rows, captured_left_);
  while (budget > 0) {
    const uint64_t ask = std::min(budget, stage_rows());
    uint64_t granted = 0;
    char* out = sink->reserve(ask, /*wait=*/false, &granted);
    if (out == nullptr) break;  // staging is full
    granted = std::min(granted, ask);
    const uint64_t filled = drain_piece(granted, out, stream);
    sink->commit(filled);
    captured_left_ -= std::min(filled, captured_left_);
    budget -= filled;
    if (filled < granted) {  // the bitmap holds no captured row any more
      captured_left_ = 0;
      break;
    }
  }
  captured_left_seen_.store(captured_left_);
  return captured_left_;  // flush's destructor hands the records over
}

// Copy-on-write of rows about to change (apply_gradients' unique rows, between the run-length
// encoding and the fused update; eviction's victims): the captured rows among rows[0, runs)
// (device memory; entries equal to no_row skipped) are taken and their records (their contents
// at capture: nothing has touched them since) written to the sink, waiting for room. In
// windows so that device staging stays bounded. Synchronous.
void CudaTable::copy_on_write(const uint32_t* run_rows, uint64_t runs, uint32_t no_row,
                              cudaStream_t stream) {
  if (runs == 0) return;

  const uint64_t record = row::record_bytes(arena_.stride);
  const uint64_t window = std::min<uint64_t>(runs, stage_rows());
  ScratchLayout layout;
  const size_t records_at = layout.take(window * record);
  const size_t ids_at = layout.take(window * sizeof(uint32_t));
  char* base = stage(layout.bytes, stream);
  char* records = base + records_at;
  auto* ids = reinterpret_cast<uint32_t*>(base + ids_at);
  unsigned long long* count = &device_counters()->cow_rows;

  // No staging chunk stays with the table between calls, even after a failure: the writer
  // can always free one.
  FlushOnExit flush{sink_};
  uint64_t taken = 0;
  bool aborted = false;
  for (uint64_t first = 0; first < runs && captured_left_ > 0 && !aborted; first += window) {
    const uint64_t n = std::min<uint64_t>(window, runs - first);
    check(cudaMemsetAsync(count, 0, sizeof(*count), stream), "cudaMemsetAsync");
    take_runs_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
        captured_.get<uint64_t>(), run_rows + first, n, no_row, ids, count);
    check_launch("take_runs_kernel");
    write_records_kernel<kBlock>
        <<<blocks_for(n), kBlock, 0, stream>>>(arena_, ids, n, count, records, record);
    check_launch("write_records_kernel");
    const uint64_t k = read_counters(stream).cow_rows;  // synchronizes
    captured_left_ -= std::min(k, captured_left_);
    taken += k;
    for (uint64_t done = 0; done < k;) {
      uint64_t granted = 0;
      char* out = sink_->reserve(k - done, /*wait=*/true, &granted);
      if (out == nullptr) {  // the snapshot was aborted: nothing needs writing any more
        aborted = true;
        break;
      }
      granted = std::min(granted, k - done);
      if (granted == 0) {  // would never finish; the rows stay in the snapshot set
        fail(EMBSTORE_INTERNAL, "table '{}': the snapshot sink granted no room while waiting",
             spec().name);
      }
      check(cudaMemcpyAsync(out, records + done * record, granted * record, cudaMemcpyDeviceToHost,
                            stream),
            "cudaMemcpyAsync");
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      sink_->commit(granted);
      done += granted;
    }
  }
  if (taken > 0) sink_->count_copy_on_write(taken);
  captured_left_seen_.store(captured_left_);
}

void CudaTable::end_snapshot(bool failed) {
  // The host state first, whatever the device does below: the sink dies with the job.
  const Caller caller(callers_);
  std::lock_guard lock(mutex_);
  const bool active = snapshot_active_;
  sink_ = nullptr;
  snapshot_active_ = false;
  captured_left_ = 0;
  captured_left_seen_.store(0);
  drain_word_ = 0;
  drain_end_word_ = 0;
  ledger_.end_snapshot(failed);
  if (!active) return;
  DeviceGuard guard(device_);
  CallScope scope(done_, own_stream_);
  const cudaStream_t stream = own_stream_;
  if (failed) {
    restore_dirty_kernel<kBlock><<<blocks_for(dirty_words_), kBlock, 0, stream>>>(
        dirty_.get<uint64_t>(), snapshot_set_.get<uint64_t>(), freed_.get<uint64_t>(),
        dirty_words_);
    check_launch("restore_dirty_kernel");
  }
  check(cudaMemsetAsync(captured_.get(), 0, captured_.bytes(), stream), "cudaMemsetAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  stage_.reset();  // up to kStageBytes per table: not kept between snapshots
}

// Rows get ids in the order given, like the host backend's serial inserts: the keys, checked
// distinct and absent per piece, each claim an empty slot with a preset id.
void CudaTable::load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                          uint64_t step) {
  if (n == 0) return;
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  uint64_t rows = read_counters(stream).rows;  // exact: synchronizes after the wait
  rows_bound_ = rows;
  const uint64_t limit = row::row_limit(spec().max_capacity);
  if (rows + n > limit) fail_over_limit(spec(), n, rows, "rows to load", "loaded");

  const uint32_t dim = arena_.dim;
  const uint32_t state_dim = arena_.stride - dim;
  const uint64_t row_bytes = sizeof(int64_t) + uint64_t{arena_.stride} * sizeof(float);
  const uint64_t piece_max = std::max<uint64_t>(1, kStageBytes / row_bytes);
  const uint32_t shift = tile_shift_for(arena_.stride);
  for (size_t done = 0; done < n;) {
    const uint64_t c = std::min<uint64_t>(n - done, piece_max);
    ScratchLayout layout;
    const size_t keys_at = layout.take(c * sizeof(int64_t));
    const size_t values_at = layout.take(c * dim * sizeof(float));
    const size_t state_at = layout.take(c * state_dim * sizeof(float));
    // Not scratch: count_new_keys and grow use that.
    char* base = stage(layout.bytes, stream);
    auto* d_keys = reinterpret_cast<int64_t*>(base + keys_at);
    auto* d_values = reinterpret_cast<float*>(base + values_at);
    auto* d_state = reinterpret_cast<float*>(base + state_at);
    check(cudaMemcpyAsync(d_keys, keys + done, c * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    check(cudaMemcpyAsync(d_values, values + done * dim, c * dim * sizeof(float),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync");
    if (state_dim > 0) {
      check(cudaMemcpyAsync(d_state, state + done * state_dim, c * state_dim * sizeof(float),
                            cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync");
    }
    const uint64_t fresh = count_new_keys(d_keys, c, stream);  // synchronizes
    if (fresh != c) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "table '{}': load_rows needs distinct keys that the table does not hold; {} of {} "
           "keys at offset {} are repeated or present",
           spec().name, c - fresh, c, done);
    }
    if (rows + c > capacity_rows()) grow(rows + c, rows, stream);  // the stream is idle

    load_index_kernel<kBlock>
        <<<blocks_for(c), kBlock, 0, stream>>>(index_ref(), arena_, d_keys, c, rows, step);
    check_launch("load_index_kernel");
    load_values_kernel<kBlock>
        <<<blocks_for(c << shift), kBlock, 0, stream>>>(arena_, d_values, d_state, c, rows, shift);
    check_launch("load_values_kernel");
    add_loaded_rows_kernel<<<1, 1, 0, stream>>>(device_counters(), c);
    check_launch("add_loaded_rows_kernel");
    rows += c;
    rows_bound_ = rows;
    loaded_rows_ += c;
    done += c;
  }
  // The host buffers may go once this returns.
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

bool CudaTable::load_admission(const io::AdmissionFile& counts, std::string* why) {
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  // The keys that have a row, from the rows' metadata (once per restore), before the counts
  // change: a failure here leaves them as they were.
  std::vector<int64_t> keys;
  if (ledger_.admission() != nullptr) {
    const DeviceCounters d = read_counters(stream);
    std::vector<uint64_t> freed(row::bitmap_words(d.rows), 0);
    if (freed_.get() != nullptr && !freed.empty()) {
      check(cudaMemcpyAsync(freed.data(), freed_.get(), freed.size() * sizeof(uint64_t),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync");
    }
    std::vector<row::RowMeta> meta(d.rows);
    uint64_t first = 0;
    for (uint32_t c = 0; c < chunks_ && first < d.rows; ++c) {
      const uint64_t n = std::min<uint64_t>(row::chunk_rows(c, arena_.base_shift), d.rows - first);
      check(cudaMemcpyAsync(meta.data() + first, meta_[c].get(), n * sizeof(row::RowMeta),
                            cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync");
      first += n;
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    keys.reserve(d.rows);
    for (uint64_t r = 0; r < d.rows; ++r) {
      if (!row::bitmap_test(freed.data(), r)) keys.push_back(meta[r].key);
    }
    std::sort(keys.begin(), keys.end());
  }
  return ledger_.load_admission(
      counts, why, [&](int64_t key) { return std::binary_search(keys.begin(), keys.end(), key); });
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

// Never throws: where registration fails the memory stays pageable (copies still work, only
// slower) and the error is cleared so no later check sees it.
void pin_host_memory(void* p, size_t bytes, int device) {
  if (p == nullptr || bytes == 0) return;
  // On the store's device: registering starts the current device's context otherwise.
  const detail::DeviceGuard guard(device, std::nothrow);
  // Portable: pinned for every device's context, whichever device a table lives on.
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

void unpin_host_memory(void* p, int device) {
  if (p == nullptr) return;
  const detail::DeviceGuard guard(device, std::nothrow);
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();  // e.g. never pinned
}

}  // namespace embstore
