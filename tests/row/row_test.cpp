// White-box tests of the per-row logic shared by the host backend and the CUDA kernels.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "cuda/row/arena.h"
#include "cuda/row/bitmap.h"
#include "cuda/row/index.h"
#include "cuda/row/init.h"
#include "cuda/row/optimizer.h"

using namespace embstore::row;

TEST_CASE("portable_log is accurate", "[row]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(1e-30f, 1.0f);
  for (int i = 0; i < 200000; ++i) {
    const float x = i < 100000 ? unit(rng) : std::ldexp(unit(rng), (i % 200) - 100);
    if (x <= 0.0f || !std::isnormal(x)) continue;
    const double exact = std::log(static_cast<double>(x));
    const double got = portable_log(x);
    CAPTURE(x);
    REQUIRE(std::fabs(got - exact) <= 3e-7 * std::max(1.0, std::fabs(exact)));
  }
  REQUIRE(portable_log(1.0f) == 0.0f);
}

TEST_CASE("butterfly_sum equals a warp's xor shuffle reduction bit for bit", "[row]") {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 1e3f);
  for (int trial = 0; trial < 1000; ++trial) {
    float partial[kLanes], lanes[kLanes];
    for (uint32_t l = 0; l < kLanes; ++l) partial[l] = lanes[l] = d(rng) * d(rng);
    // What every lane of a warp computes with v = v + shfl_xor(v, s).
    for (uint32_t s = kLanes / 2; s > 0; s /= 2) {
      float next[kLanes];
      for (uint32_t l = 0; l < kLanes; ++l) next[l] = lanes[l] + lanes[l ^ s];
      std::memcpy(lanes, next, sizeof(lanes));
    }
    const float host = butterfly_sum(partial);
    for (uint32_t l = 0; l < kLanes; ++l) REQUIRE(std::memcmp(&lanes[l], &host, 4) == 0);
  }
}

TEST_CASE("chunk_of maps rows one to one into doubling chunks", "[row]") {
  for (uint32_t base_shift : {6u, 10u}) {
    const uint64_t base = uint64_t{1} << base_shift;
    REQUIRE(arena_capacity(0, base_shift) == 0);
    REQUIRE(arena_capacity(1, base_shift) == base);
    REQUIRE(arena_capacity(3, base_shift) == 7 * base);
    uint64_t row = 0;
    for (uint32_t chunk = 0; chunk < 6; ++chunk) {
      for (uint64_t offset = 0; offset < chunk_rows(chunk, base_shift); ++offset, ++row) {
        const ChunkPos p = chunk_of(row, base_shift);
        REQUIRE(p.chunk == chunk);
        REQUIRE(p.offset == offset);
      }
    }
    REQUIRE(row == arena_capacity(6, base_shift));
    const ChunkPos last = chunk_of(kMaxRows - 1, base_shift);
    REQUIRE(last.chunk < static_cast<uint32_t>(kMaxChunks));
  }
}

TEST_CASE("index finds every inserted key, extreme keys and collisions included", "[row]") {
  const uint64_t slots = index_slots_for(1000);
  REQUIRE(slots / 2 >= 1000);
  REQUIRE((slots & (slots - 1)) == 0);
  std::vector<Slot> storage(slots);
  std::memset(storage.data(), 0xFF, slots * sizeof(Slot));
  IndexRef index{storage.data(), slots - 1};

  std::vector<int64_t> keys = {INT64_MIN, INT64_MAX, 0, -1, 1};
  // Keys that share a home slot force probing past occupied slots.
  for (int64_t k = 2; keys.size() < 1000; ++k) {
    if (index.home(k) == index.home(0) || k % 3 == 0) keys.push_back(k);
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    REQUIRE(index.find(keys[i]) == kNoRow);
    index.insert_absent(keys[i], static_cast<uint32_t>(i));
  }
  for (size_t i = 0; i < keys.size(); ++i) REQUIRE(index.find(keys[i]) == i);
  REQUIRE(index.find(-2) == kNoRow);
}

// The parallel load: writers that own halves of the slots, then a serial pass for the keys
// whose probe crosses into the other half, give the index a serial insert gives.
TEST_CASE("index claims within a range of slots, and leaves probes that cross it", "[row]") {
  const uint64_t slots = 64;
  std::vector<Slot> storage(slots);
  std::memset(storage.data(), 0xFF, slots * sizeof(Slot));
  IndexRef index{storage.data(), slots - 1};
  // Keys homed in the last slot of the first half: the second needs a slot of the other half.
  std::vector<int64_t> edge;
  for (int64_t k = 0; edge.size() < 2; ++k) {
    if (index.home(k) == slots / 2 - 1) edge.push_back(k);
  }
  uint64_t at = 0;
  REQUIRE(index.claim_in_range(edge[0], 0, slots / 2, kLockedRow, &at) == IndexRef::kClaimed);
  REQUIRE(at == slots / 2 - 1);
  REQUIRE(storage[at].key == edge[0]);
  REQUIRE(storage[at].row == kLockedRow);
  uint64_t again = 0;
  REQUIRE(index.claim_in_range(edge[0], 0, slots / 2, kLockedRow, &again) == IndexRef::kFound);
  REQUIRE(again == at);
  REQUIRE(index.claim_in_range(edge[1], 0, slots / 2, kLockedRow, &again) ==
          IndexRef::kLeavesRange);
  REQUIRE(storage[slots / 2].row == kEmptyRow);  // nothing written outside the range
  // A key homed in the other half is not this writer's.
  int64_t other = 0;
  while (index.home(other) < slots / 2) ++other;
  REQUIRE(index.claim_in_range(other, 0, slots / 2, kLockedRow, &again) == IndexRef::kLeavesRange);
  // The serial pass places the crossing key where a serial insert would have.
  storage[at].row = 7;
  bool inserted = false;
  REQUIRE(index.find_or_insert_serial(edge[1], 8, &inserted) == 8);
  REQUIRE(inserted);
  REQUIRE(storage[slots / 2].key == edge[1]);
  REQUIRE(index.find(edge[0]) == 7);
  REQUIRE(index.find(edge[1]) == 8);
  // The second half's writer: a key homed in the index's last slot, taken, wraps to slot 0,
  // outside its range; a key whose row sits past the range end (inserted serially before) is
  // left for the serial pass too, which finds it.
  std::vector<int64_t> last;
  for (int64_t k = 1000; last.size() < 2; ++k) {
    if (index.home(k) == slots - 1) last.push_back(k);
  }
  REQUIRE(index.claim_in_range(last[0], slots / 2, slots, kLockedRow, &at) == IndexRef::kClaimed);
  REQUIRE(at == slots - 1);
  REQUIRE(index.claim_in_range(last[1], slots / 2, slots, kLockedRow, &again) ==
          IndexRef::kLeavesRange);
  REQUIRE(storage[0].row == kEmptyRow);
  storage[at].row = 9;
  REQUIRE(index.find_or_insert_serial(last[1], 10, &inserted) == 10);
  REQUIRE(storage[0].key == last[1]);
  REQUIRE(index.claim_in_range(last[1], slots / 2, slots, kLockedRow, &again) ==
          IndexRef::kLeavesRange);  // held in slot 0: found by find(), not by this writer
  REQUIRE(index.find(last[1]) == 10);
}

TEST_CASE("bitmap set, test and count", "[row]") {
  std::vector<uint64_t> words(bitmap_words(200), 0);
  REQUIRE(words.size() == 4);
  for (uint64_t r : {0, 63, 64, 199}) bitmap_set<false>(words.data(), r);
  bitmap_set<true>(words.data(), 100);
  bitmap_set<true>(words.data(), 100);
  REQUIRE(bitmap_count(words.data(), 0, words.size()) == 5);
  // Bits among the first n: rows 0, 63, 64, 100, 199 set.
  auto below = [&](uint64_t bits) {
    uint64_t n = 0;
    for (uint64_t w = 0; w < words.size(); ++w) n += bitmap_count_word_below(words.data(), w, bits);
    return n;
  };
  REQUIRE(below(0) == 0);
  REQUIRE(below(1) == 1);
  REQUIRE(below(63) == 1);
  REQUIRE(below(64) == 2);
  REQUIRE(below(65) == 3);
  REQUIRE(below(101) == 4);
  REQUIRE(below(199) == 4);
  REQUIRE(below(200) == 5);
  REQUIRE(below(256) == 5);
  REQUIRE(bitmap_test(words.data(), 63));
  REQUIRE(bitmap_test(words.data(), 100));
  REQUIRE_FALSE(bitmap_test(words.data(), 62));
}

TEST_CASE("initializers are pure functions of seed, key and column", "[row]") {
  const InitParams normal{InitKind::kNormal, 0.0f, 1.0f, 9};
  const InitParams uniform{InitKind::kUniform, 2.0f, 3.0f, 9};
  std::set<float> distinct;
  for (int64_t key : {INT64_MIN, int64_t{-1}, int64_t{0}, int64_t{12345}, INT64_MAX}) {
    for (uint32_t c = 0; c < 64; ++c) {
      const float n = init_value(normal, key, c);
      REQUIRE(std::isfinite(n));
      REQUIRE(n == init_value(normal, key, c));
      const float u = init_value(uniform, key, c);
      REQUIRE((u >= 2.0f && u <= 3.0f));
      distinct.insert(u);
    }
  }
  REQUIRE(distinct.size() > 300);
  REQUIRE(init_value(InitParams{InitKind::kUniform, 0, 1, 1}, 5, 0) !=
          init_value(InitParams{InitKind::kUniform, 0, 1, 2}, 5, 0));
}

TEST_CASE("state layouts", "[row]") {
  REQUIRE(state_dim(OptKind::kSgd, 16) == 0);
  REQUIRE(state_dim(OptKind::kAdagrad, 16) == 16);
  REQUIRE(state_dim(OptKind::kRowwiseAdagrad, 16) == 1);
  REQUIRE(state_dim(OptKind::kAdam, 16) == 34);
  const OptParams adam{OptKind::kAdam, 0.1f, 1e-8f, 0.9f, 0.999f, 0.0f, 0.0f};
  REQUIRE(initial_state(adam, 16, 0) == 0.0f);
  REQUIRE(initial_state(adam, 16, 31) == 0.0f);
  REQUIRE(initial_state(adam, 16, 32) == 1.0f);
  REQUIRE(initial_state(adam, 16, 33) == 1.0f);
}

TEST_CASE("whole-row initializers equal the per-column ones", "[row]") {
  for (InitKind kind :
       {InitKind::kZeros, InitKind::kConstant, InitKind::kUniform, InitKind::kNormal}) {
    const InitParams p{kind, -0.5f, 0.75f, 77};
    for (int64_t key : {INT64_MIN, int64_t{3}, INT64_MAX}) {
      for (uint32_t dim : {1u, 5u, 64u, 133u}) {
        std::vector<float> row(dim);
        init_row(p, key, dim, row.data());
        for (uint32_t c = 0; c < dim; ++c) {
          const float one = init_value(p, key, c);
          REQUIRE(std::memcmp(&row[c], &one, sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("whole-row state init equals the per-element one", "[row]") {
  for (OptKind kind :
       {OptKind::kSgd, OptKind::kAdagrad, OptKind::kRowwiseAdagrad, OptKind::kAdam}) {
    for (float acc : {0.0f, 0.1f}) {
      const OptParams p{kind, 0.1f, 1e-8f, 0.9f, 0.999f, 0.0f, acc};
      const uint32_t dim = 7;
      std::vector<float> state(state_dim(kind, dim) + 1, -9.0f);
      init_state(p, dim, state.data());
      bool all_zero = true;
      for (uint32_t i = 0; i < state_dim(kind, dim); ++i) {
        REQUIRE(state[i] == initial_state(p, dim, i));
        all_zero = all_zero && state[i] == 0.0f;
      }
      REQUIRE(state.back() == -9.0f);  // nothing written past the state
      REQUIRE(initial_state_is_zero(p) == all_zero);
    }
  }
}

TEST_CASE("a device budget places each row once, and a split chunk's rows at its second part",
          "[row]") {
  const uint32_t base_shift = 6;
  for (uint64_t budget : {0ull, 1ull, 63ull, 64ull, 100ull, 192ull, 1000ull}) {
    INFO("device_rows " << budget);
    // Every row of six chunks, in a record of one float: value = row id, wherever it lives.
    std::vector<std::vector<float>> device(6), host(6);
    ArenaRef arena{};
    arena.base_shift = base_shift;
    arena.dim = 1;
    arena.stride = 1;
    uint64_t on_device = 0;
    for (uint32_t c = 0; c < 6; ++c) {
      const ChunkPlacement p = place_chunk(c, base_shift, budget);
      REQUIRE(p.device_rows + p.host_rows == chunk_rows(c, base_shift));
      on_device += p.device_rows;
      device[c].resize(p.device_rows);
      host[c].resize(p.host_rows);
      if (p.device_rows != 0 && p.host_rows != 0) {
        REQUIRE(arena.split_chunk == static_cast<uint32_t>(kMaxChunks));  // one split at most
        arena.split_chunk = c;
        arena.split_offset = p.device_rows;
        arena.split_values = host[c].data();
      }
      arena.values[c] = p.device_rows != 0 ? device[c].data() : host[c].data();
    }
    const uint64_t rows = arena_capacity(6, base_shift);
    REQUIRE(on_device == (budget == 0 ? rows : std::min<uint64_t>(budget, rows)));
    for (uint64_t r = 0; r < rows; ++r) *arena.row(r) = static_cast<float>(r);
    uint64_t r = 0;
    for (uint32_t c = 0; c < 6; ++c) {
      for (float v : device[c]) REQUIRE(v == static_cast<float>(r++));
      for (float v : host[c]) REQUIRE(v == static_cast<float>(r++));
    }
    REQUIRE(r == rows);
    // The device's rows are the arena's first ones.
    for (uint64_t k = 0; k < on_device; ++k) {
      const ChunkPos p = chunk_of(k, base_shift);
      REQUIRE(arena.row(k) == device[p.chunk].data() + (p.offset));
    }
  }
}
