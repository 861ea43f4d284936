#include "host/serving/served_rows.hpp"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <thread>

#include "cuda/row/hash.h"
#include "cuda/row/index.h"
#include "host/error.hpp"

namespace embstore::serving {

// ---- ConcurrentIndex ------------------------------------------------------------------------

ConcurrentIndex::ConcurrentIndex(uint64_t capacity) {
  const uint64_t slots = std::bit_ceil(std::max<uint64_t>(2 * capacity, 16));
  mask_ = slots - 1;
  capacity_ = slots / 2;
  slots_ = std::make_unique<Slot[]>(slots);
}

uint32_t ConcurrentIndex::find(int64_t key) const {
  for (uint64_t i = row::hash_key(key) & mask_;; i = (i + 1) & mask_) {
    const Slot& s = slots_[i];
    const uint32_t state = s.state.load(std::memory_order_acquire);
    if (state == kEmpty) return kNoRow;
    if (state == kFull && s.key.load(std::memory_order_relaxed) == key) {
      return s.row.load(std::memory_order_relaxed);
    }
  }
}

bool ConcurrentIndex::insert(int64_t key, uint32_t row) {
  // Probe to the end of the run first: the key may sit past an erased slot.
  uint64_t reuse = UINT64_MAX;
  uint64_t i = row::hash_key(key) & mask_;
  for (;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    const uint32_t state = s.state.load(std::memory_order_relaxed);
    if (state == kEmpty) break;
    if (state == kErased && reuse == UINT64_MAX) reuse = i;
    if (state == kFull && s.key.load(std::memory_order_relaxed) == key) {
      s.row.store(row, std::memory_order_release);
      return true;
    }
  }
  if (reuse == UINT64_MAX) {
    if (used_ + 1 > capacity_) return false;
    reuse = i;
    ++used_;
  }
  Slot& s = slots_[reuse];
  s.key.store(key, std::memory_order_relaxed);
  s.row.store(row, std::memory_order_relaxed);
  s.state.store(kFull, std::memory_order_release);
  ++size_;
  return true;
}

uint32_t ConcurrentIndex::erase(int64_t key) {
  for (uint64_t i = row::hash_key(key) & mask_;; i = (i + 1) & mask_) {
    Slot& s = slots_[i];
    const uint32_t state = s.state.load(std::memory_order_relaxed);
    if (state == kEmpty) return kNoRow;
    if (state == kFull && s.key.load(std::memory_order_relaxed) == key) {
      s.state.store(kErased, std::memory_order_release);
      --size_;
      return s.row.load(std::memory_order_relaxed);
    }
  }
}

void ConcurrentIndex::for_each(const std::function<void(int64_t, uint32_t)>& f) const {
  for (uint64_t i = 0; i <= mask_; ++i) {
    const Slot& s = slots_[i];
    if (s.state.load(std::memory_order_relaxed) == kFull) {
      f(s.key.load(std::memory_order_relaxed), s.row.load(std::memory_order_relaxed));
    }
  }
}

// ---- RowArena -------------------------------------------------------------------------------

RowArena::RowArena(uint32_t dim)
    : dim_(dim), chunks_(std::make_unique<std::atomic<float*>[]>(kMaxChunks)) {}

float* RowArena::row(uint32_t r) const {
  float* chunk = chunks_[r >> kChunkShift].load(std::memory_order_acquire);
  return chunk + size_t{r & ((1u << kChunkShift) - 1)} * dim_;
}

uint32_t RowArena::take() {
  if (!free_.empty()) {
    const uint32_t r = free_.back();
    free_.pop_back();
    return r;
  }
  if (next_ == ConcurrentIndex::kNoRow) fail(EMBSTORE_CAPACITY_EXCEEDED, "a served table is full");
  const uint32_t chunk = next_ >> kChunkShift;
  if ((next_ & ((1u << kChunkShift) - 1)) == 0) {
    owned_.push_back(std::make_unique<float[]>(size_t{dim_} << kChunkShift));
    chunks_[chunk].store(owned_.back().get(), std::memory_order_release);
  }
  return next_++;
}

// ---- ServedRows -----------------------------------------------------------------------------

// One version's changes to a table, immutable once published: each key's row in values, or
// kTombstone. Indexed by the tables' own open-addressing index (cuda/row/index.h: linear
// probing, at most half full), so that lookups of the keys a version changed, which are the
// keys training touched and serving reads most, probe adjacent slots instead of chasing a
// node-based map's pointers.
struct ServedRows::Overlay {
  static constexpr uint32_t kTombstone = static_cast<uint32_t>(row::kMaxRows);

  // Upserts win over tombstones of the same key, and a later upsert over an earlier one: each
  // key keeps the first row it is given, so upserts go in from the last, then tombstones.
  Overlay(const TableChanges& c, std::vector<float> rows)
      : slots(row::index_slots_for(c.keys.size() + c.tombstones.size()),
              row::Slot{0, row::kEmptyRow, 0}),
        index{slots.data(), slots.size() - 1},
        values(std::move(rows)) {
    if (c.keys.size() >= row::kMaxRows)
      fail(EMBSTORE_CAPACITY_EXCEEDED, "a delta of {} rows", c.keys.size());
    bool inserted = false;
    for (size_t i = c.keys.size(); i-- > 0;) {
      index.find_or_insert_serial(c.keys[i], static_cast<uint32_t>(i), &inserted);
    }
    for (int64_t k : c.tombstones) index.find_or_insert_serial(k, kTombstone, &inserted);
  }
  Overlay(const Overlay&) = delete;
  Overlay& operator=(const Overlay&) = delete;

  std::vector<row::Slot> slots;
  row::IndexRef index;  // over slots
  std::vector<float> values;
};

struct ServedRows::Base {
  explicit Base(uint32_t dim) : arena(dim), index(std::make_shared<ConcurrentIndex>(1024)) {}
  RowArena arena;
  std::shared_ptr<ConcurrentIndex> index;  // the writer's; views share it
};

struct ServedRows::TableView {
  const RowArena* arena = nullptr;
  std::shared_ptr<const ConcurrentIndex> index;
  std::vector<std::shared_ptr<const Overlay>> overlays;  // newest first
};

struct ServedRows::View {
  View() = default;
  // A copy is a new view: its release is its own.
  View(const View& o) : version(o.version), tables(o.tables) {}
  // Run by whichever thread drops the last reference, after its reads (the reference counts'
  // read-modify-writes order every reader's reads before it): the writer waits for this flag.
  ~View() { released->store(true, std::memory_order_release); }

  uint64_t version = 0;
  std::map<std::string, TableView> tables;
  std::shared_ptr<std::atomic<bool>> released = std::make_shared<std::atomic<bool>>(false);
};

ServedRows::ServedRows(const std::map<std::string, uint32_t>& tables) {
  auto view = std::make_shared<View>();
  for (const auto& [name, dim] : tables) {
    auto base = std::make_unique<Base>(dim);
    view->tables[name] = TableView{&base->arena, base->index, {}};
    bases_[name] = std::move(base);
  }
  view_.store(std::move(view));
}

ServedRows::~ServedRows() = default;

std::shared_ptr<const ServedRows::View> ServedRows::current() const { return view_.load(); }

void ServedRows::publish(std::shared_ptr<const View> view) {
  const std::shared_ptr<const View> old = view_.exchange(std::move(view));
  retired_.push_back(old->released);
}

void ServedRows::wait_for_readers() {
  // Each retired view's flag is set (release) when its last reader let go of it; this acquire
  // orders every read of those readers before the writes that follow.
  for (const std::shared_ptr<std::atomic<bool>>& released : retired_) {
    while (!released->load(std::memory_order_acquire)) {
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
  }
  retired_.clear();
}

bool ServedRows::lookup(const std::string& table, const int64_t* keys, size_t n, float* out,
                        const std::function<void(int64_t, float*)>& fill, uint64_t* version) const {
  const std::shared_ptr<const View> view = current();
  const auto t = view->tables.find(table);
  if (t == view->tables.end()) return false;
  const TableView& tv = t->second;
  const uint32_t dim = tv.arena->dim();
  for (size_t i = 0; i < n; ++i) {
    float* dst = out + i * dim;
    const float* src = nullptr;
    bool decided = false;
    for (const std::shared_ptr<const Overlay>& o : tv.overlays) {
      const uint32_t at = o->index.find(keys[i]);
      if (at == row::kNoRow) continue;
      if (at != Overlay::kTombstone) src = o->values.data() + size_t{at} * dim;
      decided = true;
      break;
    }
    if (!decided) {
      const uint32_t r = tv.index->find(keys[i]);
      if (r != ConcurrentIndex::kNoRow) src = tv.arena->row(r);
    }
    if (src != nullptr) {
      std::memcpy(dst, src, dim * sizeof(float));
    } else if (fill) {
      fill(keys[i], dst);
    } else {
      std::memset(dst, 0, dim * sizeof(float));
    }
  }
  if (version != nullptr) *version = view->version;
  return true;
}

uint64_t ServedRows::version() const { return current()->version; }

std::shared_ptr<ConcurrentIndex> ServedRows::merge_upserts(Base& b, const int64_t* keys,
                                                           const float* values, size_t n) {
  const uint32_t dim = b.arena.dim();
  std::shared_ptr<ConcurrentIndex> index = b.index;
  for (size_t i = 0; i < n; ++i) {
    uint32_t r = index->find(keys[i]);
    if (r == ConcurrentIndex::kNoRow) {
      r = b.arena.take();
      if (!index->insert(keys[i], r)) {
        // A new index for the next view on (the old one stays with its readers), sized by the
        // live keys: erased slots are not carried over, so churn does not grow it.
        auto larger =
            std::make_shared<ConcurrentIndex>(std::max<uint64_t>(2 * (index->size() + 1), 1024));
        index->for_each([&](int64_t key, uint32_t row) { larger->insert(key, row); });
        larger->insert(keys[i], r);
        index = std::move(larger);
      }
    }
    std::memcpy(b.arena.row(r), values + i * dim, dim * sizeof(float));
  }
  return index;
}

void ServedRows::load(const std::string& table, const int64_t* keys, const float* values,
                      size_t n) {
  Base& b = *bases_.at(table);
  b.index = merge_upserts(b, keys, values, n);
}

void ServedRows::finish_load(uint64_t version) {
  auto view = std::make_shared<View>(*current());
  view->version = version;
  for (auto& [name, tv] : view->tables) tv.index = bases_.at(name)->index;
  publish(std::move(view));
  wait_for_readers();
}

uint64_t ServedRows::rows(const std::string& table) const {
  return bases_.at(table)->index->size();
}

void ServedRows::apply(uint64_t version, std::map<std::string, TableChanges> changes) {
  // Step 1: the changes as overlays, in a view of their own.
  auto with_overlays = std::make_shared<View>(*current());
  with_overlays->version = version;
  std::map<std::string, std::shared_ptr<const Overlay>> overlays;
  for (auto& [name, c] : changes) {
    auto t = with_overlays->tables.find(name);
    if (t == with_overlays->tables.end()) fail(EMBSTORE_INTERNAL, "no served table '{}'", name);
    // The values are held once, by the overlay.
    auto overlay = std::make_shared<const Overlay>(c, std::move(c.values));
    overlays[name] = overlay;
    t->second.overlays.insert(t->second.overlays.begin(), std::move(overlay));
  }
  publish(with_overlays);

  // Step 2: once no reader has an older view, into the bases.
  wait_for_readers();
  auto merged = std::make_shared<View>(*with_overlays);
  for (const auto& [name, c] : changes) {
    Base& b = *bases_.at(name);
    for (int64_t k : c.tombstones) {
      const uint32_t r = b.index->erase(k);
      if (r != ConcurrentIndex::kNoRow) b.arena.free(r);
    }
    b.index = merge_upserts(b, c.keys.data(), overlays.at(name)->values.data(), c.keys.size());
    TableView& tv = merged->tables.at(name);
    tv.index = b.index;
    tv.overlays.clear();
  }
  // Step 3: the bases alone.
  publish(merged);
}

}  // namespace embstore::serving
