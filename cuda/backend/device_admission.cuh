// Exact admission counts in a CUDA table's device memory. The data path counts a batch at a time
// on the caller's stream, with no host round trip (kernels/admission.cuh): the trainer's lookup
// no longer waits for the device. The table's ledger and its checkpoints see the counts as
// AdmissionCounts, with the host counter's semantics (DeltaGenerations); those operations are
// rare (capture, restore, idle passes, stats) and synchronous, on the table's own stream, which
// the table orders after its calls.
//
// The table of row::AdmitSlot stays at most half full. A count call adds its batch size to a
// bound on the slots in use and reads the true count back (waiting for the device) only when
// the bound passes half the table; the table is then rehashed on the device, its gone slots
// shed (their keys noted for the delta that must carry their removal), at a size with room
// for half its live keys and four batches more, so that reads stay rare.
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
  // this object). table: its name, for messages.
  DeviceExactCounts(uint32_t admit_after, int device, const cudaStream_t* stream,
                    std::string table);
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
  struct Snapshot;

  AdmitTableRef ref() const { return AdmitTableRef{slots_.get<row::AdmitSlot>(), slot_count_ - 1}; }
  AdmitCounters* device_counters() const { return counters_.get<AdmitCounters>(); }
  unsigned blocks_for(uint64_t threads) const;
  AdmitCounters read_counters(cudaStream_t stream) const;
  std::vector<row::AdmitSlot> download(cudaStream_t stream) const;
  // The table's size for `live` live keys and batches of n: half of it holds them, half of them
  // again and 4n more. Fails with OUT_OF_MEMORY past 2^31 slots (slot indices are 32-bit).
  uint64_t slots_for(uint64_t live, uint64_t n) const;
  // Replaces the table by `slots` (host memory), whose slots in use and gone ones are counted.
  void install(const std::vector<row::AdmitSlot>& slots, uint64_t claimed, uint64_t gone,
               cudaStream_t stream);
  // Rehashes the live slots into a table of slot_count slots on the device; the gone ones are
  // shed, their keys noted. `gone`: how many there are.
  void rehash(uint64_t slot_count, uint64_t gone, cudaStream_t stream);

  const uint32_t admit_after_;
  const int device_;
  const cudaStream_t* const stream_;
  const std::string table_;  // for messages
  uint64_t max_blocks_ = 1;
  DeviceBuffer slots_;
  uint64_t slot_count_ = 0;  // a power of two
  DeviceBuffer counters_;
  uint64_t used_bound_ = 0;  // >= the slots in use (claimed), so the table stays half empty
  // The last frozen view's copy, kept for the next capture (a capture that allocated would
  // stall training): the counts' device memory twice over. A view still out keeps its own.
  std::shared_ptr<Snapshot> snapshot_;

  // As the host counter's: slots are stamped with generations_.current(); the gone slots
  // changed since the base are read from the frozen view, those a rehash shed noted here.
  DeltaGenerations generations_;
};

}  // namespace embstore::cuda_backend
