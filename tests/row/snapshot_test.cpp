// White-box tests of the snapshot bit operations (cuda/row/snapshot.h): capture of full and
// incremental checkpoints, the rows of the last word, freed rows left out, a failed snapshot
// putting its rows back, each captured row taken exactly once by concurrent takers, and the
// staging record's layout.
#include "cuda/row/snapshot.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstring>
#include <thread>
#include <vector>

#include "cuda/row/bitmap.h"

using namespace embstore::row;

TEST_CASE("live_mask covers the rows handed out, word by word", "[row][snapshot]") {
  REQUIRE(live_mask(0, 0) == 0);
  REQUIRE(live_mask(0, 1) == 1);
  REQUIRE(live_mask(0, 64) == ~uint64_t{0});
  REQUIRE(live_mask(0, 65) == ~uint64_t{0});
  REQUIRE(live_mask(1, 65) == 1);
  REQUIRE(live_mask(1, 64) == 0);
  REQUIRE(live_mask(2, 130) == 3);
}

TEST_CASE("capture takes every live row or the dirty ones, and clears dirty", "[row][snapshot]") {
  const uint64_t rows = 100;  // two words, the second with 36 rows
  std::vector<uint64_t> dirty(2), captured(2, 0xdeadbeef);
  bitmap_set<false>(dirty.data(), 3);
  bitmap_set<false>(dirty.data(), 70);
  SECTION("incremental: the dirty rows") {
    REQUIRE(capture_word(false, dirty.data(), captured.data(), 0, rows) == uint64_t{1} << 3);
    REQUIRE(capture_word(false, dirty.data(), captured.data(), 1, rows) == uint64_t{1} << 6);
    REQUIRE(captured[0] == uint64_t{1} << 3);
  }
  SECTION("full: every live row, but freed ones") {
    const uint64_t freed0 = uint64_t{1} << 5;
    REQUIRE(capture_word(true, dirty.data(), captured.data(), 0, rows, freed0) == ~freed0);
    REQUIRE(capture_word(true, dirty.data(), captured.data(), 1, rows) == (uint64_t{1} << 36) - 1);
  }
  REQUIRE(dirty[0] == 0);  // changes from here on are the next checkpoint's
  REQUIRE(dirty[1] == 0);
}

TEST_CASE("a failed snapshot makes its live rows dirty again", "[row][snapshot]") {
  std::vector<uint64_t> dirty = {uint64_t{1} << 1}, snapshot = {0b1100};
  restore_dirty_word(dirty.data(), snapshot.data(), 0, /*freed=*/0b1000);
  REQUIRE(dirty[0] == 0b0110);  // row 3 was evicted meanwhile: its tombstone covers it
}

TEST_CASE("a captured row is taken exactly once", "[row][snapshot]") {
  std::vector<uint64_t> captured = {0b1010};
  REQUIRE(take_captured<false>(captured.data(), 1));
  REQUIRE_FALSE(take_captured<false>(captured.data(), 1));
  REQUIRE_FALSE(take_captured<false>(captured.data(), 0));
  REQUIRE(captured[0] == 0b1000);
  // take_captured_rows takes the lowest rows, at most max_rows.
  std::vector<uint64_t> word = {0b10110110};
  REQUIRE(take_captured_rows(word.data(), 0, 2) == 0b110);
  REQUIRE(take_captured_rows(word.data(), 0, 10) == 0b10110000);
  REQUIRE(word[0] == 0);
  REQUIRE(take_captured_rows(word.data(), 0, 10) == 0);
}

TEST_CASE("drain and copy-on-write racing take every row once between them", "[row][snapshot]") {
  // Drain takes rows word by word; copy-on-write threads take single rows: as on the host
  // backend, where both run at once.
  const uint64_t rows = 64 * 256;
  std::vector<uint64_t> captured(rows / 64, ~uint64_t{0});
  std::vector<std::atomic<int>> taken(rows);
  std::thread drain([&] {
    for (uint64_t w = 0; w < captured.size(); ++w) {
      for (;;) {
        const uint64_t got = take_captured_rows(captured.data(), w, 5);
        if (got == 0) break;
        for (uint64_t b = 0; b < 64; ++b) {
          if (got >> b & 1) taken[w * 64 + b].fetch_add(1);
        }
      }
    }
  });
  std::vector<std::thread> writers;
  for (int t = 0; t < 3; ++t) {
    writers.emplace_back([&, t] {
      for (uint64_t r = t; r < rows; r += 3) {
        if (take_captured<true>(captured.data(), r)) taken[r].fetch_add(1);
      }
    });
  }
  drain.join();
  for (std::thread& w : writers) w.join();
  for (uint64_t r = 0; r < rows; ++r) {
    INFO("row " << r);
    REQUIRE(taken[r].load() == 1);
  }
}

TEST_CASE("a staging record is the key then the row, 8-byte aligned", "[row][snapshot]") {
  REQUIRE(record_bytes(1) == 16);  // 8 + 4, padded
  REQUIRE(record_bytes(2) == 16);
  REQUIRE(record_bytes(3) == 24);
  const float row[3] = {1.5f, -2.0f, 3.25f};
  char record[24] = {};
  write_record(record, -42, row, 3);
  int64_t key = 0;
  std::memcpy(&key, record, 8);
  REQUIRE(key == -42);
  REQUIRE(std::memcmp(record + 8, row, sizeof row) == 0);
}

// The CUDA kernels write records with a tile of lanes per record (write_record_part) and move
// them with move_record_part: every lane count must give write_record's bytes, with the padding
// zeroed, whether the row starts 8-byte aligned (wide words) or not (floats).
TEST_CASE("a record written by a tile of lanes equals write_record's", "[row][snapshot]") {
  for (uint32_t stride : {1u, 2u, 3u, 7u, 8u, 64u, 65u, 128u}) {
    for (uint32_t misalign : {0u, 1u}) {  // the row at an 8-byte boundary, or 4 bytes past it
      std::vector<float> storage(stride + 2);
      for (uint32_t c = 0; c < storage.size(); ++c) storage[c] = 0.5f * static_cast<float>(c) - 3;
      // A float vector's data is at least 8-byte aligned on this platform.
      REQUIRE(reinterpret_cast<uintptr_t>(storage.data()) % 8 == 0);
      const float* row = storage.data() + misalign;
      const uint64_t size = record_bytes(stride);
      std::vector<uint64_t> expected_words(size / 8, 0), got_words(size / 8);
      char* expected = reinterpret_cast<char*>(expected_words.data());
      write_record(expected, -7, row, stride);
      for (uint32_t lanes : {1u, 2u, 4u, 8u, 32u}) {
        CAPTURE(stride, misalign, lanes);
        std::fill(got_words.begin(), got_words.end(), ~uint64_t{0});  // padding must be cleared
        char* got = reinterpret_cast<char*>(got_words.data());
        for (uint32_t lane = 0; lane < lanes; ++lane) {
          write_record_part(got, -7, row, stride, lane, lanes);
        }
        REQUIRE(std::memcmp(got, expected, size) == 0);
        std::vector<uint64_t> moved(size / 8, 0);
        for (uint32_t lane = 0; lane < lanes; ++lane) {
          move_record_part(reinterpret_cast<char*>(moved.data()), got, size, lane, lanes);
        }
        REQUIRE(moved == expected_words);
      }
    }
  }
}
