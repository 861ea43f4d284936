// The CUDA table's eviction (idle rules, making room at max_capacity, the free list) and the
// counting of keys pending admission on the host, in the table's KeyLedger (a counting Bloom
// filter, or exact counts with TableSpec::counts_on_host; else exact counts are counted on the
// device: device_admission.cuh).
#include <algorithm>
#include <cub/device/device_reduce.cuh>
#include <vector>

#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/eviction.cuh"
#include "cuda/backend/kernels/lookup.cuh"
#include "cuda/backend/kernels/snapshot.cuh"

namespace embstore::cuda_backend {

// Counts the occurrences of the batch's keys without a row, in batch order, on the host:
// admit_keys_ gets the keys that reached admit_after (copied to admit_), pending_pos_ the
// positions of the others. Synchronous.
void CudaTable::count_admission_on_host(const int64_t* keys, size_t n, uint64_t step,
                                        cudaStream_t stream) {
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

// Evicts the `need` least recently used live rows touched before `step` (ties: the lowest
// key, as on the host: rows' ids are handed out in parallel here, and tables fed the same calls
// must evict the same keys), sparing the rows of call_keys, or throws CAPACITY_EXCEEDED,
// evicting nothing, when fewer are there. As on the host, no sort of every candidate: a
// histogram of their stamps (row::RoomBuckets) finds the boundary bucket; the candidates below
// it go, and only the bucket's own are sorted (by key, then stably by stamp: row::evicted_first).
// d: the counters, read after every earlier call. Synchronous.
uint64_t CudaTable::make_room(uint64_t need, uint64_t step, const int64_t* call_keys, size_t call_n,
                              const DeviceCounters& d, cudaStream_t stream, MovedRows* out,
                              std::vector<RowAge>* ages, uint64_t grow_to) {
  const uint64_t rows = d.rows;
  const auto items = static_cast<int64_t>(rows);
  size_t temp_bytes = select_bytes(EvictionCandidate{}, rows, stream);
  {
    size_t bytes = 0;
    cub::DoubleBuffer<uint64_t> stamps(nullptr, nullptr);
    cub::DoubleBuffer<int64_t> keys(nullptr, nullptr);
    cub::DoubleBuffer<uint32_t> v(nullptr, nullptr);
    const uint32_t* in = nullptr;
    uint64_t* least = nullptr;
    unsigned long long* count = nullptr;
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, stamps, v, items, 0, 64, stream),
          "cub::DeviceRadixSort::SortPairs");
    temp_bytes = std::max(temp_bytes, bytes);
    check(cub::DeviceRadixSort::SortPairs(nullptr, bytes, keys, v, items, 0, 64, stream),
          "cub::DeviceRadixSort::SortPairs");
    temp_bytes = std::max(temp_bytes, bytes);
    check(cub::DeviceReduce::Min(nullptr, bytes, stamps.Current(), least, items, stream),
          "cub::DeviceReduce::Min");
    temp_bytes = std::max(temp_bytes, bytes);
    check(
        cub::DeviceSelect::If(nullptr, bytes, in, v.Current(), count, items, GoesForRoom{}, stream),
        "cub::DeviceSelect::If");
    temp_bytes = std::max(temp_bytes, bytes);
    check(cub::DeviceSelect::If(nullptr, bytes, in, v.Current(), count, items, InRoomBoundary{},
                                stream),
          "cub::DeviceSelect::If");
    temp_bytes = std::max(temp_bytes, bytes);
  }
  ScratchLayout layout;
  const size_t spared_at = layout.take(row::bitmap_words(rows) * sizeof(uint64_t));
  const size_t call_rows_at = layout.take(call_n * sizeof(uint32_t));
  const size_t rows0_at = layout.take(rows * sizeof(uint32_t));
  const size_t rows1_at = layout.take(rows * sizeof(uint32_t));
  const size_t wide0_at = layout.take(rows * sizeof(uint64_t));
  const size_t wide1_at = layout.take(rows * sizeof(uint64_t));
  const size_t histogram_at = layout.take(row::RoomBuckets::kCount * sizeof(uint64_t));
  const size_t oldest_at = layout.take(sizeof(uint64_t));
  const size_t counts_at = layout.take(2 * sizeof(unsigned long long));
  const size_t keys_at = layout.take(std::min(need, rows) * sizeof(int64_t));
  const size_t temp_at = layout.take(temp_bytes);
  char* base = scratch(layout.bytes, stream);
  auto* spared = reinterpret_cast<uint64_t*>(base + spared_at);
  auto* call_rows = reinterpret_cast<uint32_t*>(base + call_rows_at);
  auto* candidates_rows = reinterpret_cast<uint32_t*>(base + rows0_at);
  auto* victims = reinterpret_cast<uint32_t*>(base + rows1_at);
  auto* wide0 = reinterpret_cast<uint64_t*>(base + wide0_at);
  auto* wide1 = reinterpret_cast<uint64_t*>(base + wide1_at);
  auto* histogram = reinterpret_cast<unsigned long long*>(base + histogram_at);
  auto* least = reinterpret_cast<uint64_t*>(base + oldest_at);
  auto* counts = reinterpret_cast<unsigned long long*>(base + counts_at);
  void* temp = base + temp_at;

  // The candidates: live rows touched before this step and not read by this call.
  check(cudaMemsetAsync(spared, 0, row::bitmap_words(rows) * sizeof(uint64_t), stream),
        "cudaMemsetAsync");
  resolve_rows_kernel<kBlock><<<blocks_for(call_n), kBlock, 0, stream>>>(
      index_ref(), call_keys, call_n, row::kNoRow, call_rows, nullptr, nullptr);
  check_launch("resolve_rows_kernel");
  mark_rows_kernel<kBlock><<<blocks_for(call_n), kBlock, 0, stream>>>(call_rows, call_n, spared);
  check_launch("mark_rows_kernel");
  const uint64_t candidates =
      select(EvictionCandidate{arena_, freed_.get<uint64_t>(), spared, step}, rows, candidates_rows,
             temp, temp_bytes, stream);
  if (out != nullptr || ages != nullptr) {
    need = std::min(need, candidates);  // a take or a list: as many as there are
  }
  if (candidates < need) fail_no_room(spec(), need, candidates, step);
  if (need == 0) return candidates;
  const auto n = static_cast<int64_t>(candidates);

  // Their stamps' histogram, from the oldest stamp to the step.
  gather_steps_kernel<kBlock>
      <<<blocks_for(candidates), kBlock, 0, stream>>>(arena_, candidates_rows, candidates, wide0);
  check_launch("gather_steps_kernel");
  size_t bytes = temp_bytes;
  check(cub::DeviceReduce::Min(temp, bytes, wide0, least, n, stream), "cub::DeviceReduce::Min");
  uint64_t oldest = 0;
  check(cudaMemcpyAsync(&oldest, least, sizeof(oldest), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const row::RoomBuckets buckets = row::RoomBuckets::spanning(oldest, step);
  check(cudaMemsetAsync(histogram, 0, row::RoomBuckets::kCount * sizeof(uint64_t), stream),
        "cudaMemsetAsync");
  stamp_histogram_kernel<kBlock>
      <<<blocks_for(candidates), kBlock, 0, stream>>>(wide0, candidates, buckets, histogram);
  check_launch("stamp_histogram_kernel");
  std::vector<uint64_t> counted(row::RoomBuckets::kCount);
  check(cudaMemcpyAsync(counted.data(), histogram, row::RoomBuckets::kCount * sizeof(uint64_t),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const row::RoomBoundary edge = row::room_boundary(buckets, counted.data(), need);
  const uint64_t in_edge = edge.in_bucket;

  // Every candidate below the boundary bucket goes, then the bucket's own in order: they are
  // selected behind the others and sorted there, with the candidates' list as the sorts'
  // second buffer (it is read for the last time by the selections).
  bytes = temp_bytes;
  check(cub::DeviceSelect::If(temp, bytes, candidates_rows, victims, counts, n,
                              GoesForRoom{arena_, edge}, stream),
        "cub::DeviceSelect::If");
  bytes = temp_bytes;
  check(cub::DeviceSelect::If(temp, bytes, candidates_rows, victims + edge.below, counts + 1, n,
                              InRoomBoundary{arena_, edge}, stream),
        "cub::DeviceSelect::If");
  const auto m = static_cast<int64_t>(in_edge);
  cub::DoubleBuffer<uint32_t> order(victims + edge.below, candidates_rows);
  cub::DoubleBuffer<int64_t> keys(reinterpret_cast<int64_t*>(wide0),
                                  reinterpret_cast<int64_t*>(wide1));
  gather_row_keys_kernel<kBlock><<<blocks_for(in_edge), kBlock, 0, stream>>>(
      arena_, order.Current(), in_edge, keys.Current());
  check_launch("gather_row_keys_kernel");
  bytes = temp_bytes;
  check(cub::DeviceRadixSort::SortPairs(temp, bytes, keys, order, m, 0, 64, stream),
        "cub::DeviceRadixSort::SortPairs");
  // The keys are done with: their buffers take the stamps.
  gather_steps_kernel<kBlock>
      <<<blocks_for(in_edge), kBlock, 0, stream>>>(arena_, order.Current(), in_edge, wide0);
  check_launch("gather_steps_kernel");
  cub::DoubleBuffer<uint64_t> stamps(wide0, wide1);
  bytes = temp_bytes;
  check(cub::DeviceRadixSort::SortPairs(temp, bytes, stamps, order, m, 0, 64, stream),
        "cub::DeviceRadixSort::SortPairs");
  if (order.Current() != victims + edge.below) {
    check(cudaMemcpyAsync(victims + edge.below, order.Current(),
                          (need - edge.below) * sizeof(uint32_t), cudaMemcpyDeviceToDevice, stream),
          "cudaMemcpyAsync");
  }
  if (ages != nullptr) {
    list_ages(victims, need, reinterpret_cast<int64_t*>(base + keys_at), wide0, stream, ages);
    return candidates;
  }
  // Rows never move when the arena grows, so the chosen ids stay valid (grow's work is ordered
  // after the selection's on the stream, and it waits for both before it frees anything).
  if (grow_to > capacity_rows()) grow(grow_to, d.rows, stream);
  remove_rows(victims, need, reinterpret_cast<int64_t*>(base + keys_at), d, stream, out);
  return candidates;
}

void CudaTable::list_ages(const uint32_t* rows, uint64_t n, int64_t* keys, uint64_t* steps,
                          cudaStream_t stream, std::vector<RowAge>* out) {
  gather_row_keys_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(arena_, rows, n, keys);
  check_launch("gather_row_keys_kernel");
  gather_steps_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(arena_, rows, n, steps);
  check_launch("gather_steps_kernel");
  std::vector<int64_t> host_keys(n);
  std::vector<uint64_t> host_steps(n);
  check(
      cudaMemcpyAsync(host_keys.data(), keys, n * sizeof(int64_t), cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  check(cudaMemcpyAsync(host_steps.data(), steps, n * sizeof(uint64_t), cudaMemcpyDeviceToHost,
                        stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  out->resize(n);
  for (uint64_t i = 0; i < n; ++i) (*out)[i] = {host_steps[i], host_keys[i]};
}

void CudaTable::remove_rows(const uint32_t* victims, uint64_t n, int64_t* keys_out,
                            const DeviceCounters& d, cudaStream_t stream, MovedRows* out) {
  if (n == 0) return;
  const size_t out_before = out != nullptr ? out->size() : 0;
  if (out != nullptr) {
    gather_leaving(victims, n, out, stream);  // before the copy-on-write reuses the staging
  } else {
    // Host room first: past this point only a device error can fail.
    evicted_keys_.resize(n);
    ledger_.reserve_evicted(n);
  }
  try {
    if (sink_ != nullptr && captured_left_ > 0) copy_on_write(victims, n, row::kNoRow, stream);
  } catch (...) {
    if (out != nullptr) out->truncate(out_before, arena_.stride);
    throw;
  }
  free_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      arena_, victims, n, dirty_.get<uint64_t>(), freed_.get<uint64_t>(), carried_.get<uint64_t>(),
      free_list_.get<uint32_t>(), d.free_rows, keys_out);
  check_launch("free_rows_kernel");
  add_free_rows_kernel<<<1, 1, 0, stream>>>(device_counters(), n);
  check_launch("add_free_rows_kernel");
  // Linear probing has no cheap concurrent delete: the index is rebuilt from the live rows.
  check(cudaMemsetAsync(index_.get(), 0xFF, index_.bytes(), stream), "cudaMemsetAsync");
  rebuild_index_kernel<kBlock><<<blocks_for(d.rows), kBlock, 0, stream>>>(
      index_ref(), arena_, d.rows, freed_.get<uint64_t>());
  check_launch("rebuild_index_kernel");
  if (out != nullptr) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return;
  }
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

}  // namespace embstore::cuda_backend
