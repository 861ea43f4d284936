// The CUDA table's fused update (apply_gradients) as stages: resolve each key's row, group the
// batch by row (a stable radix sort), find where each row's run starts, then one kernel sums
// every row's gradients by the blocked rule and updates it (kernels/update.cuh). Nothing waits
// for the device unless a snapshot still holds captured rows (copy-on-write).
#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/lookup.cuh"
#include "cuda/backend/kernels/snapshot.cuh"
#include "cuda/backend/kernels/update.cuh"
#include "cuda/row/grad_sum.h"

namespace embstore::cuda_backend {

namespace {

template <row::OptKind Kind, bool Dirty>
void launch_fused_update(unsigned blocks, cudaStream_t stream, const row::ArenaRef& arena,
                         uint64_t* dirty, const row::OptParams& p, const SortedBatch& batch,
                         uint64_t step) {
  fused_update_kernel<Kind, Dirty, kBlock>
      <<<blocks, kBlock, 0, stream>>>(arena, dirty, p, batch, step);
  check_launch("fused_update_kernel");
}

}  // namespace

void CudaTable::apply_gradients(const int64_t* keys, const float* grads, size_t n, uint64_t step,
                                void* stream_ptr) {
  if (n == 0) return;
  check_batch(n);
  Call call(*this, stream_ptr);
  const cudaStream_t stream = call.stream;
  last_step_ = std::max(last_step_, step);
  const int count = static_cast<int>(n);
  const uint32_t dim = arena_.dim;

  // Sort only the bits a row id can use: every id is below rows_bound_, and keys without a
  // row get the all-ones value of that width, so they sort last and form one run.
  const int bits = std::max(1, static_cast<int>(std::bit_width(rows_bound_)));
  const uint32_t no_row = bits >= 32 ? row::kNoRow : (uint32_t{1} << bits) - 1;

  size_t sort_bytes = 0, select_bytes = 0;
  {
    cub::DoubleBuffer<uint32_t> k(nullptr, nullptr), v(nullptr, nullptr);
    check(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, k, v, count, 0, bits, stream),
          "cub::DeviceRadixSort::SortPairs");
    check(cub::DeviceSelect::If(nullptr, select_bytes, thrust::counting_iterator<uint32_t>(0),
                                static_cast<uint32_t*>(nullptr), static_cast<uint32_t*>(nullptr),
                                count, RunHead{nullptr}, stream),
          "cub::DeviceSelect::If");
  }
  const size_t array = n * sizeof(uint32_t);
  const uint64_t slots = row::sum_scratch_slots(n);
  ScratchLayout layout;
  const size_t rows0_at = layout.take(array), rows1_at = layout.take(array);
  const size_t pos0_at = layout.take(array), pos1_at = layout.take(array);
  const size_t run_offsets_at = layout.take(array), num_runs_at = layout.take(sizeof(uint32_t));
  const size_t arrivals_at = layout.take(slots * sizeof(uint32_t));
  const size_t partials_at = layout.take(slots * dim * sizeof(float));
  const size_t temp_at = layout.take(std::max(sort_bytes, select_bytes));
  char* base = scratch(layout.bytes, stream);
  auto at = [base](size_t offset) { return reinterpret_cast<uint32_t*>(base + offset); };
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

  // (3) Where each row's run starts; the run count stays on the device.
  SortedBatch batch{};
  batch.grads = grads;
  batch.rows = sorted_rows.Current();
  batch.positions = sorted_pos.Current();
  batch.run_offsets = at(run_offsets_at);
  batch.num_runs = at(num_runs_at);
  batch.n = static_cast<uint32_t>(n);
  batch.no_row = no_row;
  batch.arrivals = at(arrivals_at);
  batch.partials = reinterpret_cast<float*>(base + partials_at);
  check(cub::DeviceSelect::If(temp, select_bytes, thrust::counting_iterator<uint32_t>(0),
                              at(run_offsets_at), at(num_runs_at), count, RunHead{batch.rows},
                              stream),
        "cub::DeviceSelect::If");
  check(cudaMemsetAsync(batch.arrivals, 0, slots * sizeof(uint32_t), stream), "cudaMemsetAsync");

  // (3b) Copy-on-write: captured rows among the batch's rows go to the snapshot first, with the
  // contents they had at capture. Synchronous, and only while rows remain captured.
  if (sink_ != nullptr && captured_left_ > 0) {
    uint32_t* run_rows = sorted_rows.Alternate();  // free once the sort is done
    run_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(batch.rows, batch.run_offsets,
                                                                  batch.num_runs, run_rows);
    check_launch("run_rows_kernel");
    uint32_t runs = 0;
    check(cudaMemcpyAsync(&runs, batch.num_runs, sizeof(runs), cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    copy_on_write(run_rows, runs, no_row, stream);
  }

  // (4) Sum and update: a warp per run and per 32-position tile (kernels/update.cuh), as many as
  // there can be, capped (grid-stride).
  const uint64_t items = uint64_t{n} + (n + row::kSumFanIn - 1) / row::kSumFanIn;
  const unsigned blocks = blocks_for(items * row::kLanes);
  uint64_t* dirty = dirty_.get<uint64_t>();
  const bool tracking = dirty_tracking_;
  row::dispatch_opt(spec().opt.kind, [&](auto kind) {
    constexpr row::OptKind Kind = decltype(kind)::value;
    if (tracking) {
      launch_fused_update<Kind, true>(blocks, stream, arena_, dirty, spec().opt, batch, step);
    } else {
      launch_fused_update<Kind, false>(blocks, stream, arena_, dirty, spec().opt, batch, step);
    }
  });
}

}  // namespace embstore::cuda_backend
