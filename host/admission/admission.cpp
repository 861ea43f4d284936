#include "host/admission/admission.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>

#include "cuda/row/admission.h"
#include "cuda/row/hash.h"
#include "host/error.hpp"

namespace embstore {
namespace {

constexpr char kMagic[8] = {'E', 'M', 'B', 'A', 'D', 'M', 'I', 'T'};
constexpr uint32_t kFormat = 1;
constexpr uint32_t kExact = 0, kBloom = 1;
constexpr size_t kHeaderBytes = 24;

struct Header {
  uint32_t kind = 0;
  uint64_t n = 0;
};

// The header, followed by payload_bytes for the caller to fill.
void put_header(std::vector<char>* out, uint32_t kind, uint64_t n, size_t payload_bytes) {
  out->resize(kHeaderBytes + payload_bytes);
  std::memcpy(out->data(), kMagic, 8);
  std::memcpy(out->data() + 8, &kind, 4);
  std::memcpy(out->data() + 12, &kFormat, 4);
  std::memcpy(out->data() + 16, &n, 8);
}

Header get_header(const std::string& bytes) {
  if (bytes.size() < kHeaderBytes || std::memcmp(bytes.data(), kMagic, 8) != 0) {
    fail(EMBSTORE_CORRUPT, "the admission file has no EMBADMIT header");
  }
  Header h;
  uint32_t format = 0;
  std::memcpy(&h.kind, bytes.data() + 8, 4);
  std::memcpy(&format, bytes.data() + 12, 4);
  std::memcpy(&h.n, bytes.data() + 16, 8);
  if (format != kFormat) {
    fail(EMBSTORE_CORRUPT, "the admission file has format {}, this version reads {}", format,
         kFormat);
  }
  if (h.kind != kExact && h.kind != kBloom) {
    fail(EMBSTORE_CORRUPT, "the admission file has counting kind {}", h.kind);
  }
  return h;
}

const char* kind_name(uint32_t kind) { return kind == kExact ? "exact" : "Bloom filter"; }

// An array in pieces of about 64 KiB that a checkpoint can share: share() hands out the
// pieces, and a later write to a shared piece copies that piece first. The pieces' reference
// counts are atomic, so the checkpoint's worker may drop its share while training writes.
template <typename T>
class CowArray {
 public:
  using Piece = std::vector<T>;
  using Shared = std::vector<std::shared_ptr<const Piece>>;
  static constexpr size_t kPiece = std::max<size_t>(1, (size_t{64} << 10) / sizeof(T));

  void assign(size_t n, const T& value) {
    pieces_.clear();
    for (size_t at = 0; at < n; at += kPiece) {
      pieces_.push_back(std::make_shared<Piece>(std::min(kPiece, n - at), value));
    }
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
// deletion). A count of 0 marks an empty slot, so every key is valid.
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
    if (e.count < UINT32_MAX) ++e.count;
    e.step = step;
    return e.count >= admit_after_;
  }

  void admitted(int64_t key) override {
    const size_t s = probe(key);
    if (slots_[s].count != 0) erase_at(s);
  }

  uint64_t forget_before(uint64_t step) override {
    return erase_where([&](const Entry& e) { return e.step < step; });
  }

  void drop_if(const std::function<bool(int64_t)>& has_row) override {
    erase_where([&](const Entry& e) { return has_row(e.key); });
  }

  uint64_t pending() const override { return size_; }

  std::unique_ptr<const Frozen> freeze() const override {
    return std::make_unique<FrozenSlots>(slots_.share(), size_);
  }

  bool load(const std::string& bytes, std::string* why) override {
    const Header h = get_header(bytes);
    if (h.kind != kExact) {
      *why = fmt::format("they were counted by a {}, this table counts exactly", kind_name(h.kind));
      return false;
    }
    if (h.n > (bytes.size() - kHeaderBytes) / sizeof(Entry) ||
        bytes.size() != kHeaderBytes + h.n * sizeof(Entry)) {
      fail(EMBSTORE_CORRUPT, "the admission file is {} bytes, {} entries need {}", bytes.size(),
           h.n, kHeaderBytes + h.n * sizeof(Entry));
    }
    ExactCounter loaded(admit_after_);
    loaded.rehash(std::max<size_t>(16, std::bit_ceil(2 * h.n + 2)));
    for (uint64_t i = 0; i < h.n; ++i) {
      Entry e;
      std::memcpy(&e, bytes.data() + kHeaderBytes + i * sizeof(Entry), sizeof(Entry));
      if (e.count == 0) fail(EMBSTORE_CORRUPT, "the admission file has key {} with count 0", e.key);
      Entry& slot = loaded.slots_.mut(loaded.probe(e.key));
      if (slot.count != 0) fail(EMBSTORE_CORRUPT, "the admission file lists key {} twice", e.key);
      slot = e;
      slot.unused = 0;
      ++loaded.size_;
    }
    slots_ = std::move(loaded.slots_);
    size_ = loaded.size_;
    return true;
  }

 private:
  struct Entry {
    int64_t key = 0;
    uint32_t count = 0;  // 0: empty slot
    uint32_t unused = 0;
    uint64_t step = 0;  // last seen
  };
  static_assert(sizeof(Entry) == 24);

  class FrozenSlots final : public Frozen {
   public:
    FrozenSlots(CowArray<Entry>::Shared slots, uint64_t size)
        : slots_(std::move(slots)), size_(size) {}
    std::vector<char> bytes() const override {
      std::vector<char> out;
      put_header(&out, kExact, size_, size_ * sizeof(Entry));
      char* p = out.data() + kHeaderBytes;
      CowArray<Entry>::for_each(slots_, [&](const Entry& e) {
        if (e.count == 0) return;
        std::memcpy(p, &e, sizeof(Entry));
        p += sizeof(Entry);
      });
      return out;
    }

   private:
    CowArray<Entry>::Shared slots_;
    uint64_t size_;
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
    // stop early at it.
    for (size_t s = (hole + 1) & mask(); slots_[s].count != 0; s = (s + 1) & mask()) {
      const size_t h = home(slots_[s].key);
      // The entry at s may fill the hole unless its home lies cyclically in (hole, s].
      const bool stays = hole <= s ? (hole < h && h <= s) : (hole < h || h <= s);
      if (stays) continue;
      slots_.mut(hole) = slots_[s];
      hole = s;
    }
    slots_.mut(hole) = Entry{};
    --size_;
  }

  // Rebuilds the table without the entries pred picks (a pass over the slots either way),
  // at a size that fits the rest; returns how many went.
  template <typename Pred>
  uint64_t erase_where(Pred&& pred) {
    std::vector<Entry> kept;
    for (size_t s = 0; s < slots_.size(); ++s) {
      if (slots_[s].count != 0 && !pred(slots_[s])) kept.push_back(slots_[s]);
    }
    const uint64_t erased = size_ - kept.size();
    slots_.assign(std::max<size_t>(16, std::bit_ceil(2 * kept.size() + 2)), Entry{});
    for (const Entry& e : kept) slots_.mut(probe(e.key)) = e;
    size_ = kept.size();
    return erased;
  }

  void rehash(size_t slots) {
    CowArray<Entry> old = std::move(slots_);
    slots_.assign(slots, Entry{});
    for (size_t s = 0; s < old.size(); ++s) {
      if (old[s].count != 0) slots_.mut(probe(old[s].key)) = old[s];
    }
  }

  uint32_t admit_after_;
  CowArray<Entry> slots_;
  uint64_t size_ = 0;
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

  std::unique_ptr<const Frozen> freeze() const override {
    return std::make_unique<FrozenCounters>(counters_.share(), counters_.size());
  }

  bool load(const std::string& bytes, std::string* why) override {
    const Header h = get_header(bytes);
    if (h.kind != kBloom) {
      *why = fmt::format("they were counted exactly, this table counts in a Bloom filter");
      return false;
    }
    if (bytes.size() - kHeaderBytes != h.n) {
      fail(EMBSTORE_CORRUPT, "the admission file is {} bytes, a filter of {} counters needs {}",
           bytes.size(), h.n, kHeaderBytes + h.n);
    }
    if (h.n != counters_.size()) {
      *why = fmt::format("they fill a Bloom filter of {} bytes, this table's has {}", h.n,
                         counters_.size());
      return false;
    }
    filled_ = 0;
    for (uint64_t i = 0; i < h.n; ++i) {
      const auto c = static_cast<uint8_t>(bytes[kHeaderBytes + i]);
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

  class FrozenCounters final : public Frozen {
   public:
    FrozenCounters(CowArray<uint8_t>::Shared counters, uint64_t n)
        : counters_(std::move(counters)), n_(n) {}
    std::vector<char> bytes() const override {
      std::vector<char> out;
      put_header(&out, kBloom, n_, n_);
      char* p = out.data() + kHeaderBytes;
      for (const auto& piece : counters_) {
        std::memcpy(p, piece->data(), piece->size());
        p += piece->size();
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

std::unique_ptr<AdmissionCounter> AdmissionCounter::make(const TableSpec& spec) {
  if (spec.admit_after <= 1) return nullptr;
  if (spec.admit_bloom_bytes != 0) {
    return std::make_unique<BloomCounter>(spec.admit_after, spec.admit_bloom_bytes);
  }
  return std::make_unique<ExactCounter>(spec.admit_after);
}

}  // namespace embstore
