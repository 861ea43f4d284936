// Duplicate gradients of a row are summed by the blocked rule (cuda/row/grad_sum.h): checked
// through the C API on each backend against the rule written in the test, with runs from 1 to
// 40,000 occurrences; the same bits across runs and thread counts for skewed batches; and on
// CUDA, the same bits as the host backend in the same process.
#include "support/blocked_sum.hpp"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "support/backend.hpp"

using namespace embstore_test;

namespace {

// A batch whose key k occurs lengths[k] times, the occurrences interleaved at random, with
// gradients of wide magnitudes (so that the order of additions shows in the bits).
struct RunBatch {
  std::vector<int64_t> keys;
  std::vector<float> grads;
};

RunBatch interleaved_runs(const std::vector<uint32_t>& lengths, uint32_t dim, uint64_t seed) {
  std::mt19937_64 rng(seed);
  RunBatch b;
  for (size_t k = 0; k < lengths.size(); ++k) {
    b.keys.insert(b.keys.end(), lengths[k], static_cast<int64_t>(k) * 7919 - 100);
  }
  std::shuffle(b.keys.begin(), b.keys.end(), rng);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::uniform_real_distribution<float> scale(-8.0f, 8.0f);
  b.grads.resize(b.keys.size() * dim);
  for (float& x : b.grads) x = g(rng) * std::exp2(scale(rng));
  return b;
}

// The rows of key's occurrences, in batch order.
GradRows occurrences(const RunBatch& b, int64_t key, uint32_t dim) {
  GradRows rows;
  for (size_t i = 0; i < b.keys.size(); ++i) {
    if (b.keys[i] == key)
      rows.emplace_back(b.grads.begin() + i * dim, b.grads.begin() + (i + 1) * dim);
  }
  return rows;
}

embstore_table_config_t sgd_at_zero(uint32_t dim) {
  // SGD with learning rate 1 from zeros: a row's value after one update is 0 - summed gradient,
  // computed exactly, so the table shows the sum's bits.
  auto config = table_config("t", dim);
  config.optimizer = EMBSTORE_OPT_SGD;
  config.learning_rate = 1.0f;
  config.init = EMBSTORE_INIT_ZEROS;
  return config;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// A Zipf-like batch: key k (k >= 1) with weight k^-1.1 over `space` keys, plus fresh keys.
std::vector<int64_t> skewed_keys(size_t n, uint32_t space, std::mt19937_64& rng) {
  std::vector<double> weights(space);
  for (uint32_t k = 0; k < space; ++k) weights[k] = std::pow(k + 1.0, -1.1);
  std::discrete_distribution<uint32_t> pick(weights.begin(), weights.end());
  std::vector<int64_t> keys(n);
  for (auto& k : keys) k = static_cast<int64_t>(pick(rng)) * 104729 + 3;
  return keys;
}

}  // namespace

TEST_CASE("a row's duplicate gradients are summed by the blocked rule", "[optimizer][grad_sum]") {
  // Heights 1 to 4 of the summation tree, with the boundaries around 32 and 1024.
  const std::vector<uint32_t> lengths = {1, 2, 31, 32, 33, 64, 65, 100, 1024, 1025, 3000, 40000};
  for (uint32_t dim : {5u, 70u}) {
    CAPTURE(dim);
    StoreGuard store(make_store());
    embstore_table_t* t = make_table(store, sgd_at_zero(dim));
    RunBatch b = interleaved_runs(lengths, dim, dim);
    std::vector<int64_t> distinct;
    for (size_t k = 0; k < lengths.size(); ++k)
      distinct.push_back(static_cast<int64_t>(k) * 7919 - 100);
    lookup_ok(t, distinct);
    // Keys without a row are skipped wherever they fall in the batch.
    b.keys.insert(b.keys.begin() + 17, 999999);
    b.grads.insert(b.grads.begin() + 17 * dim, dim, 1e30f);
    b.keys.push_back(999998);
    b.grads.insert(b.grads.end(), dim, 1e30f);
    apply_ok(t, b.keys, b.grads);
    REQUIRE(stats(t).skipped_keys == 2);

    const auto got = lookup_ok(t, distinct, 0);
    size_t differs_from_one_by_one = 0;
    for (size_t k = 0; k < lengths.size(); ++k) {
      CAPTURE(lengths[k]);
      const GradRows rows = occurrences(b, distinct[k], dim);
      REQUIRE(rows.size() == lengths[k]);
      const std::vector<float> sum = blocked_sum(rows);
      std::vector<float> expected(dim), row(got.begin() + k * dim, got.begin() + (k + 1) * dim);
      for (uint32_t c = 0; c < dim; ++c) expected[c] = 0.0f - sum[c];
      REQUIRE(same_bits(row, expected));
      const std::vector<float> old = one_by_one_sum(rows);
      if (lengths[k] <= 32) {
        REQUIRE(same_bits(old, sum));  // short runs: the order of 0.4.0 and before
      } else if (!same_bits(old, sum)) {
        ++differs_from_one_by_one;
      }
    }
    // Under the one-by-one rule this test would fail: the long runs' bits differ.
    REQUIRE(differs_from_one_by_one >= 5);
  }
}

TEST_CASE("skewed batches update bit-identically across runs and thread counts",
          "[optimizer][grad_sum]") {
  const uint32_t dim = 40;
  std::mt19937_64 rng(23);
  std::vector<std::vector<int64_t>> batches;
  std::vector<std::vector<float>> grads;
  std::normal_distribution<float> g(0.0f, 1.0f);
  for (int step = 0; step < 4; ++step) {
    batches.push_back(skewed_keys(30000, 50000, rng));  // the hottest key: about 3,700 a batch
    grads.emplace_back(batches.back().size() * dim);
    for (float& x : grads.back()) x = g(rng);
  }
  std::vector<int64_t> probe;
  for (uint32_t k = 0; k < 3000; ++k) probe.push_back(static_cast<int64_t>(k) * 104729 + 3);

  for (embstore_optimizer_t opt :
       {EMBSTORE_OPT_ADAGRAD, EMBSTORE_OPT_ROWWISE_ADAGRAD, EMBSTORE_OPT_ADAM}) {
    CAPTURE(opt);
    auto config = table_config("t", dim);
    config.optimizer = opt;
    config.learning_rate = 0.01f;
    config.init = EMBSTORE_INIT_NORMAL;
    config.init_b = 0.05f;
    config.initial_capacity = 64;
    auto train = [&](embstore_store_t* store, bool on_host) {
      embstore_table_t* t = make_table(store, config);
      std::vector<float> out;
      for (size_t s = 0; s < batches.size(); ++s) {
        REQUIRE(embstore_step(store, s + 1) == EMBSTORE_OK);
        if (on_host) {  // a host store while the tested backend may be CUDA: host pointers
          out.resize(batches[s].size() * dim);
          REQUIRE(embstore_lookup(t, batches[s].data(), batches[s].size(), out.data(),
                                  EMBSTORE_LOOKUP_INSERT, nullptr) == EMBSTORE_OK);
          REQUIRE(embstore_apply_gradients(t, batches[s].data(), grads[s].data(), batches[s].size(),
                                           nullptr) == EMBSTORE_OK);
        } else {
          lookup_ok(t, batches[s]);
          apply_ok(t, batches[s], grads[s]);
        }
      }
      if (!on_host) return lookup_ok(t, probe, 0);
      out.resize(probe.size() * dim);
      REQUIRE(embstore_lookup(t, probe.data(), probe.size(), out.data(), 0, nullptr) ==
              EMBSTORE_OK);
      return out;
    };

    std::vector<float> first;
    for (int threads : {1, 2, 3, 1}) {
      CAPTURE(threads);
      StoreGuard store(make_store(threads));
      const auto got = train(store, false);
      if (first.empty()) {
        first = got;
      } else {
        REQUIRE(same_bits(got, first));
      }
    }
    // The host backend in the same process: on a CUDA run, the two backends agree bit for bit.
    embstore_store_config_t host_config;
    embstore_store_config_init(&host_config);
    host_config.backend = EMBSTORE_BACKEND_HOST;
    host_config.host_threads = 2;
    embstore_store_t* host = nullptr;
    REQUIRE(embstore_store_create(&host_config, &host) == EMBSTORE_OK);
    StoreGuard host_guard(host);
    REQUIRE(same_bits(train(host, true), first));
  }
}
