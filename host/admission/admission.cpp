#include "host/admission/admission.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/row/admission.h"
#include "cuda/row/hash.h"
#include "cuda/row/index.h"
#include "host/admission/delta_generations.hpp"
#include "host/error.hpp"
#include "io/format/admission_file.hpp"

namespace embstore {
namespace {

using io::AdmissionEntry;
using io::AdmissionKind;

// An array in pieces of about 64 KiB that a checkpoint can share: share() hands out the
// pieces, and a later write to a shared piece copies that piece first. Shares are taken and
// dropped under the table's lock (capture, end_snapshot), like every write, so use_count() is
// stable where mut() reads it; the checkpoint's worker only reads its pieces.
template <typename T>
class CowArray {
 public:
  using Piece = std::vector<T>;
  using Shared = std::vector<std::shared_ptr<const Piece>>;
  static constexpr size_t kPiece = std::max<size_t>(1, (size_t{64} << 10) / sizeof(T));

  CowArray() = default;
  CowArray(CowArray&& o) noexcept
      : pieces_(std::move(o.pieces_)), size_(std::exchange(o.size_, 0)) {}
  CowArray& operator=(CowArray&& o) noexcept {
    pieces_ = std::move(o.pieces_);
    size_ = std::exchange(o.size_, 0);
    return *this;
  }

  // All or nothing: on bad_alloc the array is as it was.
  void assign(size_t n, const T& value) {
    std::vector<std::shared_ptr<Piece>> pieces;
    for (size_t at = 0; at < n; at += kPiece) {
      pieces.push_back(std::make_shared<Piece>(std::min(kPiece, n - at), value));
    }
    pieces_ = std::move(pieces);
    size_ = n;
  }
  size_t size() const { return size_; }
  const T& operator[](size_t i) const { return (*pieces_[i / kPiece])[i % kPiece]; }
  T& mut(size_t i) {
    std::shared_ptr<Piece>& p = pieces_[i / kPiece];
    if (p.use_count() > 1) p = std::make_shared<Piece>(*p);  // a checkpoint holds it
    return (*p)[i % kPiece];
  }
  Shared share() const { return Shared(pieces_.begin(), pieces_.end()); }
  template <typename F>
  static void for_each(const Shared& pieces, F&& f) {
    for (const auto& p : pieces) {
      for (const T& x : *p) f(x);
    }
  }

 private:
  std::vector<std::shared_ptr<Piece>> pieces_;
  size_t size_ = 0;
};

// Pending keys in an open-addressing table (linear probing, at most half full, backward-shift
// deletion). A count of 0 marks an empty slot, so every key is valid. For deltas, each entry
// holds the generation of its last change (in AdmissionEntry::reserved, 0 in files), and the
// keys removed since the base are listed.
class ExactCounter final : public AdmissionCounter {
 public:
  explicit ExactCounter(uint32_t admit_after) : admit_after_(admit_after) { slots_.assign(16, {}); }

  bool count(int64_t key, uint64_t step) override {
    if (2 * (size_ + 1) > slots_.size()) rehash(2 * slots_.size());
    Entry& e = slots_.mut(probe(key));
    if (e.count == 0) {
      e.key = key;
      ++size_;
    }
    e.count = row::admit_increment(e.count);
    e.step = step;
    e.reserved = generations_.current();
    return e.count >= admit_after_;
  }

  void admitted(int64_t key) override {
    const size_t s = probe(key);
    if (slots_[s].count != 0) erase_at(s);
  }

  // A key is admitted once its count reaches admit_after, so by the call's last occurrence.
  uint64_t would_admit(const int64_t* keys, size_t n) const override {
    std::unordered_map<int64_t, uint32_t> counts;
    counts.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const auto [at, added] = counts.try_emplace(keys[i], 0);
      if (added) at->second = slots_[probe(keys[i])].count;
      at->second = row::admit_increment(at->second);
    }
    return static_cast<uint64_t>(std::count_if(
        counts.begin(), counts.end(), [&](const auto& c) { return c.second >= admit_after_; }));
  }

  uint64_t forget_before(uint64_t step) override {
    return erase_where([&](const Entry& e) { return e.step < step; });
  }

  void drop_if(const std::function<bool(int64_t)>& has_row) override {
    erase_where([&](const Entry& e) { return has_row(e.key); });
  }

  uint64_t pending() const override { return size_; }

  std::unique_ptr<const Frozen> freeze(bool full) override {
    // Without committed counts to build on (none yet, or a restore that loaded none), a delta
    // carries every count too (view().whole).
    DeltaGenerations::Frozen f = generations_.view(full);
    auto frozen =
        std::make_unique<FrozenSlots>(slots_.share(), size_, f.whole, f.base, std::move(f.removed));
    generations_.freeze();
    return frozen;
  }

  void end_freeze(bool committed) override { generations_.end_freeze(committed); }

  bool load(const io::AdmissionFile& f, std::string* why) override {
    if (f.kind == AdmissionKind::kBloom) {
      *why = "they were counted by a Bloom filter, this table counts exactly";
      return false;
    }
    if (f.kind != AdmissionKind::kExact) {
      *why = "they are a delta: merge the chain first (io::merge_admission_files)";
      return false;
    }
    std::vector<Entry> entries = f.entries;
    for (Entry& e : entries) {
      e.reserved = 0;                                    // loaded counts are the next delta's base
      e.count = std::min(e.count, row::kAdmitMaxCount);  // 0.4.0 saturated at UINT32_MAX
    }
    rebuild(std::max<size_t>(16, std::bit_ceil(2 * entries.size() + 2)), entries);
    generations_.loaded();
    return true;
  }

 private:
  using Entry = AdmissionEntry;  // reserved: generation of the last change

  class FrozenSlots final : public Frozen {
   public:
    FrozenSlots(CowArray<Entry>::Shared slots, uint64_t size, bool full, uint32_t base,
                std::vector<int64_t> removed)
        : slots_(std::move(slots)),
          size_(size),
          full_(full),
          base_(base),
          removed_(std::move(removed)) {}

    io::AdmissionFile counts() const override {
      io::AdmissionFile out;
      if (full_) {
        out.kind = AdmissionKind::kExact;
        out.entries.reserve(size_);
        add_entries(&out, [](const Entry&) { return true; });
        return out;
      }
      // Removals first, then the counts changed since the base (a removed key counted again
      // is among them).
      out.kind = AdmissionKind::kExactDelta;
      out.removed = removed_;
      std::sort(out.removed.begin(), out.removed.end());
      out.removed.erase(std::unique(out.removed.begin(), out.removed.end()), out.removed.end());
      add_entries(&out, [&](const Entry& e) { return e.reserved > base_; });
      return out;
    }

   private:
    template <typename Pick>
    void add_entries(io::AdmissionFile* out, Pick&& pick) const {
      CowArray<Entry>::for_each(slots_, [&](const Entry& e) {
        if (e.count == 0 || !pick(e)) return;
        out->entries.push_back(e);
        out->entries.back().reserved = 0;
      });
    }

    CowArray<Entry>::Shared slots_;
    uint64_t size_;
    bool full_;
    uint32_t base_;
    std::vector<int64_t> removed_;
  };

  size_t mask() const { return slots_.size() - 1; }
  size_t home(int64_t key) const { return row::hash_key(key) & mask(); }

  // The key's slot, or the empty slot that ends its probe.
  size_t probe(int64_t key) const {
    size_t s = home(key);
    while (slots_[s].count != 0 && slots_[s].key != key) s = (s + 1) & mask();
    return s;
  }

  void erase_at(size_t hole) {
    // Backward shift: pull later entries of the probe run into the hole, so probes never
    // stop early at it. The moves are planned first, and every slot they write is made
    // writable (a shared piece copied) before the first write, so a bad_alloc changes nothing.
    shifts_.clear();
    shifts_.push_back(hole);
    for (size_t s = (hole + 1) & mask(), h = hole; slots_[s].count != 0; s = (s + 1) & mask()) {
      if (row::stays_behind_hole(h, home(slots_[s].key), s)) continue;
      shifts_.push_back(s);
      h = s;
    }
    generations_.reserve_removed(1);
    for (const size_t s : shifts_) slots_.mut(s);
    generations_.note_removed(slots_[hole].key);
    for (size_t k = 0; k + 1 < shifts_.size(); ++k) {
      slots_.mut(shifts_[k]) = slots_[shifts_[k + 1]];
    }
    slots_.mut(shifts_.back()) = Entry{};
    --size_;
  }

  // Rebuilds the table without the entries pred picks (a pass over the slots either way), at
  // a size that fits the rest; returns how many went. What allocates comes before the first
  // change, so a bad_alloc changes nothing.
  template <typename Pred>
  uint64_t erase_where(Pred&& pred) {
    std::vector<Entry> kept;
    std::vector<int64_t> gone;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].count == 0) continue;
      if (pred(slots_[s])) {
        gone.push_back(slots_[s].key);
      } else {
        kept.push_back(slots_[s]);
      }
    }
    if (gone.empty()) return 0;
    generations_.reserve_removed(gone.size());
    rebuild(std::max<size_t>(16, std::bit_ceil(2 * kept.size() + 2)), kept);
    for (const int64_t key : gone) generations_.note_removed(key);
    return gone.size();
  }

  void rehash(size_t slots) {
    std::vector<Entry> live;
    live.reserve(size_);
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].count != 0) live.push_back(slots_[s]);
    }
    rebuild(slots, live);
  }

  // The table at `slots` slots holding `entries`, swapped in once it is built.
  void rebuild(size_t slots, const std::vector<Entry>& entries) {
    CowArray<Entry> fresh;
    fresh.assign(slots, Entry{});
    const size_t m = slots - 1;
    for (const Entry& e : entries) {
      size_t s = row::hash_key(e.key) & m;
      while (fresh[s].count != 0) s = (s + 1) & m;
      fresh.mut(s) = e;
    }
    slots_ = std::move(fresh);
    size_ = entries.size();
  }

  uint32_t admit_after_;
  CowArray<Entry> slots_;
  uint64_t size_ = 0;
  DeltaGenerations generations_;  // entries' reserved field: the generation of their last change
  std::vector<size_t> shifts_;    // erase_at's scratch
};

class BloomCounter final : public AdmissionCounter {
 public:
  BloomCounter(uint32_t admit_after, uint64_t cells) : admit_after_(admit_after) {
    counters_.assign(cells, 0);
  }

  bool count(int64_t key, uint64_t) override {
    return row::bloom_count(Cells{counters_}, counters_.size(), key, &filled_) >= admit_after_;
  }
  void admitted(int64_t) override {}
  // The conservative update of one key moves counters that others share, so the occurrences
  // are counted in order over a copy of the counters they touch.
  uint64_t would_admit(const int64_t* keys, size_t n) const override {
    std::unordered_map<size_t, uint8_t> touched;
    const Overlay cells{counters_, touched};
    std::vector<int64_t> admitted;
    uint64_t filled = 0;
    for (size_t i = 0; i < n; ++i) {
      if (row::bloom_count(cells, counters_.size(), keys[i], &filled) >= admit_after_) {
        admitted.push_back(keys[i]);
      }
    }
    return distinct_keys(admitted);
  }
  uint64_t forget_before(uint64_t) override { return 0; }
  void drop_if(const std::function<bool(int64_t)>&) override {}

  // The distinct keys counted, estimated from the share of counters in use: each key fills up
  // to kBloomHashes of m counters, so E[filled] = m (1 - (1 - 1/m)^(kn)).
  uint64_t pending() const override {
    const double m = static_cast<double>(counters_.size());
    const double empty = static_cast<double>(counters_.size() - filled_);
    if (empty == 0) return UINT64_MAX;
    return static_cast<uint64_t>(-m / row::kBloomHashes * std::log(empty / m) + 0.5);
  }

  // A filter changes all over at once: every checkpoint takes it whole.
  std::unique_ptr<const Frozen> freeze(bool) override {
    return std::make_unique<FrozenCounters>(counters_.share(), counters_.size());
  }
  void end_freeze(bool) override {}

  bool load(const io::AdmissionFile& f, std::string* why) override {
    if (f.kind != AdmissionKind::kBloom) {
      *why = "they were counted exactly, this table counts in a Bloom filter";
      return false;
    }
    if (f.counters.size() != counters_.size()) {
      *why = fmt::format("they fill a Bloom filter of {} bytes, this table's has {}",
                         f.counters.size(), counters_.size());
      return false;
    }
    filled_ = 0;
    for (uint64_t i = 0; i < f.counters.size(); ++i) {
      const uint8_t c = f.counters[i];
      if (c != counters_[i]) counters_.mut(i) = c;
      filled_ += c != 0;
    }
    return true;
  }

 private:
  // bloom_count's view of the counters: reads through, writes copy a shared piece first.
  struct Cells {
    CowArray<uint8_t>& a;
    struct Ref {
      CowArray<uint8_t>& a;
      size_t i;
      operator uint32_t() const { return a[i]; }
      Ref& operator=(uint8_t v) {
        a.mut(i) = v;
        return *this;
      }
    };
    Ref operator[](size_t i) const { return {a, i}; }
  };

  // would_admit's view: reads the counters until a cell is written, then its copy.
  struct Overlay {
    const CowArray<uint8_t>& a;
    std::unordered_map<size_t, uint8_t>& touched;
    uint8_t& operator[](size_t i) const { return touched.try_emplace(i, a[i]).first->second; }
  };

  class FrozenCounters final : public Frozen {
   public:
    FrozenCounters(CowArray<uint8_t>::Shared counters, uint64_t n)
        : counters_(std::move(counters)), n_(n) {}
    io::AdmissionFile counts() const override {
      io::AdmissionFile out;
      out.kind = AdmissionKind::kBloom;
      out.counters.reserve(n_);
      for (const auto& piece : counters_) {
        out.counters.insert(out.counters.end(), piece->begin(), piece->end());
      }
      return out;
    }

   private:
    CowArray<uint8_t>::Shared counters_;
    uint64_t n_;
  };

  uint32_t admit_after_;
  CowArray<uint8_t> counters_;
  uint64_t filled_ = 0;  // counters above 0
};

}  // namespace

uint64_t distinct_keys(std::vector<int64_t>& keys) {
  std::sort(keys.begin(), keys.end());
  return static_cast<uint64_t>(std::unique(keys.begin(), keys.end()) - keys.begin());
}

std::unique_ptr<AdmissionCounter> AdmissionCounter::make(const TableSpec& spec) {
  if (spec.admit_after <= 1) return nullptr;
  if (spec.admit_bloom_bytes != 0) {
    return std::make_unique<BloomCounter>(spec.admit_after, spec.admit_bloom_bytes);
  }
  return std::make_unique<ExactCounter>(spec.admit_after);
}

}  // namespace embstore
