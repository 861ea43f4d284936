// The blocked rule that sums a row's duplicate gradients (cuda/row/grad_sum.h): its tree against
// the recursive definition (support/blocked_sum.hpp), the old one-by-one rule where they must agree
// and where they must not, and the scratch layout the CUDA kernel relies on.
#include "cuda/row/grad_sum.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "support/blocked_sum.hpp"

using namespace embstore::row;

namespace {

using embstore_test::blocked_sum;
using embstore_test::one_by_one_sum;
using Rows = embstore_test::GradRows;

std::vector<float> via_tree_sum(const Rows& x) {
  const uint32_t dim = static_cast<uint32_t>(x[0].size());
  const SumTree tree = SumTree::of(static_cast<uint32_t>(x.size()));
  std::vector<float> partials(size_t{tree.partials()} * dim, NAN), out(dim, NAN);
  size_t next = 0;
  tree_sum(
      tree, dim, [&] { return x.at(next++).data(); }, partials.data(), out.data());
  REQUIRE(next == x.size());  // every leaf read once, in order
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

Rows random_rows(size_t n, uint32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-6.0f, 6.0f);
  Rows x(n, std::vector<float>(dim));
  for (auto& row : x) {
    for (auto& v : row) v = g(rng) * std::exp2(scale(rng));  // wide magnitudes: rounding shows
  }
  return x;
}

}  // namespace

TEST_CASE("sum tree heights and node counts", "[row][grad_sum]") {
  REQUIRE(sum_tree_height(1) == 1);
  REQUIRE(sum_tree_height(32) == 1);
  REQUIRE(sum_tree_height(33) == 2);
  REQUIRE(sum_tree_height(1024) == 2);
  REQUIRE(sum_tree_height(1025) == 3);
  REQUIRE(sum_tree_height(32768) == 3);
  REQUIRE(sum_tree_height(32769) == 4);
  REQUIRE(sum_tree_height(0xFFFFFFFFull) <= kMaxSumHeight);
  for (uint32_t leaves :
       {1u, 2u, 31u, 32u, 33u, 64u, 65u, 1000u, 1024u, 1025u, 40000u, 0xFFFFFFFFu}) {
    CAPTURE(leaves);
    const SumTree t = SumTree::of(leaves);
    REQUIRE(t.nodes(0) == leaves);
    REQUIRE(t.nodes(t.height) == 1);
    REQUIRE((t.height == 1 || t.nodes(t.height - 1) > 1));
    for (uint32_t k = 1; k <= t.height; ++k) {
      if (t.nodes(k) > 100000) continue;  // the largest tree's lowest level: too many to walk
      uint64_t covered = 0;
      for (uint32_t i = 0; i < t.nodes(k); ++i) {
        const uint32_t c = t.children(k, i);
        REQUIRE(c >= 1);
        REQUIRE(c <= kSumFanIn);
        if (i + 1 < t.nodes(k)) REQUIRE(c == kSumFanIn);  // only the last node is short
        covered += c;
      }
      REQUIRE(covered == t.nodes(k - 1));
    }
  }
}

TEST_CASE("tree_sum is the blocked rule, bit for bit", "[row][grad_sum]") {
  for (uint32_t leaves :
       {1u, 2u, 5u, 31u, 32u, 33u, 63u, 64u, 65u, 100u, 1023u, 1024u, 1025u, 2049u, 33000u}) {
    for (uint32_t dim : {1u, 3u, 8u}) {
      CAPTURE(leaves, dim);
      const Rows x = random_rows(leaves, dim, leaves * 31 + dim);
      REQUIRE(same_bits(via_tree_sum(x), blocked_sum(x)));
    }
  }
}

TEST_CASE("up to 32 occurrences are summed one by one in batch order", "[row][grad_sum]") {
  for (uint32_t leaves = 1; leaves <= kSumFanIn; ++leaves) {
    CAPTURE(leaves);
    Rows x = random_rows(leaves, 4, leaves);
    x[0][0] = -0.0f;  // a first occurrence is taken as it is: -0 is not 0 + -0
    REQUIRE(same_bits(via_tree_sum(x), one_by_one_sum(x)));
  }
  const std::vector<float> single = via_tree_sum(Rows{{-0.0f}});
  REQUIRE(std::signbit(single[0]));
}

TEST_CASE("a long run is not summed one by one", "[row][grad_sum]") {
  // 1e8 then 63 ones: one by one, each 1 is lost to rounding (the float spacing at 1e8 is 8);
  // blocked, the second block's 32 ones reach 1e8 as one 32.
  Rows x(64, std::vector<float>{1.0f});
  x[0][0] = 1e8f;
  REQUIRE(one_by_one_sum(x)[0] == 1e8f);
  REQUIRE(via_tree_sum(x)[0] == 100000032.0f);
  REQUIRE(blocked_sum(x)[0] == 100000032.0f);
}

TEST_CASE("the blocked sum stays close to the exact sum", "[row][grad_sum]") {
  // Its error bound is that of a sum of depth height * 31 (instead of leaves - 1): check it
  // against float64 for long runs of same-sign and mixed-sign gradients.
  for (uint32_t leaves : {1000u, 40000u}) {
    for (bool mixed : {false, true}) {
      CAPTURE(leaves, mixed);
      std::mt19937_64 rng(leaves + mixed);
      std::uniform_real_distribution<float> u(mixed ? -1.0f : 0.0f, 1.0f);
      Rows x(leaves, std::vector<float>(1));
      double exact = 0, magnitude = 0;
      for (auto& r : x) {
        r[0] = u(rng);
        exact += r[0];
        magnitude += std::fabs(r[0]);
      }
      const double depth = SumTree::of(leaves).height * 31.0;
      const double bound = depth * std::ldexp(1.0, -24) * magnitude;
      REQUIRE(std::fabs(via_tree_sum(x)[0] - exact) <= bound);
      // One by one, the bound is leaves - 1 roundings: the blocked sum's is tighter.
      REQUIRE(depth < leaves - 1);
    }
  }
}

TEST_CASE("runs of a sorted batch never share scratch slots", "[row][grad_sum]") {
  // The CUDA kernel gives the run at sorted positions [first, first + L) the partial and
  // arrival slots sum_scratch_base(first) + index: they must stay below the next run's base and
  // within sum_scratch_slots(n).
  auto check_run = [](uint32_t first, uint32_t leaves) {
    const SumTree t = SumTree::of(leaves);
    const uint32_t next_base = sum_scratch_base(first + leaves);
    CAPTURE(first, leaves);
    REQUIRE(t.arrivals() <= t.partials());
    if (t.height == 1) {
      REQUIRE(t.partials() == 0);
      return;
    }
    REQUIRE(sum_scratch_base(first) + t.partials() <= next_base);
    REQUIRE(uint64_t{sum_scratch_base(first)} + t.partials() <=
            sum_scratch_slots(uint64_t{first} + leaves));
  };
  for (uint32_t first = 0; first < 48; ++first) {
    for (uint32_t leaves = 1; leaves <= 5000; ++leaves) check_run(first, leaves);
  }
  std::mt19937_64 rng(17);
  std::uniform_int_distribution<uint32_t> first(0, 1u << 30), leaves(5000, 1u << 30);
  for (int i = 0; i < 20000; ++i) check_run(first(rng), leaves(rng));
  // Every index of every level, for a few trees: partial and arrival indices are dense.
  for (uint32_t leaves : {33u, 1025u, 40000u}) {
    const SumTree t = SumTree::of(leaves);
    std::vector<int> partial(t.partials()), arrival(t.arrivals());
    for (uint32_t k = 1; k <= t.height; ++k) {
      for (uint32_t i = 0; i < t.nodes(k); ++i) {
        if (k < t.height) ++partial.at(t.partial_index(k, i));
        if (k >= 2) ++arrival.at(t.arrival_index(k, i));
      }
    }
    for (int c : partial) REQUIRE(c == 1);
    for (int c : arrival) REQUIRE(c == 1);
  }
}

TEST_CASE("the CUDA kernel's work items cover every level-1 node once", "[row][grad_sum]") {
  // As kernels/update.cuh hands out work: a warp per run takes node 0, a warp per tile of 32
  // sorted positions the later node that starts there (found as the kernel does: a run that
  // began within 32 positions before the tile has its second node there or none; else the
  // run is searched). Every node of every run must come out exactly once.
  std::mt19937_64 rng(41);
  std::uniform_int_distribution<int> kind(0, 9);
  for (int trial = 0; trial < 300; ++trial) {
    std::vector<uint32_t> rows, offsets;
    const int runs = 1 + trial % 40;
    for (int r = 0; r < runs; ++r) {
      const int k = kind(rng);
      const uint32_t len = k < 5 ? 1 + rng() % 4 : k < 8 ? 20 + rng() % 30 : 30 + rng() % 3000;
      offsets.push_back(static_cast<uint32_t>(rows.size()));
      rows.insert(rows.end(), len, static_cast<uint32_t>(r * 3));
    }
    const uint32_t n = static_cast<uint32_t>(rows.size());
    auto end_of = [&](size_t j) { return j + 1 < offsets.size() ? offsets[j + 1] : n; };
    std::map<std::pair<size_t, uint32_t>, int> seen;
    for (size_t j = 0; j < offsets.size(); ++j) ++seen[{j, 0}];
    for (uint32_t x = kSumFanIn; x < n; x += kSumFanIn) {
      if (rows[x - 1] != rows[x]) continue;
      const uint32_t before = x - kSumFanIn;
      if (rows[before] != rows[x]) {
        uint32_t first = before;
        while (rows[first] != rows[x]) ++first;
        const uint32_t second = first + kSumFanIn;
        if (second >= n || rows[second] != rows[x]) continue;
      }
      const size_t j = static_cast<size_t>(std::upper_bound(offsets.begin(), offsets.end(), x) -
                                           offsets.begin() - 1);
      const uint32_t node = later_node_in_tile(offsets[j], end_of(j), x);
      if (node != kNoNode) ++seen[{j, node}];
    }
    size_t expected = 0;
    for (size_t j = 0; j < offsets.size(); ++j) {
      const SumTree t = SumTree::of(end_of(j) - offsets[j]);
      for (uint32_t i = 0; i < t.nodes(1); ++i) {
        CAPTURE(trial, j, i);
        REQUIRE(seen[{j, i}] == 1);
      }
      expected += t.nodes(1);
    }
    REQUIRE(seen.size() == expected);
  }
}
