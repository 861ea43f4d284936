// The CUDA table's snapshots (capture, drain, copy-on-write, ending one) and restore (loading
// rows and admission counts).
#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/lookup.cuh"
#include "cuda/backend/kernels/snapshot.cuh"

namespace embstore::cuda_backend {

// ---------------------------------------------------------------------------- snapshots --
// Capture, copy-on-write and end_snapshot run in the table's call order (Call) and synchronize
// before they return, so the host state below always describes finished device work. The drain
// runs beside them on drain_stream_ (see drain_piece).

// The grow-only device staging buffer, at least `bytes`. Every earlier use of it has
// finished (each user synchronizes before it returns); growing waits for the stream anyway.
char* CudaTable::stage(size_t bytes, cudaStream_t stream) {
  return grow_only(stage_, bytes, "snapshot staging", stream);
}

uint64_t CudaTable::capture(bool full, SnapshotSink* sink, uint64_t* live_rows) {
  Call call(*this, own_stream_);
  std::lock_guard drain_lock(drain_mutex_);
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
  captured_left_.store(captured);
  drain_word_ = 0;
  drain_end_word_ = row::bitmap_words(rows);
  *live_rows = rows - d.free_rows;
  return captured;
}

// The drain's grow-only device buffer, at least `bytes`, kept between snapshots (reallocating
// would synchronize the device). Its earlier use has finished: each drain piece synchronizes the
// drain stream before it returns, also when it fails.
char* CudaTable::drain_buffer(size_t bytes) {
  if (bytes > drain_buffer_.bytes()) {
    drain_buffer_.reset();
    drain_buffer_ = DeviceBuffer(bytes, "drain staging");
  }
  return drain_buffer_.get<char>();
}

DrainCounters CudaTable::read_drain_counters() {
  DrainCounters host{};
  check(cudaMemcpyAsync(&host, drain_counters_.get(), sizeof(host), cudaMemcpyDeviceToHost,
                        drain_stream_),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(drain_stream_), "cudaStreamSynchronize");
  return host;
}

// captured_left_ -= rows, not below 0 (it is exact unless a call failed part-way).
void CudaTable::leave_captured(uint64_t rows) {
  uint64_t left = captured_left_.load();
  while (!captured_left_.compare_exchange_weak(left, left - std::min(left, rows))) {
  }
}

// Writes up to `want` captured rows, in row order from drain_word_, to host memory `out`, on the
// drain stream while the table's calls go on (docs/DESIGN.md, "Drain on the GPU"). Stages:
//   list  - rows from one reading of the bitmap, window by window, without taking them;
//   copy  - their records, a tile of lanes per record;
//   take  - only then their captured bits. A row whose bit a copy-on-write took first is
//           dropped: that call writes the row, and may have been updating it while it was
//           copied. A row the drain takes had not been taken, so it has not changed since
//           capture: every writer of a captured row takes its bit first, and the copy finished
//           before the take (stream order);
//   keep  - the taken records, compacted, to `out`.
// Returns the records written (fewer than want where copy-on-write took listed rows);
// *exhausted once every captured row has been listed. Synchronizes the drain stream only.
uint64_t CudaTable::drain_piece(uint64_t want, char* out, bool* exhausted) {
  *exhausted = drain_word_ >= drain_end_word_;
  if (want == 0 || *exhausted) return 0;
  const cudaStream_t stream = drain_stream_;
  // On a failure part-way, nothing of this piece may still run once the lock is released
  // (growth replaces captured_); its listed rows stay captured or are taken, and the job fails.
  struct SyncOnUnwind {
    cudaStream_t stream;
    int exceptions = std::uncaught_exceptions();
    ~SyncOnUnwind() {
      if (std::uncaught_exceptions() > exceptions) {
        (void)cudaStreamSynchronize(stream);
        (void)cudaGetLastError();
      }
    }
  } sync_on_unwind{stream};
  // Sized for a whole staging piece, whatever this one asks, so that the buffer is allocated
  // once.
  const uint64_t window = kDrainWords;
  want = std::min(want, stage_rows());
  const uint64_t capacity = stage_rows();
  const uint64_t record = row::record_bytes(arena_.stride);

  // Temporary storage sized for the largest scan serves every smaller one.
  size_t list_scan = 0, keep_scan = 0;
  check(cub::DeviceScan::InclusiveSum(nullptr, list_scan, static_cast<uint32_t*>(nullptr),
                                      static_cast<uint32_t*>(nullptr), static_cast<int>(window),
                                      stream),
        "cub::DeviceScan::InclusiveSum");
  check(cub::DeviceScan::ExclusiveSum(nullptr, keep_scan, static_cast<uint32_t*>(nullptr),
                                      static_cast<uint32_t*>(nullptr), static_cast<int>(capacity),
                                      stream),
        "cub::DeviceScan::ExclusiveSum");
  ScratchLayout layout;
  const size_t ids_at = layout.take(capacity * sizeof(uint32_t));
  const size_t words_at = layout.take(window * sizeof(uint64_t));
  const size_t counts_at = layout.take(window * sizeof(uint32_t));
  const size_t ends_at = layout.take(window * sizeof(uint32_t));
  const size_t flags_at = layout.take(capacity * sizeof(uint32_t));
  const size_t keep_at = layout.take(capacity * sizeof(uint32_t));
  const size_t temp_at = layout.take(std::max(list_scan, keep_scan));
  const size_t listed_at = layout.take(capacity * record);
  const size_t kept_at = layout.take(capacity * record);
  // Allocated before any bit is taken, so that a failure to allocate loses no row.
  char* base = drain_buffer(layout.bytes);
  auto* ids = reinterpret_cast<uint32_t*>(base + ids_at);
  auto* words = reinterpret_cast<uint64_t*>(base + words_at);
  auto* counts = reinterpret_cast<uint32_t*>(base + counts_at);
  auto* ends = reinterpret_cast<uint32_t*>(base + ends_at);
  auto* flags = reinterpret_cast<uint32_t*>(base + flags_at);
  auto* keep = reinterpret_cast<uint32_t*>(base + keep_at);
  char* listed = base + listed_at;
  char* kept = base + kept_at;
  uint64_t* captured = captured_.get<uint64_t>();
  DrainCounters* dc = drain_counters_.get<DrainCounters>();

  // list
  uint64_t got = 0;
  while (got < want && drain_word_ < drain_end_word_) {
    const uint64_t first = drain_word_;
    const uint64_t n_words = std::min(drain_end_word_ - first, window);  // fits in int
    const uint64_t left = want - got;
    read_window_kernel<kBlock>
        <<<blocks_for(n_words), kBlock, 0, stream>>>(captured, first, n_words, words, counts);
    check_launch("read_window_kernel");
    size_t temp_bytes = std::max(list_scan, keep_scan);
    check(cub::DeviceScan::InclusiveSum(base + temp_at, temp_bytes, counts, ends,
                                        static_cast<int>(n_words), stream),
          "cub::DeviceScan::InclusiveSum");
    list_window_kernel<kBlock><<<blocks_for(n_words), kBlock, 0, stream>>>(
        words, first, n_words, ends, left, ids + got, &dc->listed, &dc->cut_word);
    check_launch("list_window_kernel");
    const DrainCounters d = read_drain_counters();
    if (d.listed > left) {  // the listing stopped at word cut_word; what it did not list is next
      drain_word_ = d.cut_word;
      got = want;
    } else {  // listed every row of the window
      drain_word_ = first + n_words;
      got += d.listed;
    }
  }
  *exhausted = drain_word_ >= drain_end_word_;
  if (got == 0) return 0;

  // copy, take, keep
  const uint32_t shift = tile_shift_for(arena_.stride / 2 + 1);
  write_records_kernel<kBlock><<<blocks_for(got << shift), kBlock, 0, stream>>>(
      arena_, ids, got, nullptr, listed, record, shift);
  check_launch("write_records_kernel");
  take_listed_kernel<kBlock><<<blocks_for(got), kBlock, 0, stream>>>(captured, ids, got, flags);
  check_launch("take_listed_kernel");
  size_t temp_bytes = std::max(list_scan, keep_scan);
  check(cub::DeviceScan::ExclusiveSum(base + temp_at, temp_bytes, flags, keep,
                                      static_cast<int>(got), stream),
        "cub::DeviceScan::ExclusiveSum");
  keep_taken_kernel<kBlock><<<blocks_for(got << shift), kBlock, 0, stream>>>(
      listed, flags, keep, got, record, shift, kept, &dc->kept);
  check_launch("keep_taken_kernel");
  const uint64_t n = read_drain_counters().kept;
  if (n > 0) {
    check(cudaMemcpyAsync(out, kept, n * record, cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  return n;
}

uint64_t CudaTable::drain(SnapshotSink* sink, uint64_t max_rows) {
  // Beside the table's calls: only drain_mutex_ (for the whole call), which they take only to
  // replace what the drain reads (capture, end_snapshot, growth).
  std::lock_guard lock(drain_mutex_);
  if (!snapshot_active_) return 0;  // the snapshot has ended (written under both locks)
  DeviceGuard guard(device_);
  FlushOnExit flush{sink};
  uint64_t budget = std::min(max_rows, captured_left_.load());
  bool exhausted = drain_word_ >= drain_end_word_;
  while (budget > 0 && !exhausted) {
    const uint64_t ask = std::min(budget, stage_rows());
    uint64_t granted = 0;
    char* out = sink->reserve(ask, /*wait=*/false, &granted);
    if (out == nullptr || granted == 0) break;  // staging is full
    granted = std::min(granted, ask);
    const uint64_t filled = drain_piece(granted, out, &exhausted);
    sink->commit(filled);
    leave_captured(filled);  // flushed before this returns
    budget -= std::min(budget, filled);
  }
  if (exhausted && captured_left_.load() > 0) {
    // Every captured row is taken. The ones copy-on-write took are in staging once no call
    // holds the table (each flushes its records before it returns and lowers captured_left_
    // after); what is still counted then was lost to a call that failed part-way, and the
    // job's row count check reports it.
    std::unique_lock table(mutex_, std::try_to_lock);
    if (table.owns_lock()) captured_left_.store(0);
  }
  return captured_left_.load();  // flush's destructor hands the records over
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
  const uint32_t shift = tile_shift_for(arena_.stride / 2 + 1);
  for (uint64_t first = 0; first < runs && captured_left_.load() > 0 && !aborted; first += window) {
    const uint64_t n = std::min<uint64_t>(window, runs - first);
    check(cudaMemsetAsync(count, 0, sizeof(*count), stream), "cudaMemsetAsync");
    take_runs_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
        captured_.get<uint64_t>(), run_rows + first, n, no_row, ids, count);
    check_launch("take_runs_kernel");
    write_records_kernel<kBlock><<<blocks_for(n << shift), kBlock, 0, stream>>>(
        arena_, ids, n, count, records, record, shift);
    check_launch("write_records_kernel");
    const uint64_t k = read_counters(stream).cow_rows;  // synchronizes
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
  // Only once the records are in staging: the drain reports the snapshot written out when this
  // reaches 0.
  sink_->flush();
  leave_captured(taken);
}

void CudaTable::end_snapshot(bool failed) {
  // The host state first, whatever the device does below: the sink dies with the job.
  std::lock_guard lock(mutex_);
  std::lock_guard drain_lock(drain_mutex_);  // no drain piece in flight
  const bool active = snapshot_active_;
  sink_ = nullptr;
  snapshot_active_ = false;
  captured_left_.store(0);
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
    if (carried_.get() != nullptr) {  // rows the other table's part held, moved here since
      restore_dirty_kernel<kBlock><<<blocks_for(dirty_words_), kBlock, 0, stream>>>(
          dirty_.get<uint64_t>(), carried_.get<uint64_t>(), freed_.get<uint64_t>(), dirty_words_);
      check_launch("restore_dirty_kernel");
    }
  }
  if (carried_.get() != nullptr) {
    check(cudaMemsetAsync(carried_.get(), 0, carried_.bytes(), stream), "cudaMemsetAsync");
  }
  check(cudaMemsetAsync(captured_.get(), 0, captured_.bytes(), stream), "cudaMemsetAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  stage_.reset();  // up to kStageBytes per table: not kept between snapshots (the drain's is)
}

void CudaTable::reserve(uint64_t rows) {
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  const uint64_t held = read_counters(stream).rows;  // exact: synchronizes after the wait
  rows_bound_ = held;
  const uint64_t limit = row::row_limit(spec().max_capacity);
  rows = std::min(rows, limit > held ? limit - held : 0);  // a load past it fails anyway
  if (held + rows > capacity_rows()) grow(held + rows, held, stream);  // the stream is idle
}

// Rows get ids in the order given, like the host backend's serial inserts: the keys, checked
// distinct and absent per piece (or, skipping held keys, marked: the first occurrence of each
// key the table does not hold), each claim an empty slot with a preset id.

void CudaTable::load_rows(const int64_t* keys, const float* values, const float* state, size_t n,
                          uint64_t step, bool skip_held) {
  if (n == 0) return;
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  uint64_t rows = read_counters(stream).rows;  // exact: synchronizes after the wait
  rows_bound_ = rows;
  const uint64_t limit = row::row_limit(spec().max_capacity);
  if (!skip_held && rows + n > limit) fail_over_limit(spec(), n, rows, "rows to load", "loaded");

  const uint32_t dim = arena_.dim;
  const uint32_t state_dim = arena_.stride - dim;
  const uint64_t row_bytes = sizeof(int64_t) + uint64_t{arena_.stride} * sizeof(float);
  // Skipping held keys, two more words per key: whether it loads, and its row among those that do.
  const uint64_t piece_max =
      std::max<uint64_t>(1, kStageBytes / (row_bytes + (skip_held ? 2 * sizeof(uint32_t) : 0)));
  const uint32_t shift = tile_shift_for(arena_.stride);
  for (size_t done = 0; done < n;) {
    const uint64_t c = std::min<uint64_t>(n - done, piece_max);
    ScratchLayout layout;
    const size_t keys_at = layout.take(c * sizeof(int64_t));
    const size_t values_at = layout.take(c * dim * sizeof(float));
    const size_t state_at = layout.take(c * state_dim * sizeof(float));
    const size_t keep_at = layout.take(skip_held ? c * sizeof(uint32_t) : 0);
    const size_t row_at = layout.take(skip_held ? c * sizeof(uint32_t) : 0);
    // Not scratch: count_new_keys, mark_new_keys and grow use that.
    char* base = stage(layout.bytes, stream);
    auto* d_keys = reinterpret_cast<int64_t*>(base + keys_at);
    auto* d_values = reinterpret_cast<float*>(base + values_at);
    auto* d_state = reinterpret_cast<float*>(base + state_at);
    uint32_t* d_keep = skip_held ? reinterpret_cast<uint32_t*>(base + keep_at) : nullptr;
    uint32_t* d_row = skip_held ? reinterpret_cast<uint32_t*>(base + row_at) : nullptr;
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
    uint64_t added = c;
    if (skip_held) {
      added = mark_new_keys(d_keys, c, d_keep, d_row, stream);  // synchronizes
      if (rows + added > limit) {
        fail_over_limit(spec(), added, rows, "rows to load", "loaded");
      }
    } else if (const uint64_t fresh = count_new_keys(d_keys, c, stream); fresh != c) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "table '{}': load_rows needs distinct keys that the table does not hold; {} of {} "
           "keys at offset {} are repeated or present",
           spec().name, c - fresh, c, done);
    }
    if (rows + added > capacity_rows()) grow(rows + added, rows, stream);  // the stream is idle

    if (added > 0) {
      load_index_kernel<kBlock><<<blocks_for(c), kBlock, 0, stream>>>(index_ref(), arena_, d_keys,
                                                                      d_keep, d_row, c, rows, step);
      check_launch("load_index_kernel");
      load_values_kernel<kBlock><<<blocks_for(c << shift), kBlock, 0, stream>>>(
          arena_, d_values, d_state, d_keep, d_row, c, rows, shift);
      check_launch("load_values_kernel");
      add_loaded_rows_kernel<<<1, 1, 0, stream>>>(device_counters(), added);
      check_launch("add_loaded_rows_kernel");
    }
    rows += added;
    rows_bound_ = rows;
    loaded_rows_ += added;
    done += c;
  }
  // The host buffers may go once this returns.
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
}

// keep[i] = 1 for the first occurrence (in input order) of each of keys[0, n) the index does not
// hold, row[i] its row among them (exclusive sum of keep); returns how many. Synchronizes.
uint64_t CudaTable::mark_new_keys(const int64_t* keys, size_t n, uint32_t* keep, uint32_t* row,
                                  cudaStream_t stream) {
  size_t sort_bytes = 0, scan_bytes = 0;
  check(cub::DeviceRadixSort::SortPairs(
            nullptr, sort_bytes, static_cast<const int64_t*>(nullptr),
            static_cast<int64_t*>(nullptr), static_cast<const uint32_t*>(nullptr),
            static_cast<uint32_t*>(nullptr), static_cast<int>(n), 0, 64, stream),
        "cub::DeviceRadixSort::SortPairs");
  check(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, static_cast<uint32_t*>(nullptr),
                                      static_cast<uint32_t*>(nullptr), static_cast<int>(n), stream),
        "cub::DeviceScan::ExclusiveSum");
  ScratchLayout layout;
  const size_t sorted_at = layout.take(n * sizeof(int64_t));
  const size_t pos_at = layout.take(n * sizeof(uint32_t));
  const size_t sorted_pos_at = layout.take(n * sizeof(uint32_t));
  const size_t temp_at = layout.take(std::max(sort_bytes, scan_bytes));
  char* base = scratch(layout.bytes, stream);
  auto* sorted = reinterpret_cast<int64_t*>(base + sorted_at);
  auto* pos = reinterpret_cast<uint32_t*>(base + pos_at);
  auto* sorted_pos = reinterpret_cast<uint32_t*>(base + sorted_pos_at);

  positions_kernel<<<blocks_for(n), kBlock, 0, stream>>>(pos, n);
  check_launch("positions_kernel");
  // Stable: equal keys keep their input order, so the first of each run is the first given.
  check(cub::DeviceRadixSort::SortPairs(base + temp_at, sort_bytes, keys, sorted, pos, sorted_pos,
                                        static_cast<int>(n), 0, 64, stream),
        "cub::DeviceRadixSort::SortPairs");
  mark_new_load_keys_kernel<kBlock>
      <<<blocks_for(n), kBlock, 0, stream>>>(index_ref(), sorted, sorted_pos, n, keep);
  check_launch("mark_new_load_keys_kernel");
  check(cub::DeviceScan::ExclusiveSum(base + temp_at, scan_bytes, keep, row, static_cast<int>(n),
                                      stream),
        "cub::DeviceScan::ExclusiveSum");
  uint32_t last[2] = {0, 0};  // the last key's keep and row
  check(cudaMemcpyAsync(&last[0], keep + n - 1, sizeof(uint32_t), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(&last[1], row + n - 1, sizeof(uint32_t), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return uint64_t{last[0]} + last[1];
}

bool CudaTable::load_admission(const io::AdmissionFile& counts, std::string* why) {
  Call call(*this, own_stream_);
  const cudaStream_t stream = call.stream;
  // The keys that have a row, from the rows' metadata (once per restore), before the counts
  // change: a failure here leaves them as they were.
  std::vector<int64_t> keys;
  if (ledger_.has_admission()) {
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
