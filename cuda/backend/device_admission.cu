// DeviceExactCounts: exact admission counts in device memory (see device_admission.cuh).
#include <algorithm>
#include <bit>

#include "cuda/backend/device_admission.cuh"
#include "host/error.hpp"
#include "io/format/admission_file.hpp"

namespace embstore::cuda_backend {

namespace {

constexpr uint64_t kMinSlots = 4096;
// Slot indices are 32-bit, and the largest is row::kNoAdmitSlot: a table has at most 2^31.
constexpr uint64_t kMaxSlots = uint64_t{1} << 31;

// A stream of its own for a short synchronous sequence (construction, a frozen view's read).
class OwnStream {
 public:
  OwnStream() { check(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate"); }
  ~OwnStream() {
    (void)cudaStreamSynchronize(s_);
    (void)cudaStreamDestroy(s_);
  }
  OwnStream(const OwnStream&) = delete;
  OwnStream& operator=(const OwnStream&) = delete;
  cudaStream_t get() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

}  // namespace

// A device copy of the table at a capture. Shared by the frozen view that reads it back and by
// the counts, which reuse it at the next capture once no view holds it.
struct DeviceExactCounts::Snapshot {
  Snapshot(int device, size_t bytes) : device(device), buffer(bytes, "frozen admission counts") {}
  ~Snapshot() {
    DeviceGuard guard(device, std::nothrow);
    buffer.reset();
  }
  const int device;
  DeviceBuffer buffer;
};

// A checkpoint's view of the counts: the snapshot of the table taken at capture, turned into an
// io::AdmissionFile by the checkpoint's worker. It owns what it reads: the counts (or their
// table) may be gone by then.
class DeviceExactCounts::FrozenSlots final : public Frozen {
 public:
  FrozenSlots(std::shared_ptr<const Snapshot> snapshot, uint64_t slot_count, bool whole,
              uint32_t base, std::vector<int64_t> removed)
      : snapshot_(std::move(snapshot)),
        slot_count_(slot_count),
        whole_(whole),
        base_(base),
        removed_(std::move(removed)) {}

  io::AdmissionFile counts() const override {
    std::vector<row::AdmitSlot> slots(slot_count_);
    {
      DeviceGuard guard(snapshot_->device);
      const OwnStream stream;
      check(cudaMemcpyAsync(slots.data(), snapshot_->buffer.get(), slots.size() * sizeof(slots[0]),
                            cudaMemcpyDeviceToHost, stream.get()),
            "cudaMemcpyAsync (admission counts)");
      check(cudaStreamSynchronize(stream.get()), "cudaStreamSynchronize");
    }
    io::AdmissionFile out;
    auto entry = [](const row::AdmitSlot& s) {
      return io::AdmissionEntry{s.key, s.count, 0, s.step};
    };
    if (whole_) {
      out.kind = io::AdmissionKind::kExact;
      for (const row::AdmitSlot& s : slots) {
        if (row::admit_live(s.count)) out.entries.push_back(entry(s));
      }
      return out;
    }
    // Removals first (those a rehash shed, and the gone slots changed since the base), then
    // the counts changed since the base (a removed key counted again is among them).
    out.kind = io::AdmissionKind::kExactDelta;
    out.removed = removed_;
    for (const row::AdmitSlot& s : slots) {
      if (s.count == row::kAdmitGone && s.gen > base_) out.removed.push_back(s.key);
      if (row::admit_live(s.count) && s.gen > base_) out.entries.push_back(entry(s));
    }
    std::sort(out.removed.begin(), out.removed.end());
    out.removed.erase(std::unique(out.removed.begin(), out.removed.end()), out.removed.end());
    return out;
  }

 private:
  std::shared_ptr<const Snapshot> snapshot_;
  uint64_t slot_count_;
  bool whole_;
  uint32_t base_;
  std::vector<int64_t> removed_;
};

DeviceExactCounts::DeviceExactCounts(uint32_t admit_after, int device, const cudaStream_t* stream,
                                     std::string table)
    : admit_after_(admit_after), device_(device), stream_(stream), table_(std::move(table)) {
  DeviceGuard guard(device_);
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_),
        "cudaDeviceGetAttribute");
  max_blocks_ = static_cast<uint64_t>(std::max(sms, 1)) * (2048 / kBlock) * 4;
  counters_ = DeviceBuffer(sizeof(AdmitCounters), "admission counters");
  const OwnStream setup;  // the table's own stream may not exist yet
  install(std::vector<row::AdmitSlot>(kMinSlots, row::AdmitSlot{}), 0, 0, setup.get());
}

DeviceExactCounts::~DeviceExactCounts() {
  DeviceGuard guard(device_, std::nothrow);
  slots_.reset();
  counters_.reset();
  snapshot_.reset();  // a view still out keeps its own
  (void)cudaGetLastError();
}

unsigned DeviceExactCounts::blocks_for(uint64_t threads) const {
  const uint64_t blocks = (threads + kBlock - 1) / kBlock;
  return static_cast<unsigned>(std::clamp<uint64_t>(blocks, 1, max_blocks_));
}

AdmitCounters DeviceExactCounts::read_counters(cudaStream_t stream) const {
  AdmitCounters host{};
  check(cudaMemcpyAsync(&host, counters_.get(), sizeof(host), cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (admission counters)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return host;
}

std::vector<row::AdmitSlot> DeviceExactCounts::download(cudaStream_t stream) const {
  std::vector<row::AdmitSlot> slots(slot_count_);
  check(cudaMemcpyAsync(slots.data(), slots_.get(), slots.size() * sizeof(slots[0]),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (admission counts)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return slots;
}

uint64_t DeviceExactCounts::slots_for(uint64_t live, uint64_t n) const {
  const uint64_t held = live + live / 2 + 4 * n;
  if (held >= kMaxSlots / 2) {
    fail(EMBSTORE_OUT_OF_MEMORY,
         "table '{}': {} keys pending admission and batches of {}: past the device's table of "
         "{} counts",
         table_, live, n, kMaxSlots / 2);
  }
  return std::max(kMinSlots, std::bit_ceil(2 * held + 2));
}

void DeviceExactCounts::install(const std::vector<row::AdmitSlot>& slots, uint64_t claimed,
                                uint64_t gone, cudaStream_t stream) {
  DeviceBuffer fresh(slots.size() * sizeof(row::AdmitSlot), "admission counts");
  check(cudaMemcpyAsync(fresh.get(), slots.data(), fresh.bytes(), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (admission counts)");
  const AdmitCounters counters{claimed, gone, 0, 0};
  check(
      cudaMemcpyAsync(counters_.get(), &counters, sizeof(counters), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (admission counters)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the host sources go now
  slots_ = std::move(fresh);  // the stream is idle: nothing reads the old table
  slot_count_ = slots.size();
  used_bound_ = claimed;
}

void DeviceExactCounts::rehash(uint64_t slot_count, uint64_t gone, cudaStream_t stream) {
  DeviceBuffer fresh(slot_count * sizeof(row::AdmitSlot), "admission counts");
  uint32_t after = 0;
  const bool note = generations_.removals_after(&after);
  DeviceBuffer removals(note ? std::max<uint64_t>(gone, 1) * sizeof(AdmitRemoval) : 0,
                        "shed admission counts");
  check(cudaMemsetAsync(fresh.get(), 0, fresh.bytes(), stream), "cudaMemsetAsync");
  check(cudaMemsetAsync(counters_.get(), 0, sizeof(AdmitCounters), stream), "cudaMemsetAsync");
  const AdmitTableRef to{fresh.get<row::AdmitSlot>(), slot_count - 1};
  rehash_admission_kernel<kBlock><<<blocks_for(slot_count_), kBlock, 0, stream>>>(
      ref(), to, note, after, removals.get<AdmitRemoval>(), device_counters());
  check_launch("rehash_admission_kernel");
  const AdmitCounters c = read_counters(stream);  // claimed: the live slots moved
  std::vector<AdmitRemoval> listed(c.listed);
  if (!listed.empty()) {
    check(cudaMemcpyAsync(listed.data(), removals.get(), listed.size() * sizeof(listed[0]),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync (shed admission counts)");
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  }
  generations_.reserve_removed(listed.size());  // so that noting below cannot fail half-way
  slots_ = std::move(fresh);                    // the stream is idle: nothing reads the old table
  slot_count_ = slot_count;
  used_bound_ = c.claimed;
  for (const AdmitRemoval& r : listed) generations_.note_removed_at(r.key, r.gen);
}

void DeviceExactCounts::count(const int64_t* keys, const uint32_t* rows, uint64_t n, uint64_t step,
                              uint32_t* slot_of, uint8_t* pending, cudaStream_t stream) {
  if (n == 0) return;
  if (used_bound_ + n > slot_count_ / 2) {
    const AdmitCounters c = read_counters(stream);  // waits for the earlier counting
    used_bound_ = c.claimed;
    if (c.claimed + n > slot_count_ / 2) {
      rehash(slots_for(c.claimed - c.gone, n), c.gone, stream);
    }
  }
  used_bound_ += n;
  count_admission_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      ref(), keys, rows, n, step, generations_.current(), slot_of, device_counters());
  check_launch("count_admission_kernel");
  mark_pending_kernel<kBlock>
      <<<blocks_for(n), kBlock, 0, stream>>>(ref(), slot_of, n, admit_after_, pending);
  check_launch("mark_pending_kernel");
}

void DeviceExactCounts::drop_admitted(const uint32_t* slot_of, const uint8_t* pending, uint64_t n,
                                      cudaStream_t stream) {
  if (n == 0) return;
  drop_admitted_kernel<kBlock><<<blocks_for(n), kBlock, 0, stream>>>(
      ref(), slot_of, pending, n, generations_.current(), device_counters());
  check_launch("drop_admitted_kernel");
}

uint64_t DeviceExactCounts::forget_before(uint64_t step) {
  DeviceGuard guard(device_);
  const cudaStream_t stream = *stream_;
  unsigned long long* forgotten = &device_counters()->forgotten;
  check(cudaMemsetAsync(forgotten, 0, sizeof(*forgotten), stream), "cudaMemsetAsync");
  forget_admission_kernel<kBlock><<<blocks_for(slot_count_), kBlock, 0, stream>>>(
      ref(), step, generations_.current(), device_counters());
  check_launch("forget_admission_kernel");
  settle_forgotten_kernel<<<1, 1, 0, stream>>>(device_counters());
  check_launch("settle_forgotten_kernel");
  return read_counters(stream).forgotten;
}

void DeviceExactCounts::drop_if(const std::function<bool(int64_t)>& has_row) {
  DeviceGuard guard(device_);
  const cudaStream_t stream = *stream_;
  std::vector<row::AdmitSlot> slots = download(stream);
  uint64_t claimed = 0, gone = 0;
  for (row::AdmitSlot& s : slots) {
    if (s.count == row::kAdmitEmpty) continue;
    ++claimed;
    if (row::admit_live(s.count) && has_row(s.key)) {
      s.count = row::kAdmitGone;
      s.gen = generations_.current();
    }
    gone += s.count == row::kAdmitGone;
  }
  // The dropped keys' slots are gone ones, shed at once by a rehash, which notes them.
  install(slots, claimed, gone, stream);
  rehash(slots_for(claimed - gone, 0), gone, stream);
}

uint64_t DeviceExactCounts::pending() const {
  DeviceGuard guard(device_);
  const AdmitCounters c = read_counters(*stream_);
  return c.claimed - c.gone;
}

std::unique_ptr<const AdmissionCounts::Frozen> DeviceExactCounts::freeze(bool full) {
  DeviceGuard guard(device_);
  const cudaStream_t stream = *stream_;
  const size_t bytes = slot_count_ * sizeof(row::AdmitSlot);
  if (!snapshot_ || snapshot_.use_count() > 1 || snapshot_->buffer.bytes() < bytes) {
    snapshot_ = std::make_shared<Snapshot>(device_, bytes);
  }
  check(cudaMemcpyAsync(snapshot_->buffer.get(), slots_.get(), bytes, cudaMemcpyDeviceToDevice,
                        stream),
        "cudaMemcpyAsync (admission counts)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // Without committed counts to build on (none yet, or a restore that loaded none), a delta
  // carries every count too (view().whole).
  DeltaGenerations::Frozen f = generations_.view(full);
  auto frozen =
      std::make_unique<FrozenSlots>(snapshot_, slot_count_, f.whole, f.base, std::move(f.removed));
  generations_.freeze();
  return frozen;
}

void DeviceExactCounts::end_freeze(bool committed) { generations_.end_freeze(committed); }

bool DeviceExactCounts::load(const io::AdmissionFile& f, std::string* why) {
  if (f.kind == io::AdmissionKind::kBloom) {
    *why = "they were counted by a Bloom filter, this table counts exactly";
    return false;
  }
  if (f.kind != io::AdmissionKind::kExact) {
    *why = "they are a delta: merge the chain first (io::merge_admission_files)";
    return false;
  }
  DeviceGuard guard(device_);
  std::vector<row::AdmitSlot> slots(slots_for(f.entries.size(), 0), row::AdmitSlot{});
  for (const io::AdmissionEntry& e : f.entries) {
    // Loaded counts are the next delta's base (generation 0); 0.4.0 saturated at UINT32_MAX.
    row::admit_place(slots.data(), slots.size() - 1,
                     row::AdmitSlot{e.key, std::min(e.count, row::kAdmitMaxCount), 0, e.step});
  }
  install(slots, f.entries.size(), 0, *stream_);
  generations_.loaded();
  return true;
}

}  // namespace embstore::cuda_backend
