// DeviceExactCounts: exact admission counts in device memory (see device_admission.cuh).
#include <algorithm>
#include <bit>

#include "cuda/backend/device_admission.cuh"
#include "host/error.hpp"
#include "io/format/admission_file.hpp"

namespace embstore::cuda_backend {

namespace {

constexpr uint64_t kMinSlots = 4096;

uint64_t slots_for(uint64_t live) { return std::max(kMinSlots, std::bit_ceil(2 * live + 2)); }

}  // namespace

// A checkpoint's view of the counts: a device copy of the table taken at capture, turned into
// an io::AdmissionFile by the checkpoint's worker.
class DeviceExactCounts::FrozenSlots final : public Frozen {
 public:
  FrozenSlots(const DeviceExactCounts& owner, bool full, uint32_t base,
              std::vector<int64_t> removed)
      : owner_(owner),
        slot_count_(owner.slot_count_),
        full_(full),
        base_(base),
        removed_(std::move(removed)) {}

  io::AdmissionFile counts() const override {
    std::vector<row::AdmitSlot> slots(slot_count_);
    {
      DeviceGuard guard(owner_.device_);
      check(cudaMemcpyAsync(slots.data(), owner_.snapshot_.get(), slots.size() * sizeof(slots[0]),
                            cudaMemcpyDeviceToHost, owner_.copy_stream_),
            "cudaMemcpyAsync (admission counts)");
      check(cudaStreamSynchronize(owner_.copy_stream_), "cudaStreamSynchronize");
    }
    io::AdmissionFile out;
    auto entry = [](const row::AdmitSlot& s) {
      return io::AdmissionEntry{s.key, s.count, 0, s.step};
    };
    if (full_) {
      out.kind = io::AdmissionKind::kExact;
      for (const row::AdmitSlot& s : slots) {
        if (row::admit_live(s.count)) out.entries.push_back(entry(s));
      }
      return out;
    }
    // Removals first (those a rebuild shed, and the gone slots changed since the base), then
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
  const DeviceExactCounts& owner_;
  uint64_t slot_count_;
  bool full_;
  uint32_t base_;
  std::vector<int64_t> removed_;
};

DeviceExactCounts::DeviceExactCounts(uint32_t admit_after, int device, const cudaStream_t* stream)
    : admit_after_(admit_after), device_(device), stream_(stream) {
  DeviceGuard guard(device_);
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device_),
        "cudaDeviceGetAttribute");
  max_blocks_ = static_cast<uint64_t>(std::max(sms, 1)) * (2048 / kBlock) * 4;
  check(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  try {
    counters_ = DeviceBuffer(sizeof(AdmitCounters), "admission counters");
    install(std::vector<row::AdmitSlot>(kMinSlots, row::AdmitSlot{}), 0, copy_stream_);
  } catch (...) {
    (void)cudaStreamDestroy(copy_stream_);
    throw;
  }
}

DeviceExactCounts::~DeviceExactCounts() {
  DeviceGuard guard(device_, std::nothrow);
  (void)cudaStreamSynchronize(copy_stream_);
  slots_.reset();
  counters_.reset();
  snapshot_.reset();
  (void)cudaStreamDestroy(copy_stream_);
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

void DeviceExactCounts::install(const std::vector<row::AdmitSlot>& slots, uint64_t live,
                                cudaStream_t stream) {
  DeviceBuffer fresh(slots.size() * sizeof(row::AdmitSlot), "admission counts");
  check(cudaMemcpyAsync(fresh.get(), slots.data(), fresh.bytes(), cudaMemcpyHostToDevice, stream),
        "cudaMemcpyAsync (admission counts)");
  const AdmitCounters counters{live, 0, 0};
  check(
      cudaMemcpyAsync(counters_.get(), &counters, sizeof(counters), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (admission counters)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");  // the host sources go now
  slots_ = std::move(fresh);  // the stream is idle: nothing reads the old table
  slot_count_ = slots.size();
  used_bound_ = live;
}

void DeviceExactCounts::reinstall(const std::vector<row::AdmitSlot>& slots, uint64_t slot_count,
                                  cudaStream_t stream) {
  std::vector<row::AdmitSlot> fresh(slot_count, row::AdmitSlot{});
  uint64_t live = 0, shed = 0;
  for (const row::AdmitSlot& s : slots) {
    if (row::admit_live(s.count)) {
      row::admit_place(fresh.data(), slot_count - 1, s);
      ++live;
    }
    shed += s.count == row::kAdmitGone;
  }
  generations_.reserve_removed(shed);  // so that noting below cannot fail half-way
  install(fresh, live, stream);
  for (const row::AdmitSlot& s : slots) {
    if (s.count == row::kAdmitGone) generations_.note_removed_at(s.key, s.gen);
  }
}

void DeviceExactCounts::count(const int64_t* keys, const uint32_t* rows, uint64_t n, uint64_t step,
                              uint32_t* slot_of, uint8_t* pending, cudaStream_t stream) {
  if (n == 0) return;
  if (used_bound_ + n > slot_count_ / 2) {
    const AdmitCounters c = read_counters(stream);  // waits for the earlier counting
    used_bound_ = c.claimed;
    if (c.claimed + n > slot_count_ / 2) {
      reinstall(download(stream), std::max(slot_count_, slots_for(c.claimed - c.gone + n)), stream);
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
  uint64_t live = 0;
  for (row::AdmitSlot& s : slots) {
    if (!row::admit_live(s.count)) continue;
    if (has_row(s.key)) {
      s.count = row::kAdmitGone;
      s.gen = generations_.current();
    } else {
      ++live;
    }
  }
  // The dropped keys' gone slots are shed at once, as a rebuild sheds them.
  reinstall(slots, slots_for(live), stream);
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
  if (snapshot_.bytes() < bytes) {
    snapshot_.reset();  // the last frozen view is gone: one at a time
    snapshot_ = DeviceBuffer(bytes, "frozen admission counts");
  }
  check(cudaMemcpyAsync(snapshot_.get(), slots_.get(), bytes, cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync (admission counts)");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  // Without committed counts to build on (none yet, or a restore that loaded none), a delta
  // carries every count too (view().whole).
  DeltaGenerations::Frozen f = generations_.view(full);
  auto frozen = std::make_unique<FrozenSlots>(*this, f.whole, f.base, std::move(f.removed));
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
  std::vector<row::AdmitSlot> slots(slots_for(f.entries.size()), row::AdmitSlot{});
  for (const io::AdmissionEntry& e : f.entries) {
    // Loaded counts are the next delta's base (generation 0); 0.4.0 saturated at UINT32_MAX.
    row::admit_place(slots.data(), slots.size() - 1,
                     row::AdmitSlot{e.key, std::min(e.count, row::kAdmitMaxCount), 0, e.step});
  }
  install(slots, f.entries.size(), *stream_);
  generations_.loaded();
  return true;
}

}  // namespace embstore::cuda_backend
