// The CUDA table's fused update (apply_gradients): sort by row, sum duplicate gradients in
// batch order, one warp per unique row.
#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/lookup.cuh"
#include "cuda/backend/kernels/snapshot.cuh"
#include "cuda/backend/kernels/update.cuh"

namespace embstore::cuda_backend {

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

}  // namespace embstore::cuda_backend
