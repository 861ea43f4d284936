// The slots of exact admission counts that the CUDA backend updates concurrently
// (cuda/row/admission.h): their states, saturation, and the serial placement the host's
// rebuilds and loads use.
#include <catch2/catch.hpp>
#include <random>
#include <set>
#include <vector>

#include "cuda/row/admission.h"

using namespace embstore::row;

TEST_CASE("admission counts saturate below the slot states", "[row][admission]") {
  REQUIRE(admit_increment(1) == 2);
  REQUIRE(admit_increment(kAdmitMaxCount - 1) == kAdmitMaxCount);
  REQUIRE(admit_increment(kAdmitMaxCount) == kAdmitMaxCount);  // never locked or gone
  REQUIRE(admit_live(1));
  REQUIRE(admit_live(kAdmitMaxCount));
  REQUIRE_FALSE(admit_live(kAdmitEmpty));
  REQUIRE_FALSE(admit_live(kAdmitLocked));
  REQUIRE_FALSE(admit_live(kAdmitGone));
}

TEST_CASE("placed admission slots are found by probing from their home", "[row][admission]") {
  const uint64_t slots = 1024;
  std::vector<AdmitSlot> table(slots, AdmitSlot{});
  std::mt19937_64 rng(5);
  std::set<int64_t> keys;
  while (keys.size() < slots / 2) keys.insert(static_cast<int64_t>(rng()));  // half full
  uint32_t count = 1;
  for (const int64_t k : keys) admit_place(table.data(), slots - 1, AdmitSlot{k, count++, 0, 7});
  count = 1;
  for (const int64_t k : keys) {
    uint64_t s = admit_home(k, slots - 1);
    while (table[s].count != kAdmitEmpty && table[s].key != k) s = (s + 1) & (slots - 1);
    REQUIRE(table[s].key == k);
    REQUIRE(table[s].count == count++);
    REQUIRE(table[s].step == 7);
  }
  size_t used = 0;
  for (const AdmitSlot& s : table) used += s.count != kAdmitEmpty;
  REQUIRE(used == keys.size());
}
