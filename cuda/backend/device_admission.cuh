// Exact admission counts in a CUDA table's device memory. The data path counts a batch at a time
// on the caller's stream, with no host round trip (kernels/admission.cuh): the trainer's lookup
// no longer waits for the device. The table's ledger and its checkpoints see the counts as
// AdmissionCounts, with the host counter's semantics (generations for deltas, removals noted);
// those operations are rare (capture, restore, idle passes, stats) and synchronous, on the
// table's own stream, which the table orders after its calls.
//
// The table of row::AdmitSlot is rebuilt on the host when it must grow or shed its gone slots
// (a copy each way, about every slots / 2 counted occurrences), which is also where the keys of
// the gone slots it sheds are noted for the next delta.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "cuda/backend/device_memory.cuh"
#include "cuda/backend/kernels/admission.cuh"
#include "host/admission/admission.hpp"
#include "host/admission/delta_generations.hpp"

namespace embstore::cuda_backend {

class DeviceExactCounts final : public AdmissionCounts {
 public:
  // stream: the table's own stream, read at each ledger operation (so it may be created after
  // this object).
  DeviceExactCounts(uint32_t admit_after, int device, const cudaStream_t* stream);
  ~DeviceExactCounts() override;
  DeviceExactCounts(const DeviceExactCounts&) = delete;
  DeviceExactCounts& operator=(const DeviceExactCounts&) = delete;

  // ---- the data path: a lookup with insert, on the call's stream ----
  // Counts the occurrence of keys[i] for every i with rows[i] == kNoRow; slot_of[i] gets the
  // key's slot (row::kNoAdmitSlot for the others), pending[i] 1 where the key stays below
  // admit_after. Waits for the device only when the table may have to grow or shed its gone
  // slots: about every slots / (2n) calls.
  void count(const int64_t* keys, const uint32_t* rows, uint64_t n, uint64_t step,
             uint32_t* slot_of, uint8_t* pending, cudaStream_t stream);
  // After the keys count() admitted got their rows: their counts go.
  void drop_admitted(const uint32_t* slot_of, const uint8_t* pending, uint64_t n,
                     cudaStream_t stream);

  // ---- AdmissionCounts ----
  uint64_t forget_before(uint64_t step) override;
  void drop_if(const std::function<bool(int64_t)>& has_row) override;
  uint64_t pending() const override;
  std::unique_ptr<const Frozen> freeze(bool full) override;
  void end_freeze(bool committed) override;
  bool load(const io::AdmissionFile& counts, std::string* why) override;

 private:
  class FrozenSlots;

  AdmitTableRef ref() const { return AdmitTableRef{slots_.get<row::AdmitSlot>(), slot_count_ - 1}; }
  AdmitCounters* device_counters() const { return counters_.get<AdmitCounters>(); }
  unsigned blocks_for(uint64_t threads) const;
  AdmitCounters read_counters(cudaStream_t stream) const;
  std::vector<row::AdmitSlot> download(cudaStream_t stream) const;
  // Replaces the table by slots (host memory) holding `live` live slots and no gone ones.
  void install(const std::vector<row::AdmitSlot>& slots, uint64_t live, cudaStream_t stream);
  // The live slots of `slots` (a copy of the table) in a table of slot_count slots; its gone
  // slots are shed, their keys noted for the delta that must carry their removal.
  void reinstall(const std::vector<row::AdmitSlot>& slots, uint64_t slot_count,
                 cudaStream_t stream);

  const uint32_t admit_after_;
  const int device_;
  const cudaStream_t* const stream_;
  uint64_t max_blocks_ = 1;
  cudaStream_t copy_stream_ = nullptr;  // the checkpoint worker's copy of a frozen view
  DeviceBuffer slots_;
  uint64_t slot_count_ = 0;  // a power of two
  DeviceBuffer counters_;
  uint64_t used_bound_ = 0;  // >= the slots in use (claimed), so the table stays half empty
  DeviceBuffer snapshot_;    // the frozen view: one at a time

  // As the host counter's: slots are stamped with generations_.current(); the gone slots
  // changed since the base are read from the frozen view, those a rebuild shed noted here.
  DeltaGenerations generations_;
};

}  // namespace embstore::cuda_backend
