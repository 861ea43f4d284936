// The CUDA table: setup and release, growth, the insert path (reserving rows, making room),
// lookup and counters; and the backend's entry points (host/backend/backends.hpp).
#include "cuda/backend/cuda_table.cuh"
#include "cuda/backend/kernels/eviction.cuh"
#include "cuda/backend/kernels/lookup.cuh"

namespace embstore::cuda_backend {

namespace {

// Exact admission counts live on the device; a Bloom filter's are counted on the host (its
// conservative update depends on the order of the keys), as are a stack's upper table's at
// max_capacity (TableSpec::counts_on_host).
std::unique_ptr<AdmissionCounts> device_counts_for(const TableSpec& spec, int device,
                                                   const cudaStream_t* stream) {
  if (spec.admit_after <= 1 || spec.admit_bloom_bytes != 0 || spec.counts_on_host) return nullptr;
  return std::make_unique<DeviceExactCounts>(spec.admit_after, device, stream, spec.name);
}

}  // namespace

CudaTable::CudaTable(TableSpec spec, int device)
    : Table(std::move(spec)),
      device_(device),
      ledger_(this->spec(), device_counts_for(this->spec(), device, &own_stream_)),
      device_counts_(dynamic_cast<DeviceExactCounts*>(ledger_.counts())) {
  DeviceGuard guard(device_);
  try {
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_),
          "cudaDeviceGetAttribute");
    // Grid-stride kernels: a few waves of full occupancy are enough to saturate memory.
    max_blocks_ = static_cast<uint64_t>(std::max(sms, 1)) * (2048 / kBlock) * 4;
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaStreamCreateWithFlags(&own_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaStreamCreateWithFlags(&drain_stream_, cudaStreamNonBlocking), "cudaStreamCreate");

    // Chunk 0 holds at least initial_capacity rows (and at least 64: one bitmap word).
    const uint32_t base_shift = row::base_shift_for(this->spec().initial_capacity);
    arena_.base_shift = base_shift;
    arena_.dim = this->spec().dim;
    arena_.stride = this->spec().stride();

    add_chunk(0, &arena_);
    chunks_ = 1;

    dirty_words_ = row::bitmap_words(capacity_rows());
    dirty_ = DeviceBuffer(dirty_words_ * sizeof(uint64_t), "dirty bitmap");
    check(cudaMemsetAsync(dirty_.get(), 0, dirty_.bytes(), own_stream_), "cudaMemsetAsync");

    index_slots_ = row::index_slots_for(capacity_rows());
    index_ = DeviceBuffer(index_slots_ * sizeof(row::Slot), "index");
    check(cudaMemsetAsync(index_.get(), 0xFF, index_.bytes(), own_stream_),  // all kEmptyRow
          "cudaMemsetAsync");

    counters_ = DeviceBuffer(sizeof(DeviceCounters), "counters");
    drain_counters_ = DeviceBuffer(sizeof(DrainCounters), "drain counters");
    check(cudaMemsetAsync(counters_.get(), 0, counters_.bytes(), own_stream_), "cudaMemsetAsync");
    if (this->spec().frees_rows()) {
      freed_ = DeviceBuffer(dirty_words_ * sizeof(uint64_t), "freed bitmap");
      check(cudaMemsetAsync(freed_.get(), 0, freed_.bytes(), own_stream_), "cudaMemsetAsync");
      free_list_ = DeviceBuffer(capacity_rows() * sizeof(uint32_t), "free list");
    }
    if (this->spec().gives_rows) {
      carried_ = DeviceBuffer(dirty_words_ * sizeof(uint64_t), "carried bitmap");
      check(cudaMemsetAsync(carried_.get(), 0, carried_.bytes(), own_stream_), "cudaMemsetAsync");
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
  if (drain_stream_ != nullptr) (void)cudaStreamSynchronize(drain_stream_);
  release();
  (void)cudaGetLastError();
}

void CudaTable::release() noexcept {
  for (auto& b : values_) b.reset();
  for (auto& b : host_values_) b.reset();
  wanted_.reset();
  for (auto& b : meta_) b.reset();
  index_.reset();
  dirty_.reset();
  freed_.reset();
  free_list_.reset();
  carried_.reset();
  admit_.reset();
  admission_buffer_.reset();
  counters_.reset();
  scratch_.reset();
  captured_.reset();
  snapshot_set_.reset();
  stage_.reset();
  drain_buffer_.reset();
  drain_counters_.reset();
  if (done_ != nullptr) (void)cudaEventDestroy(done_);
  if (own_stream_ != nullptr) (void)cudaStreamDestroy(own_stream_);
  if (drain_stream_ != nullptr) (void)cudaStreamDestroy(drain_stream_);
  done_ = nullptr;
  own_stream_ = nullptr;
  drain_stream_ = nullptr;
  chunks_ = 0;
}

// Row ids and positions are 32-bit and CUB's run-length encoding counts items in an int.
void CudaTable::check_batch(size_t n) const {
  if (n > static_cast<size_t>(INT_MAX)) {
    fail(EMBSTORE_INVALID_ARGUMENT, "table '{}' (CUDA): at most {} keys per call, got {}",
         spec().name, INT_MAX, n);
  }
}

// The grow-only scratch buffer of the table's calls.
char* CudaTable::scratch(size_t bytes, cudaStream_t stream) {
  return grow_only(scratch_, bytes, "scratch", stream);
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
// The cheap bound alone: true (and the bound raised) when up to n new rows fit for certain.
// rows_bound_ bounds the ids handed out, so the live rows too.
bool CudaTable::reserve_rows_cheaply(uint64_t n) {
  const uint64_t limit = row::row_limit(spec().max_capacity);
  if (rows_bound_ + n > capacity_rows() || rows_bound_ + n > limit) return false;
  rows_bound_ += n;
  return true;
}

void CudaTable::reserve_rows(const int64_t* keys, size_t n, uint64_t step, const int64_t* call_keys,
                             size_t call_n, cudaStream_t stream) {
  if (reserve_rows_cheaply(n)) return;
  const uint64_t limit = row::row_limit(spec().max_capacity);
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
      // Grown to what the insert needs after the eviction once the victims are chosen, before
      // they go: a refused call grows nothing (as on the host), a failure to grow evicts nothing.
      const uint64_t evict = live + fresh - limit;
      const uint64_t free_after = d.free_rows + evict;
      const uint64_t need_after = d.rows + (fresh > free_after ? fresh - free_after : 0);
      make_room(evict, step, call_keys, call_n, d, stream, nullptr, nullptr, need_after);
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

// Allocates arena chunk `chunk` and points `arena` at it: its metadata in device memory, its
// values where the device budget puts them (row::place_chunk): device memory, mapped host
// memory, or the first rows in one and the rest in the other.
void CudaTable::add_chunk(uint32_t chunk, row::ArenaRef* arena) {
  const row::ChunkPlacement place = row::place_chunk(chunk, arena->base_shift, spec().device_rows);
  const size_t row_bytes = size_t{arena->stride} * sizeof(float);
  values_[chunk] = DeviceBuffer(place.device_rows * row_bytes, "arena values");
  host_values_[chunk] =
      MappedHostBuffer(place.host_rows * row_bytes, "arena values beyond device_rows");
  meta_[chunk] = DeviceBuffer(row::chunk_rows(chunk, arena->base_shift) * sizeof(row::RowMeta),
                              "arena metadata");
  arena->values[chunk] =
      place.device_rows != 0 ? values_[chunk].get<float>() : host_values_[chunk].device<float>();
  if (place.device_rows != 0 && place.host_rows != 0) {
    arena->split_chunk = chunk;
    arena->split_offset = place.device_rows;
    arena->split_values = host_values_[chunk].device<float>();
  }
  arena->meta[chunk] = meta_[chunk].get<row::RowMeta>();
}

// Adds arena chunks until `need` rows fit, with the dirty bitmap and the index sized to the
// new capacity; rows never move, the index is rebuilt from the rows' keys. The stream is idle
// (the caller synchronized it). Nothing is committed until every allocation has succeeded.
void CudaTable::grow(uint64_t need, uint64_t rows, cudaStream_t stream) {
  // The drain reads arena_ and captured_, which this replaces: no drain piece runs meanwhile.
  std::lock_guard drain_lock(drain_mutex_);
  uint32_t chunks = chunks_;
  row::ArenaRef arena = arena_;
  while (row::arena_capacity(chunks, arena.base_shift) < need) {
    if (chunks == row::kMaxChunks) {
      fail(EMBSTORE_CAPACITY_EXCEEDED, "table '{}': the arena cannot hold {} rows", spec().name,
           need);
    }
    add_chunk(chunks, &arena);
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
  DeviceBuffer carried;
  if (carried_.get() != nullptr) carried = grown_bitmap(carried_, "carried bitmap");
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
  if (carried.get() != nullptr) carried_ = std::move(carried);
  index_ = std::move(index);
  index_slots_ = slots;
}

void CudaTable::lookup(const int64_t* keys, size_t n, float* values_out, bool insert, uint64_t step,
                       void* stream_ptr) {
  if (n == 0) return;
  check_batch(n);
  Call call(*this, stream_ptr);
  const cudaStream_t stream = call.stream;
  last_step_ = std::max(last_step_, step);
  if (!insert) {
    ScratchLayout layout;
    const size_t rows_at = layout.take(n * sizeof(uint32_t));
    auto* rows = reinterpret_cast<uint32_t*>(scratch(layout.bytes, stream) + rows_at);
    resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
        index_ref(), keys, n, row::kNoRow, rows, nullptr, nullptr);
    check_launch("resolve_rows_kernel");
    gather(keys, n, rows, nullptr, values_out, stream);
    return;
  }
  if (device_counts_ != nullptr)
    return lookup_counting_on_device(keys, n, values_out, step, stream);
  if (ledger_.admission() != nullptr)
    return lookup_counting_on_host(keys, n, values_out, step, stream);
  reserve_rows(keys, n, step, keys, n, stream);
  ScratchLayout layout;
  const size_t rows_at = layout.take(n * sizeof(uint32_t));
  const size_t created_at = layout.take(n * sizeof(uint8_t));
  char* base = scratch(layout.bytes, stream);
  insert_and_gather(keys, n, step, nullptr, reinterpret_cast<uint32_t*>(base + rows_at),
                    reinterpret_cast<uint8_t*>(base + created_at), values_out, stream);
}

// Exact counting on the device (DeviceExactCounts): count the keys without a row, mark those
// still pending, make room for the admitted ones, insert them, drop their counts. Nothing waits
// for the device unless the table or the counts' table may have to grow.
void CudaTable::lookup_counting_on_device(const int64_t* keys, size_t n, float* values_out,
                                          uint64_t step, cudaStream_t stream) {
  // Its own buffer, not scratch: making room below may use (and grow) scratch.
  ScratchLayout layout;
  const size_t rows_at = layout.take(n * sizeof(uint32_t));
  const size_t slots_at = layout.take(n * sizeof(uint32_t));
  const size_t pending_at = layout.take(n * sizeof(uint8_t));
  const size_t created_at = layout.take(n * sizeof(uint8_t));
  const size_t positions_at = layout.take(n * sizeof(uint32_t));
  const size_t admitted_at = layout.take(n * sizeof(int64_t));
  char* base = admission_buffer(layout.bytes, stream);
  auto* rows = reinterpret_cast<uint32_t*>(base + rows_at);
  auto* slot_of = reinterpret_cast<uint32_t*>(base + slots_at);
  auto* pending = reinterpret_cast<uint8_t*>(base + pending_at);

  resolve_rows_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      index_ref(), keys, n, row::kNoRow, rows, nullptr, nullptr);
  check_launch("resolve_rows_kernel");
  device_counts_->count(keys, rows, n, step, slot_of, pending, stream);
  // Room for the admitted keys' rows: n bounds them. Where the cheap bound fails, it is made
  // exact first (as reserve_rows does: else every later call would come here again); near
  // the arena's capacity or the row limit, the admitted keys are listed and counted exactly.
  if (!reserve_rows_cheaply(n)) {
    rows_bound_ = read_counters(stream).rows;  // waits: every earlier insert is done
    if (!reserve_rows_cheaply(n)) {
      const AdmittedAt admitted{slot_of, pending};
      const size_t temp_bytes = select_bytes(admitted, n, stream);
      ScratchLayout temp_layout;
      const size_t temp_at = temp_layout.take(temp_bytes);
      char* temp = scratch(temp_layout.bytes, stream) + temp_at;
      auto* positions = reinterpret_cast<uint32_t*>(base + positions_at);
      auto* admitted_keys = reinterpret_cast<int64_t*>(base + admitted_at);
      const uint64_t m = select(admitted, n, positions, temp, temp_bytes, stream);
      if (m > 0) {
        gather_keys_kernel<kBlock>
            <<<blocks_for(m), kBlock, 0, stream>>>(keys, positions, m, admitted_keys);
        check_launch("gather_keys_kernel");
        reserve_rows(admitted_keys, m, step, keys, n, stream);
      }
    }
  }
  insert_and_gather(keys, n, step, pending, rows, reinterpret_cast<uint8_t*>(base + created_at),
                    values_out, stream);
  device_counts_->drop_admitted(slot_of, pending, n, stream);
}

// Counting on the host (a counting Bloom filter; exact counts with TableSpec::counts_on_host): the
// keys without a row go to the host, are counted there in batch order, and the admitted ones come
// back. Waits for the device.
void CudaTable::lookup_counting_on_host(const int64_t* keys, size_t n, float* values_out,
                                        uint64_t step, cudaStream_t stream) {
  AdmissionCounter* const admission = ledger_.admission();
  count_admission_on_host(keys, n, step, stream);
  if (!admit_keys_.empty()) {
    reserve_rows(admit_.get<int64_t>(), admit_keys_.size(), step, keys, n, stream);
  }
  const size_t pending_n = pending_pos_.size();
  ScratchLayout layout;
  const size_t rows_at = layout.take(n * sizeof(uint32_t));
  const size_t created_at = layout.take(n * sizeof(uint8_t));
  const size_t mask_at = layout.take(pending_n > 0 ? n : 0);
  const size_t pending_at = layout.take(pending_n * sizeof(uint32_t));
  char* base = scratch(layout.bytes, stream);
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
  insert_and_gather(keys, n, step, pending, reinterpret_cast<uint32_t*>(base + rows_at),
                    reinterpret_cast<uint8_t*>(base + created_at), values_out, stream);
  // Every admitted key has its row now (reserve_rows made room for all of them).
  for (const int64_t key : admit_keys_) admission->admitted(key);
}

// Finds or inserts the row of every position not pending (pending may be null), fills the new
// rows, and reads the rows (a pending position: its key's initial values) into values_out.
void CudaTable::insert_and_gather(const int64_t* keys, size_t n, uint64_t step,
                                  const uint8_t* pending, uint32_t* rows, uint8_t* created,
                                  float* values_out, cudaStream_t stream) {
  const InsertParams params{free_list_.get<uint32_t>(), freed_.get<uint64_t>(), pending,
                            spec().frees_rows()};
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
  gather(keys, n, rows, pending, values_out, stream);
}

void CudaTable::gather(const int64_t* keys, size_t n, const uint32_t* rows, const uint8_t* pending,
                       float* values_out, cudaStream_t stream) {
  const uint32_t dim_shift = tile_shift_for(arena_.dim);
  gather_rows_kernel<kBlock><<<blocks_for(uint64_t{n} << dim_shift), kBlock, 0, stream>>>(
      arena_, rows, n, dim_shift, pending, spec().init, keys, values_out);
  check_launch("gather_rows_kernel");
}

// The admission path's grow-only buffer (its arrays live across calls that use scratch).
char* CudaTable::admission_buffer(size_t bytes, cudaStream_t stream) {
  return grow_only(admission_buffer_, bytes, "admission scratch", stream);
}

TableCounters CudaTable::counters() {
  std::lock_guard lock(mutex_);
  DeviceGuard guard(device_);
  check(cudaEventSynchronize(done_), "cudaEventSynchronize");  // every earlier call is done

  unsigned long long* dirty_total = &device_counters()->dirty_rows;
  check(cudaMemsetAsync(dirty_total, 0, sizeof(*dirty_total), own_stream_), "cudaMemsetAsync");
  count_bits_kernel<kBlock><<<blocks_for(dirty_words_), kBlock, 0, own_stream_>>>(
      dirty_.get<uint64_t>(), dirty_words_ * 64, dirty_total);
  check_launch("count_bits_kernel");
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
  // The device tier: live rows below device_rows in device memory, the rest in mapped host
  // memory. Evicted rows below it wait on the free list and are not counted.
  const uint64_t budget = spec().device_rows;
  if (budget == 0 || budget >= d.rows) {
    c.rows_in_device = c.rows;
  } else {
    uint64_t freed_below = 0;
    if (freed_.get() != nullptr && d.free_rows != 0) {
      unsigned long long* total = &device_counters()->selected;
      check(cudaMemsetAsync(total, 0, sizeof(*total), own_stream_), "cudaMemsetAsync");
      count_bits_kernel<kBlock><<<blocks_for(row::bitmap_words(budget)), kBlock, 0, own_stream_>>>(
          freed_.get<uint64_t>(), budget, total);
      check_launch("count_bits_kernel");
      freed_below = read_counters(own_stream_).selected;
    }
    c.rows_in_device = budget - freed_below;
    c.rows_in_memory = c.rows - c.rows_in_device;
  }
  c.rows_moved_up = d.tier_moved;  // each trade moves one row up and one down
  c.rows_moved_down = d.tier_moved;
  return c;
}

}  // namespace embstore::cuda_backend

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
    cuda_backend::DeviceGuard guard(device);
    // Loading a kernel proves the device can run this build's code (SASS for its
    // architecture, or PTX the driver can compile).
    cudaFuncAttributes attributes{};
    e = cudaFuncGetAttributes(&attributes, cuda_backend::gather_rows_kernel<cuda_backend::kBlock>);
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
  return std::make_unique<cuda_backend::CudaTable>(std::move(spec), device);
}

// Never throws: where registration fails the memory stays pageable (copies still work, only
// slower) and the error is cleared so no later check sees it.
void pin_host_memory(void* p, size_t bytes, int device) {
  if (p == nullptr || bytes == 0) return;
  // On the store's device: registering starts the current device's context otherwise.
  const cuda_backend::DeviceGuard guard(device, std::nothrow);
  // Portable: pinned for every device's context, whichever device a table lives on.
  if (cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
    (void)cudaGetLastError();
  }
}

std::vector<int64_t> copy_keys_to_host(const int64_t* keys, size_t n, int device, void* stream) {
  std::vector<int64_t> out(n);
  if (n == 0) return out;
  const cuda_backend::DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream);
  cuda_backend::check(
      cudaMemcpyAsync(out.data(), keys, n * sizeof(int64_t), cudaMemcpyDeviceToHost, s),
      "copying keys to the host");
  cuda_backend::check(cudaStreamSynchronize(s), "copying keys to the host");
  return out;
}

void copy_floats_to_device(const float* src, float* dst, size_t n, int device, void* stream) {
  if (n == 0) return;
  const cuda_backend::DeviceGuard guard(device);
  const auto s = static_cast<cudaStream_t>(stream);
  cuda_backend::check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, s),
                      "copying rows to the device");
  cuda_backend::check(cudaStreamSynchronize(s), "copying rows to the device");
}

void unpin_host_memory(void* p, int device) {
  if (p == nullptr) return;
  const cuda_backend::DeviceGuard guard(device, std::nothrow);
  if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();  // e.g. never pinned
}

}  // namespace embstore
