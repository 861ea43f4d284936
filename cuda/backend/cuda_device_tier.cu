// The CUDA table's device tier (spec().device_rows): rows below the budget live in device
// memory, the rest in mapped host memory (add_chunk). prefetch() moves a coming batch's rows in
// host memory up by trading ids with idle device rows, as stages on the caller's stream: resolve
// the batch's rows, mark them wanted and list those in host memory, select idle device rows in
// a window that sweeps the device ids round robin, trade pairs. Nothing waits for the device
// unless the call's scratch or the wanted generations must grow (the first calls, a larger
// batch, a grown table).
#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/device_tier.cuh"
#include "cuda/backend/kernels/lookup.cuh"

namespace embstore::cuda_backend {

// Per row id, the generation of the latest prefetch that wanted it (0: none), so that a
// prefetch spares the rows of the one before (the current batch's). Grows with the table,
// keeping its stamps; cleared when the generations wrap (after 2^32 prefetches).
uint32_t* CudaTable::wanted_generations(cudaStream_t stream) {
  const size_t bytes = capacity_rows() * sizeof(uint32_t);
  // The first call, and a wrap: every stamp cleared (once, a grown buffer's whole).
  const bool restart = tier_generation_ == 0 || tier_generation_ == UINT32_MAX;
  if (wanted_.bytes() < bytes) {
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    DeviceBuffer grown(std::max(bytes, wanted_.bytes() + wanted_.bytes() / 2),
                       "device tier's wanted generations");
    const size_t kept = restart ? 0 : wanted_.bytes();
    check(cudaMemsetAsync(grown.get<char>() + kept, 0, grown.bytes() - kept, stream),
          "cudaMemsetAsync");
    if (kept != 0) {
      check(cudaMemcpyAsync(grown.get(), wanted_.get(), kept, cudaMemcpyDeviceToDevice, stream),
            "cudaMemcpyAsync");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // before the old one goes
    wanted_ = std::move(grown);
  } else if (restart) {
    check(cudaMemsetAsync(wanted_.get(), 0, wanted_.bytes(), stream), "cudaMemsetAsync");
  }
  if (restart) tier_generation_ = 1;  // generations from 2 on: generation - 1 is never 0, "none"
  return wanted_.get<uint32_t>();
}

void CudaTable::prefetch(const int64_t* keys, size_t n, void* stream_ptr) {
  const uint64_t budget = spec().device_rows;
  if (n == 0 || budget == 0) return;
  check_batch(n);
  Call call(*this, stream_ptr);
  const cudaStream_t stream = call.stream;
  uint32_t* wanted = wanted_generations(stream);
  const uint32_t generation = ++tier_generation_;
  if (tier_cursor_ >= budget) tier_cursor_ = 0;
  const uint64_t window = std::min<uint64_t>(budget - tier_cursor_,
                                             std::max<uint64_t>(kDeviceTierWindowPerKey * n, 1024));
  const uint64_t cutoff_step = last_step_ + 1 - std::min(last_step_ + 1, kDeviceTierIdleSteps);

  const uint64_t* snapshot = snapshot_active_ ? snapshot_set_.get<uint64_t>() : nullptr;
  const MayMoveDown may_move{
      arena_, wanted, generation, snapshot, freed_.get<uint64_t>(), device_counters(), cutoff_step};
  const thrust::counting_iterator<uint32_t> ids(static_cast<uint32_t>(tier_cursor_));
  unsigned long long* down_count = &device_counters()->tier_down;
  unsigned long long* up_count = &device_counters()->tier_up;
  // Row ids >= budget exist only once rows_bound_ passes it (it bounds the ids handed out); a
  // row may move down once it has been idle for kDeviceTierIdleSteps steps. Until then a
  // prefetch only stamps its rows.
  const bool trades = rows_bound_ > budget && last_step_ >= kDeviceTierIdleSteps;
  const size_t temp_bytes = trades ? select_bytes(may_move, window, stream) : 0;
  ScratchLayout layout;
  const size_t rows_at = layout.take(n * sizeof(uint32_t));
  const size_t up_at = layout.take(n * sizeof(uint32_t));
  const size_t down_at = layout.take(trades ? window * sizeof(uint32_t) : 0);
  const size_t temp_at = layout.take(temp_bytes);
  char* base = scratch(layout.bytes, stream);
  auto* rows = reinterpret_cast<uint32_t*>(base + rows_at);
  auto* up = reinterpret_cast<uint32_t*>(base + up_at);
  auto* down = reinterpret_cast<uint32_t*>(base + down_at);
  check(cudaMemsetAsync(up_count, 0, sizeof(*up_count), stream), "cudaMemsetAsync");

  // Every prefetch stamps its rows, so that the next one spares them.
  resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      index_ref(), keys, n, row::kNoRow, rows, nullptr, nullptr);
  check_launch("resolve_rows_kernel");
  want_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      rows, n, budget, wanted, generation, snapshot, up, up_count);
  check_launch("want_rows_kernel");
  if (!trades) return;

  size_t bytes = temp_bytes;
  check(cub::DeviceSelect::If(base + temp_at, bytes, ids, down, down_count,
                              static_cast<int64_t>(window), may_move, stream),
        "cub::DeviceSelect::If");
  const uint64_t max_pairs = std::min<uint64_t>(n, window);
  const uint32_t shift = tile_shift_for(arena_.stride);
  trade_rows_kernel<kBlock><<<blocks_for(max_pairs << shift), kBlock, 0, stream>>>(
      arena_, index_ref(), dirty_.get<uint64_t>(), carried_.get<uint64_t>(), wanted, generation,
      down, down_count, up, up_count, max_pairs, shift, &device_counters()->tier_moved);
  check_launch("trade_rows_kernel");
  tier_cursor_ += window;
}

}  // namespace embstore::cuda_backend
