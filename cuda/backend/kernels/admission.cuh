// Exact admission counting on the device (DeviceExactCounts, cuda/backend/device_admission.cuh):
// the batch's keys without a row counted in the table of row::AdmitSlot, the positions whose key
// stays pending marked, the admitted keys' counts dropped after their insert, idle counts
// forgotten.
//
// Exact counts do not depend on the order occurrences are counted in: a key's count after a
// batch is its count before plus its occurrences, whichever thread counts which. So the batch is
// counted in parallel and the table ends as the host backend's counter does after counting the
// batch one occurrence at a time. (Which occurrences of a key that reaches admit_after in the
// batch read its row rather than its initial values does not show: a new row holds exactly its
// initial values.)
#pragma once

#include <cuda/atomic>

#include "cuda/backend/device.cuh"
#include "cuda/row/admission.h"
#include "cuda/row/index.h"

namespace embstore::cuda_backend {

// The device view of the counts' table: slots[0 .. mask], a power of two, at most half in use
// (live and gone slots together), which the owner guarantees before each counting kernel.
struct AdmitTableRef {
  row::AdmitSlot* slots;
  uint64_t mask;
};

// The owner's device counters.
struct AdmitCounters {
  unsigned long long claimed;    // slots in use, live or gone
  unsigned long long gone;       // of which gone
  unsigned long long forgotten;  // result slot of forget_before
  unsigned long long listed;     // result slot of a rehash: the removals it listed
};

// A gone slot's key and the generation of its removal, which a rehash sheds.
struct AdmitRemoval {
  int64_t key;
  uint32_t gen;
  uint32_t unused;
};

// One thread per position: the occurrence of keys[i] is counted when rows[i] is kNoRow, and
// slot_of[i] gets the key's slot (row::kNoAdmitSlot for keys with a row). A free slot is claimed
// by CAS on its count (empty -> locked); the winner writes the key and publishes the count 1
// with a release store. Others wait out the lock, then compare the key: duplicates of the batch
// share the winner's slot. A gone slot of the same key is passed over (its count was dropped:
// the key counts from 0 again in a slot of its own).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    count_admission_kernel(AdmitTableRef table, const int64_t* keys, const uint32_t* rows,
                           uint64_t n, uint64_t step, uint32_t gen, uint32_t* slot_of,
                           AdmitCounters* counters) {
  using CountRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
  using GenRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
  using StepRef = cuda::atomic_ref<uint64_t, cuda::thread_scope_device>;
  unsigned long long claimed = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    if (rows[i] != row::kNoRow) {
      slot_of[i] = row::kNoAdmitSlot;
      continue;
    }
    const int64_t key = keys[i];
    uint64_t s = row::admit_home(key, table.mask);
    for (;; s = (s + 1) & table.mask) {
      row::AdmitSlot& slot = table.slots[s];
      CountRef count(slot.count);
      uint32_t c = count.load(cuda::memory_order_acquire);
      if (c == row::kAdmitEmpty) {
        if (count.compare_exchange_strong(c, row::kAdmitLocked, cuda::memory_order_acquire,
                                          cuda::memory_order_acquire)) {
          slot.key = key;
          slot.gen = gen;
          slot.step = step;
          count.store(1, cuda::memory_order_release);  // publishes the key
          ++claimed;
          break;
        }
        // Lost the race: c holds the winner's value, locked or already published.
      }
      while (c == row::kAdmitLocked) {
        __nanosleep(32);
        c = count.load(cuda::memory_order_acquire);
      }
      if (c != row::kAdmitGone && slot.key == key) {  // after the acquire that saw the count
        while (!count.compare_exchange_weak(c, row::admit_increment(c), cuda::memory_order_relaxed,
                                            cuda::memory_order_relaxed)) {
        }
        // Every occurrence of the batch stores the same values.
        GenRef(slot.gen).store(gen, cuda::memory_order_relaxed);
        StepRef(slot.step).store(step, cuda::memory_order_relaxed);
        break;
      }
    }
    slot_of[i] = static_cast<uint32_t>(s);
  }
  block_add<BlockSize>(claimed, &counters->claimed);
}

// After count_admission_kernel: pending[i] = 1 where the position's key was counted and stays
// below admit_after (it reads its initial values and gets no row), else 0.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    mark_pending_kernel(AdmitTableRef table, const uint32_t* slot_of, uint64_t n,
                        uint32_t admit_after, uint8_t* pending) {
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    const uint32_t s = slot_of[i];
    pending[i] = s != row::kNoAdmitSlot && table.slots[s].count < admit_after ? 1 : 0;
  }
}

// The positions of keys counted and admitted (the insert gave them their row).
struct AdmittedAt {
  const uint32_t* slot_of;
  const uint8_t* pending;
  __device__ bool operator()(uint32_t i) const {
    return slot_of[i] != row::kNoAdmitSlot && pending[i] == 0;
  }
};

// After the insert: the counts of the admitted keys are dropped (their slots gone, once for all
// of a key's positions).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    drop_admitted_kernel(AdmitTableRef table, const uint32_t* slot_of, const uint8_t* pending,
                         uint64_t n, uint32_t gen, AdmitCounters* counters) {
  using CountRef = cuda::atomic_ref<uint32_t, cuda::thread_scope_device>;
  unsigned long long gone = 0;
  for (uint64_t i = grid_thread<BlockSize>(); i < n; i += grid_threads<BlockSize>()) {
    if (!AdmittedAt{slot_of, pending}(static_cast<uint32_t>(i))) continue;
    row::AdmitSlot& slot = table.slots[slot_of[i]];
    CountRef count(slot.count);
    uint32_t c = count.load(cuda::memory_order_relaxed);
    while (c != row::kAdmitGone &&
           !count.compare_exchange_weak(c, row::kAdmitGone, cuda::memory_order_relaxed,
                                        cuda::memory_order_relaxed)) {
    }
    if (c != row::kAdmitGone) {  // this thread dropped it
      slot.gen = gen;
      ++gone;
    }
  }
  block_add<BlockSize>(gone, &counters->gone);
}

// Drops the counts of keys last seen before cutoff (an idle rule's pass). One thread per slot;
// nothing else runs on the table meanwhile.
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    forget_admission_kernel(AdmitTableRef table, uint64_t cutoff, uint32_t gen,
                            AdmitCounters* counters) {
  unsigned long long forgotten = 0;
  for (uint64_t s = grid_thread<BlockSize>(); s <= table.mask; s += grid_threads<BlockSize>()) {
    row::AdmitSlot& slot = table.slots[s];
    if (!row::admit_live(slot.count) || slot.step >= cutoff) continue;
    slot.count = row::kAdmitGone;
    slot.gen = gen;
    ++forgotten;
  }
  block_add<BlockSize>(forgotten, &counters->forgotten);
}

// After forget_admission_kernel (one thread): the forgotten slots are gone ones.
static __global__ void settle_forgotten_kernel(AdmitCounters* counters) {
  counters->gone += counters->forgotten;
}

// Reinserts the live slots of `from` into the empty table `to` (keys are distinct, so a slot
// claimed by CAS on its count is final, and nothing reads `to` until the kernel ends); counts
// them in counters->claimed (zero before). The gone slots are shed: those whose removal is
// newer than removals_after (when note) are listed in removals (counters->listed, zero before).
template <int BlockSize>
static __global__ void __launch_bounds__(BlockSize)
    rehash_admission_kernel(AdmitTableRef from, AdmitTableRef to, bool note,
                            uint32_t removals_after, AdmitRemoval* removals,
                            AdmitCounters* counters) {
  unsigned long long live = 0;
  for (uint64_t s = grid_thread<BlockSize>(); s <= from.mask; s += grid_threads<BlockSize>()) {
    const row::AdmitSlot e = from.slots[s];
    if (row::admit_live(e.count)) {
      uint64_t t = row::admit_home(e.key, to.mask);
      while (atomicCAS(&to.slots[t].count, row::kAdmitEmpty, e.count) != row::kAdmitEmpty) {
        t = (t + 1) & to.mask;
      }
      to.slots[t].key = e.key;
      to.slots[t].gen = e.gen;
      to.slots[t].step = e.step;
      ++live;
    } else if (e.count == row::kAdmitGone && note && e.gen > removals_after) {
      const unsigned long long at = atomicAdd(&counters->listed, 1ull);
      removals[at] = AdmitRemoval{e.key, e.gen, 0};
    }
  }
  block_add<BlockSize>(live, &counters->claimed);
}

}  // namespace embstore::cuda_backend
