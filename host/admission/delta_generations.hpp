// How exact admission counts become deltas, for the host counter (admission.cpp) and a CUDA
// table's device counts (cuda/backend/device_admission.cuh) alike: every change is stamped with
// the current generation; a freeze (a checkpoint's capture) takes a generation, and the
// removals noted since the base; the checkpoint's outcome makes it the base (committed) or gives
// its removals back (failed). A delta holds the counts stamped after the base and the removals.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace embstore {

class DeltaGenerations {
 public:
  // What a frozen view needs: whole (no committed base: a delta carries every count), else the
  // base generation and the removals since it.
  struct Frozen {
    bool whole;
    uint32_t base;
    std::vector<int64_t> removed;
  };

  // The generation that changes are stamped with now.
  uint32_t current() const { return generation_; }

  // A removal is noted where a delta may follow: with a base, or with a checkpoint in flight,
  // which becomes the base when it commits (removals while the first one was in flight used to
  // be lost, and a delta on it kept their counts).
  bool notes_removals() const { return has_base_ || freezing_; }
  void note_removed(int64_t key) {
    if (notes_removals()) removed_.push_back(key);
  }
  // Room for `more` removals, grown geometrically, so that noting them cannot throw.
  void reserve_removed(size_t more) {
    if (notes_removals() && removed_.capacity() - removed_.size() < more) {
      removed_.reserve(std::max(2 * removed_.capacity(), removed_.size() + more));
    }
    if (freezing_ && frozen_removed_.capacity() - frozen_removed_.size() < more) {
      frozen_removed_.reserve(
          std::max(2 * frozen_removed_.capacity(), frozen_removed_.size() + more));
    }
  }
  // A removal stamped `gen` that is learned of later (a device table's gone slot shed by a
  // rebuild): one the frozen view already shows is needed again only if its checkpoint fails.
  void note_removed_at(int64_t key, uint32_t gen) {
    if (!notes_removals()) return;
    if (freezing_ && gen <= frozen_generation_) {
      if (has_base_ && gen > base_generation_) frozen_removed_.push_back(key);
      return;
    }
    if (freezing_ || gen > base_generation_) removed_.push_back(key);
  }

  // A freeze in two steps, so that whatever allocates comes before any change: view() (what
  // the frozen view holds), then freeze().
  // The generation above which a removal learned late must be offered to note_removed_at
  // (below or at it, note_removed_at drops it); false when no removal is noted now.
  bool removals_after(uint32_t* gen) const {
    if (has_base_) {
      *gen = base_generation_;
      return true;
    }
    if (freezing_) {
      *gen = frozen_generation_;
      return true;
    }
    return false;
  }

  Frozen view(bool full) const { return Frozen{full || !has_base_, base_generation_, removed_}; }
  void freeze() noexcept {
    frozen_generation_ = generation_++;  // later changes are newer than the frozen view
    frozen_removed_ = std::move(removed_);
    removed_.clear();
    freezing_ = true;
  }
  // Committed: the frozen view is the base of the next delta. Failed: the next checkpoint
  // carries its changes again.
  void end_freeze(bool committed) {
    if (committed) {
      base_generation_ = frozen_generation_;
      has_base_ = true;
    } else {
      removed_.insert(removed_.end(), frozen_removed_.begin(), frozen_removed_.end());
    }
    frozen_removed_.clear();
    freezing_ = false;
  }
  // Counts loaded whole (a restore): they are the base, stamped generation 0.
  void loaded() {
    has_base_ = true;
    removed_.clear();
    frozen_removed_.clear();
    base_generation_ = 0;
    generation_ = frozen_generation_ = 1;
  }

 private:
  uint32_t generation_ = 1, base_generation_ = 0, frozen_generation_ = 0;
  bool has_base_ = false;  // a checkpoint committed, or a restore loaded, the counts
  bool freezing_ = false;  // a frozen view is out (between freeze and end_freeze)
  std::vector<int64_t> removed_, frozen_removed_;  // keys removed since the base
};

}  // namespace embstore
