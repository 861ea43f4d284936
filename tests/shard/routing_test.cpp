// The sharded calls' plans (host/shard/routing.hpp), with the exchange simulated in one
// process: W ranks' batches routed to the owners and back. The determinism the sharded
// gradient call promises follows from the plan alone, so it is checked here, bit for bit.
#include "host/shard/routing.hpp"

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "cuda/row/shard.h"

using namespace embstore;

namespace {

// A batch with many repeats, negative keys and keys of every owner.
std::vector<int64_t> batch_of(uint32_t rank, size_t n) {
  std::mt19937_64 rng(1234 + rank);
  std::vector<int64_t> keys(n);
  for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 300) - 100;
  return keys;
}

}  // namespace

TEST_CASE("dedupe keeps first occurrences and maps every position", "[shard]") {
  const std::vector<int64_t> keys = {5, -3, 5, 7, -3, -3, 9};
  const shard::Dedupe d = shard::dedupe(keys.data(), keys.size());
  REQUIRE(d.keys == std::vector<int64_t>{5, -3, 7, 9});
  for (size_t i = 0; i < keys.size(); ++i) REQUIRE(d.keys[d.slot_of[i]] == keys[i]);
  REQUIRE(shard::dedupe(nullptr, 0).keys.empty());
}

TEST_CASE("route groups a batch by owner, in batch order", "[shard]") {
  for (const uint32_t world : {1u, 2u, 3u, 4u, 7u}) {
    INFO("world " << world);
    const std::vector<int64_t> keys = batch_of(0, 1000);
    const shard::Route r = shard::route(keys.data(), keys.size(), world);
    REQUIRE(r.offsets.front() == 0);
    REQUIRE(r.offsets.back() == keys.size());
    std::vector<int> seen(keys.size(), 0);
    for (uint32_t w = 0; w < world; ++w) {
      REQUIRE(r.offsets[w + 1] - r.offsets[w] == r.counts[w]);
      for (uint64_t j = r.offsets[w]; j < r.offsets[w + 1]; ++j) {
        REQUIRE(row::shard_of(keys[r.order[j]], world) == w);
        if (j > r.offsets[w]) REQUIRE(r.order[j - 1] < r.order[j]);  // batch order
        ++seen[r.order[j]];
      }
    }
    REQUIRE(seen == std::vector<int>(keys.size(), 1));  // a permutation
  }
}

TEST_CASE("a sharded lookup returns each position its key's row", "[shard]") {
  const uint32_t world = 3;
  const std::vector<int64_t> keys = batch_of(1, 500);
  const shard::Dedupe d = shard::dedupe(keys.data(), keys.size());
  const shard::Route r = shard::route(d.keys.data(), d.keys.size(), world);
  // Each owner answers its keys in the order received: the row of key k is k * 0.5.
  std::vector<float> rows_back(r.order.size());
  for (size_t j = 0; j < r.order.size(); ++j) rows_back[j] = d.keys[r.order[j]] * 0.5f;
  const std::vector<uint32_t> at = shard::gather_order(r, d.slot_of);
  for (size_t i = 0; i < keys.size(); ++i) REQUIRE(rows_back[at[i]] == keys[i] * 0.5f);
}

TEST_CASE("sharded gradient sums are bit-identical to one process on the concatenated batches",
          "[shard]") {
  for (const uint32_t world : {1u, 2u, 3u, 4u}) {
    INFO("world " << world);
    std::vector<std::vector<int64_t>> keys(world);
    std::vector<std::vector<float>> grads(world);
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (uint32_t w = 0; w < world; ++w) {
      keys[w] = batch_of(w, 400);
      for (size_t i = 0; i < keys[w].size(); ++i) grads[w].push_back(u(rng) * (1 + i % 7 * 1e3f));
    }
    // One process: a left fold of each key's gradients over the batches concatenated in rank
    // order.
    std::map<int64_t, float> expected;
    for (uint32_t w = 0; w < world; ++w) {
      for (size_t i = 0; i < keys[w].size(); ++i) expected[keys[w][i]] += grads[w][i];
    }
    // Sharded: each rank routes every occurrence; each owner folds what it receives, the
    // segments in rank order (the all-to-all's receive layout).
    // Each owner keeps its own sums: a key must reach exactly the owner shard_of names.
    std::map<int64_t, float> got;
    size_t misrouted = 0;
    for (uint32_t owner = 0; owner < world; ++owner) {
      std::map<int64_t, float> mine;
      for (uint32_t w = 0; w < world; ++w) {
        const shard::Route r = shard::route(keys[w].data(), keys[w].size(), world);
        for (uint64_t j = r.offsets[owner]; j < r.offsets[owner + 1]; ++j) {
          mine[keys[w][r.order[j]]] += grads[w][r.order[j]];
        }
      }
      for (const auto& [key, sum] : mine) {
        misrouted += row::shard_of(key, world) != owner || got.count(key) != 0;
        got[key] = sum;
      }
    }
    REQUIRE(misrouted == 0);
    REQUIRE(got.size() == expected.size());
    for (const auto& [key, sum] : expected) {
      INFO("key " << key);
      REQUIRE(std::memcmp(&got[key], &sum, sizeof sum) == 0);
    }
  }
}
