// The CUDA table's snapshots (capture, drain, copy-on-write, ending one) and restore (loading
// rows and admission counts).
#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/lookup.cuh"
#include "cuda/backend/kernels/snapshot.cuh"

namespace embstore::cuda_backend {

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

}  // namespace embstore::cuda_backend
