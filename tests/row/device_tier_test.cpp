// The CUDA device tier's row trades (cuda/row/device_tier.h), as the host compiler builds them:
// two rows trade ids with everything an id names, and only rows that may move down are chosen.
#include "cuda/row/device_tier.h"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <vector>

using namespace embstore::row;

namespace {

// A table's row side on the host: two chunks of 64 and 128 rows (the second in two parts, as a
// device budget of 100 rows cuts it), an index, and a dirty bitmap.
struct SmallTable {
  static constexpr uint32_t kStride = 3;
  std::vector<float> values0 = std::vector<float>(64 * kStride),
                     values1 = std::vector<float>(36 * kStride),
                     values1_host = std::vector<float>(92 * kStride);
  std::vector<RowMeta> meta0 = std::vector<RowMeta>(64), meta1 = std::vector<RowMeta>(128);
  std::vector<Slot> slots = std::vector<Slot>(index_slots_for(192));
  std::vector<uint64_t> dirty = std::vector<uint64_t>(bitmap_words(192), 0);
  std::vector<uint64_t> carried = std::vector<uint64_t>(bitmap_words(192), 0);
  ArenaRef arena{};
  IndexRef index{};

  explicit SmallTable(uint64_t rows) {
    arena.base_shift = 6;
    arena.dim = 2;
    arena.stride = kStride;
    arena.values[0] = values0.data();
    arena.values[1] = values1.data();
    arena.split_chunk = 1;
    arena.split_offset = 36;
    arena.split_values = values1_host.data();
    arena.meta[0] = meta0.data();
    arena.meta[1] = meta1.data();
    std::memset(slots.data(), 0xFF, slots.size() * sizeof(Slot));
    index = IndexRef{slots.data(), slots.size() - 1};
    for (uint64_t r = 0; r < rows; ++r) {
      const int64_t key = 1000 + static_cast<int64_t>(r) * 7;
      index.insert_absent(key, static_cast<uint32_t>(r));
      *arena.row_meta(r) = RowMeta{key, r / 10};
      for (uint32_t c = 0; c < kStride; ++c) arena.row(r)[c] = static_cast<float>(key) + 0.25f * c;
      if (r % 3 == 0) bitmap_set<false>(dirty.data(), r);
      if (r % 4 == 1) bitmap_set<false>(carried.data(), r);
    }
  }

  // key -> (row, values, step, dirty, carried) of every row.
  struct Seen {
    uint32_t row;
    std::vector<float> values;
    uint64_t step;
    bool dirty;
    bool carried;
  };
  std::map<int64_t, Seen> rows(uint64_t n) const {
    std::map<int64_t, Seen> out;
    for (uint64_t r = 0; r < n; ++r) {
      const RowMeta m = *arena.row_meta(r);
      out[m.key] =
          Seen{static_cast<uint32_t>(r), std::vector<float>(arena.row(r), arena.row(r) + kStride),
               m.step, bitmap_test(dirty.data(), r), bitmap_test(carried.data(), r)};
    }
    return out;
  }
};

}  // namespace

TEST_CASE("two rows trade ids with their values, metadata, index entries, dirty and carried bits",
          "[row][tiers]") {
  const uint64_t n = 150;
  SmallTable t(n);
  const auto before = t.rows(n);
  // Device rows 3 (dirty), 10 and 40 trade with host rows 121 (carried), 72 (dirty) and 149
  // (carried); 9 (dirty, carried) with 13 (carried).
  const std::vector<std::pair<uint64_t, uint64_t>> pairs{{3, 121}, {10, 72}, {40, 149}, {9, 13}};
  for (const auto& [a, b] : pairs) {
    for (uint32_t lane = 0; lane < 2; ++lane) swap_records(t.arena, a, b, lane, 2);
    swap_identities<true>(t.arena, t.index, t.dirty.data(), t.carried.data(), a, b);
  }
  const auto after = t.rows(n);
  REQUIRE(after.size() == before.size());
  std::map<uint32_t, uint32_t> moved;
  for (const auto& [a, b] : pairs) {
    moved[static_cast<uint32_t>(a)] = static_cast<uint32_t>(b);
    moved[static_cast<uint32_t>(b)] = static_cast<uint32_t>(a);
  }
  for (const auto& [key, was] : before) {
    const auto& now = after.at(key);
    const auto m = moved.find(was.row);
    REQUIRE(now.row == (m == moved.end() ? was.row : m->second));
    REQUIRE(t.index.find(key) == now.row);
    REQUIRE(now.values == was.values);
    REQUIRE(now.step == was.step);
    REQUIRE(now.dirty == was.dirty);
    REQUIRE(now.carried == was.carried);
  }
  // The device-memory rows 3, 10 and 40 now hold the keys of rows 121, 72 and 149.
  REQUIRE(t.arena.row_meta(3)->key == 1000 + 121 * 7);
  REQUIRE_FALSE(bitmap_test(t.dirty.data(), 3));
  REQUIRE(bitmap_test(t.carried.data(), 3));  // the snapshot's claim goes with row 121's key
  REQUIRE_FALSE(bitmap_test(t.carried.data(), 121));
  REQUIRE(bitmap_test(t.dirty.data(), 10));
  REQUIRE(t.arena.row(40) == t.values0.data() + 40 * SmallTable::kStride);
  REQUIRE(t.arena.row(40)[0] == static_cast<float>(1000 + 149 * 7));
}

TEST_CASE("only live, idle rows outside the snapshot and the last two batches move down",
          "[row][tiers]") {
  std::vector<uint64_t> snapshot(2, 0), freed(2, 0);
  // Row 5 wanted by this prefetch (generation 9), row 3 by the one before, row 2 by an older one.
  std::vector<uint32_t> wanted(128, 0);
  wanted[5] = 9;
  wanted[3] = 8;
  wanted[2] = 7;
  bitmap_set<false>(snapshot.data(), 6);
  bitmap_set<false>(freed.data(), 7);
  const uint64_t cutoff = 10;
  const uint32_t g = 9;
  auto may = [&](uint64_t r, uint64_t last_step, const uint64_t* snap, const uint64_t* fr) {
    return may_move_down(r, last_step, cutoff, wanted.data(), g, snap, fr);
  };
  REQUIRE(may(4, 9, snapshot.data(), freed.data()));
  REQUIRE_FALSE(may(4, 10, snapshot.data(), freed.data()));  // touched at the cutoff
  REQUIRE_FALSE(may(5, 0, snapshot.data(), freed.data()));
  REQUIRE_FALSE(may(3, 0, snapshot.data(), freed.data()));
  REQUIRE(may(2, 0, snapshot.data(), freed.data()));
  REQUIRE_FALSE(may(6, 0, snapshot.data(), freed.data()));
  REQUIRE(may(6, 0, nullptr, freed.data()));
  REQUIRE_FALSE(may(7, 0, snapshot.data(), freed.data()));
  REQUIRE(may(7, 0, snapshot.data(), nullptr));
  // The last generation before the wrap: its own rows and its predecessor's stay.
  wanted[4] = UINT32_MAX;
  wanted[8] = UINT32_MAX - 1;
  wanted[9] = UINT32_MAX - 2;
  auto may_last = [&](uint64_t r) {
    return may_move_down(r, 0, cutoff, wanted.data(), UINT32_MAX, nullptr, nullptr);
  };
  REQUIRE_FALSE(may_last(4));
  REQUIRE_FALSE(may_last(8));
  REQUIRE(may_last(9));
}
