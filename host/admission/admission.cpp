#include "host/admission/admission.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

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

void put_header(std::vector<char>* out, uint32_t kind, uint64_t n) {
  out->resize(kHeaderBytes);
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

// Pending keys in an open-addressing table (linear probing, at most half full, backward-shift
// deletion). A count of 0 marks an empty slot, so every key is valid.
class ExactCounter final : public AdmissionCounter {
 public:
  explicit ExactCounter(uint32_t admit_after) : admit_after_(admit_after) { slots_.resize(16); }

  bool count(int64_t key, uint64_t step) override {
    if (2 * (size_ + 1) > slots_.size()) rehash(2 * slots_.size());
    Entry& e = slots_[probe(key)];
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

  std::vector<char> save() const override {
    std::vector<char> out;
    put_header(&out, kExact, size_);
    out.resize(kHeaderBytes + size_ * sizeof(Entry));
    char* p = out.data() + kHeaderBytes;
    for (const Entry& e : slots_) {
      if (e.count == 0) continue;
      std::memcpy(p, &e, sizeof(Entry));
      p += sizeof(Entry);
    }
    return out;
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
      Entry& slot = loaded.slots_[loaded.probe(e.key)];
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
      slots_[hole] = slots_[s];
      hole = s;
    }
    slots_[hole] = Entry{};
    --size_;
  }

  template <typename Pred>
  uint64_t erase_where(Pred&& pred) {
    // Rebuilding is simpler than erasing in place while scanning, and a pass over the slots
    // costs as much either way.
    uint64_t erased = 0;
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(old.size(), Entry{});
    size_ = 0;
    for (const Entry& e : old) {
      if (e.count == 0) continue;
      if (pred(e)) {
        ++erased;
        continue;
      }
      slots_[probe(e.key)] = e;
      ++size_;
    }
    while (slots_.size() > 16 && 8 * size_ < slots_.size()) rehash(slots_.size() / 2);
    return erased;
  }

  void rehash(size_t slots) {
    std::vector<Entry> old = std::move(slots_);
    slots_.assign(slots, Entry{});
    for (const Entry& e : old) {
      if (e.count != 0) slots_[probe(e.key)] = e;
    }
  }

  uint32_t admit_after_;
  std::vector<Entry> slots_;
  uint64_t size_ = 0;
};

class BloomCounter final : public AdmissionCounter {
 public:
  BloomCounter(uint32_t admit_after, uint64_t cells)
      : admit_after_(admit_after), counters_(cells, 0) {}

  bool count(int64_t key, uint64_t) override {
    return row::bloom_count(counters_.data(), counters_.size(), key, &filled_) >= admit_after_;
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

  std::vector<char> save() const override {
    std::vector<char> out;
    put_header(&out, kBloom, counters_.size());
    out.insert(out.end(), counters_.begin(), counters_.end());
    return out;
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
    std::memcpy(counters_.data(), bytes.data() + kHeaderBytes, h.n);
    filled_ = static_cast<uint64_t>(
        std::count_if(counters_.begin(), counters_.end(), [](uint8_t c) { return c != 0; }));
    return true;
  }

 private:
  uint32_t admit_after_;
  std::vector<uint8_t> counters_;
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
