// The CUDA table's side of a stack of tables (host/table/stacked_table.hpp): whole rows taken
// out (their keys, stamps, dirty bits and records gathered to the host, then the rows freed as
// an eviction frees them, without tombstones) and put in (on freed ids first, as an insert takes
// them). Neither counts as an insert or an eviction. Every call is synchronous: the stack moves
// rows between a call's stages, on the host.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/eviction.cuh"
#include "cuda/backend/kernels/lookup.cuh"
#include "cuda/backend/kernels/moves.cuh"

namespace embstore::cuda_backend {
namespace {

// A batch of n moving rows' arrays (MovedRows') in device memory: where each lies in a buffer.
struct MovedLayout {
  size_t keys = 0, steps = 0, dirty = 0, in_snapshot = 0, records = 0, bytes = 0;
  MovedLayout(uint64_t n, uint32_t stride) {
    ScratchLayout layout;
    keys = layout.take(n * sizeof(int64_t));
    steps = layout.take(n * sizeof(uint64_t));
    dirty = layout.take(n * sizeof(uint8_t));
    in_snapshot = layout.take(n * sizeof(uint8_t));
    records = layout.take(n * size_t{stride} * sizeof(float));
    bytes = layout.bytes;
  }
};

// resolve_on_host's arrays in scratch: n keys and their rows.
struct ResolveLayout {
  size_t keys = 0, rows = 0, bytes = 0;
  explicit ResolveLayout(uint64_t n) {
    ScratchLayout layout;
    keys = layout.take(n * sizeof(int64_t));
    rows = layout.take(n * sizeof(uint32_t));
    bytes = layout.bytes;
  }
};

// Copies rows [first, first + n) of `rows` to the device arrays at base (const MovedRows: a put)
// or from them (MovedRows: a take).
template <typename Rows>
void copy_moved(const MovedLayout& at, char* base, Rows& rows, size_t first, uint64_t n,
                uint32_t stride, cudaStream_t stream) {
  const auto copy = [&](size_t offset, auto* host, size_t bytes) {
    char* device = base + offset;
    if constexpr (std::is_const_v<Rows>) {
      check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream),
            "cudaMemcpyAsync");
    } else {
      check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream),
            "cudaMemcpyAsync");
    }
  };
  copy(at.keys, rows.keys.data() + first, n * sizeof(int64_t));
  copy(at.steps, rows.steps.data() + first, n * sizeof(uint64_t));
  copy(at.dirty, rows.dirty.data() + first, n * sizeof(uint8_t));
  copy(at.in_snapshot, rows.in_snapshot.data() + first, n * sizeof(uint8_t));
  copy(at.records, rows.records.data() + first * stride, n * size_t{stride} * sizeof(float));
}

}  // namespace

uint64_t CudaTable::live_rows() {
  Call call(*this, own_stream_);
  const DeviceCounters d = read_counters(call.stream);  // exact: synchronizes after the wait
  rows_bound_ = d.rows;
  return d.rows - d.free_rows;
}

void CudaTable::resolve_on_host(const int64_t* keys, size_t n, std::vector<uint32_t>* rows,
                                cudaStream_t stream) {
  rows->resize(n);
  if (n == 0) return;
  check_batch(n);
  const ResolveLayout at(n);
  char* base = scratch(at.bytes, stream);
  auto* d_keys = reinterpret_cast<int64_t*>(base + at.keys);
  auto* d_rows = reinterpret_cast<uint32_t*>(base + at.rows);
  check(cudaMemcpyAsync(d_keys, keys, n * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      index_ref(), d_keys, n, row::kNoRow, d_rows, nullptr, nullptr);
  check_launch("resolve_rows_kernel");
  check(cudaMemcpyAsync(rows->data(), d_rows, n * sizeof(uint32_t), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

void CudaTable::find_held(const int64_t* keys, size_t n, uint8_t* held) {
  Call call(*this, own_stream_);
  std::vector<uint32_t> rows;
  resolve_on_host(keys, n, &rows, call.stream);
  for (size_t i = 0; i < n; ++i) held[i] = rows[i] != row::kNoRow ? 1 : 0;
}

// Rows leave only a table that keeps a free list (TableSpec::frees_rows: a stack's upper one).
void CudaTable::check_gives_rows() const {
  if (freed_.get() == nullptr) {
    fail(EMBSTORE_INTERNAL, "table '{}': rows taken out of a table that keeps no free list",
         spec().name);
  }
}

void CudaTable::take_rows(const int64_t* keys, size_t n, MovedRows* out) {
  remove_keys(keys, n, out);
}

uint64_t CudaTable::evict_keys(const int64_t* keys, size_t n) {
  return remove_keys(keys, n, nullptr);
}

// The counts are the host's here (TableSpec::counts_on_host): no device work.
uint64_t CudaTable::count_admission(const int64_t* keys, size_t n, uint64_t step, bool count) {
  std::lock_guard lock(mutex_);
  return ledger_.count_admission(keys, n, step, count, spec().name);
}

uint64_t CudaTable::remove_keys(const int64_t* keys, size_t n, MovedRows* out) {
  check_gives_rows();
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  std::vector<uint32_t> rows;
  resolve_on_host(keys, n, &rows, stream);
  rows.erase(std::remove(rows.begin(), rows.end(), row::kNoRow), rows.end());
  if (rows.empty()) return 0;
  const DeviceCounters d = read_counters(stream);
  rows_bound_ = d.rows;
  const uint64_t m = rows.size();
  ScratchLayout layout;
  const size_t victims_at = layout.take(m * sizeof(uint32_t));
  const size_t keys_at = layout.take(m * sizeof(int64_t));
  char* base = scratch(layout.bytes, stream);
  auto* victims = reinterpret_cast<uint32_t*>(base + victims_at);
  // Pageable source: the copy has read it when the call returns; remove_rows synchronizes the
  // stream before `rows` goes.
  check(cudaMemcpyAsync(victims, rows.data(), m * sizeof(uint32_t), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  remove_rows(victims, m, reinterpret_cast<int64_t*>(base + keys_at), d, stream, out);
  return m;
}

void CudaTable::take_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                             size_t n_spare, MovedRows* out) {
  choose_coldest(count, before_step, spare, n_spare, out, nullptr);
}

uint64_t CudaTable::list_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                                 size_t n_spare, std::vector<RowAge>* out) {
  out->clear();
  return choose_coldest(count, before_step, spare, n_spare, nullptr, out);
}

uint64_t CudaTable::choose_coldest(uint64_t count, uint64_t before_step, const int64_t* spare,
                                   size_t n_spare, MovedRows* out, std::vector<RowAge>* ages) {
  if (count == 0) return 0;
  check_gives_rows();
  check_batch(n_spare);
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  const DeviceCounters d = read_counters(stream);
  rows_bound_ = d.rows;
  if (d.rows == d.free_rows) return 0;
  // The spared keys in the staging buffer: make_room's selection uses scratch, and what follows
  // it (gather_leaving, copy-on-write) the staging only once the spared keys are read.
  int64_t* d_spare = nullptr;
  if (n_spare > 0) {
    d_spare = reinterpret_cast<int64_t*>(stage(n_spare * sizeof(int64_t), stream));
    check(
        cudaMemcpyAsync(d_spare, spare, n_spare * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync");
  }
  return make_room(count, before_step, d_spare, n_spare, d, stream, out, ages);
}

void CudaTable::gather_leaving(const uint32_t* victims, uint64_t n, MovedRows* out,
                               cudaStream_t stream) {
  const uint32_t stride = arena_.stride;
  const size_t before = out->size();
  // Host room first: past this point only a device error can fail.
  out->reserve_more(n, stride);
  out->truncate(before + n, stride);
  try {
    // A take or a put of many rows (a stack's move down: a sixteenth of its upper budget) goes
    // through the staging a copy-on-write's worth at a time, not all at once.
    const uint64_t window = std::min(n, stage_rows());
    const MovedLayout at(window, stride);
    char* base = stage(at.bytes, stream);
    const uint64_t* snapshot = snapshot_active_ ? snapshot_set_.get<uint64_t>() : nullptr;
    const uint32_t shift = tile_shift_for(stride);
    // Each window's copy to the (pageable) host arrays is done when it returns, and the next
    // window's gather follows it on the stream.
    for (uint64_t first = 0; first < n; first += window) {
      const uint64_t m = std::min(window, n - first);
      gather_leaving_kernel<kBlock><<<blocks_for(m << shift), kBlock, 0, stream>>>(
          arena_, victims + first, m, dirty_.get<uint64_t>(), snapshot, carried_.get<uint64_t>(),
          reinterpret_cast<int64_t*>(base + at.keys), reinterpret_cast<uint64_t*>(base + at.steps),
          reinterpret_cast<uint8_t*>(base + at.dirty),
          reinterpret_cast<uint8_t*>(base + at.in_snapshot),
          reinterpret_cast<float*>(base + at.records), shift);
      check_launch("gather_leaving_kernel");
      copy_moved(at, base, *out, before + first, m, stride, stream);
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  } catch (...) {
    out->truncate(before, stride);
    throw;
  }
}

// Grows the arena for n rows put in on freed ids first (d: the counters, read after every earlier
// call; the stream is idle), and bounds the ids in use by those they may take. Returns the freed
// ids they may take.
uint64_t CudaTable::grow_for_put(uint64_t n, const DeviceCounters& d, cudaStream_t stream) {
  const uint64_t free_rows = freed_.get() != nullptr ? d.free_rows : 0;
  const uint64_t fresh = n > free_rows ? n - free_rows : 0;
  if (d.rows + fresh > capacity_rows()) grow(d.rows + fresh, d.rows, stream);
  rows_bound_ = d.rows + fresh;
  return free_rows;
}

void CudaTable::reserve_put(uint64_t n) {
  if (n == 0) return;
  check_batch(n);
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  grow_for_put(n, read_counters(stream), stream);  // exact: synchronizes after the wait
  // put_rows' buffers: the held-key check's scratch, the rows' staging (a window of them).
  scratch(ResolveLayout(n).bytes, stream);
  stage(MovedLayout(std::min(n, stage_rows()), arena_.stride).bytes, stream);
}

void CudaTable::put_rows(const MovedRows& rows) {
  const uint64_t n = rows.size();
  if (n == 0) return;
  check_batch(n);
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  const uint32_t stride = arena_.stride;
  const DeviceCounters d = read_counters(stream);  // exact: synchronizes after the wait
  rows_bound_ = d.rows;
  const uint64_t live = d.rows - d.free_rows;
  if (live + n > row::row_limit(spec().max_capacity)) {
    fail_over_limit(spec(), n, live, "rows moved in", "moved");
  }
  // A key the table holds would get a second row: refused before anything changes.
  std::vector<uint32_t> held;
  resolve_on_host(rows.keys.data(), n, &held, stream);
  for (uint64_t i = 0; i < n; ++i) {
    if (held[i] != row::kNoRow) {
      fail(EMBSTORE_INTERNAL, "table '{}': a row put in for key {} that the table holds",
           spec().name, rows.keys[i]);
    }
  }
  const uint64_t free_rows = grow_for_put(n, d, stream);

  const uint64_t window = std::min(n, stage_rows());  // as in gather_leaving
  const MovedLayout at(window, stride);
  char* base = stage(at.bytes, stream);
  const uint32_t shift = tile_shift_for(stride);
  // A copy from pageable memory returns once its source is read; the staging it fills is read by
  // the window's kernel before the next window's copy, both on the stream.
  for (uint64_t first = 0; first < n; first += window) {
    const uint64_t m = std::min(window, n - first);
    copy_moved(at, base, rows, first, m, stride, stream);
    put_rows_kernel<kBlock><<<blocks_for(m << shift), kBlock, 0, stream>>>(
        index_ref(), arena_, reinterpret_cast<const int64_t*>(base + at.keys),
        reinterpret_cast<const uint64_t*>(base + at.steps),
        reinterpret_cast<const uint8_t*>(base + at.dirty),
        reinterpret_cast<const uint8_t*>(base + at.in_snapshot),
        reinterpret_cast<const float*>(base + at.records), first, m, free_list_.get<uint32_t>(),
        free_rows, d.rows, dirty_.get<uint64_t>(), freed_.get<uint64_t>(), carried_.get<uint64_t>(),
        snapshot_active_, shift);
    check_launch("put_rows_kernel");
  }
  settle_put_kernel<<<1, 1, 0, stream>>>(device_counters(), n);
  check_launch("settle_put_kernel");
  // The host buffers may go once this returns.
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

}  // namespace embstore::cuda_backend
