// Tables: find-or-insert, deterministic initializers, growth, max_capacity, dirty rows, stats.
#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cmath>
#include <numeric>
#include <random>
#include <thread>
#include <vector>

#include "support/backend.hpp"

using namespace embstore_test;

namespace {

std::vector<int64_t> iota_keys(size_t n, int64_t first = 0, int64_t stride = 1) {
  std::vector<int64_t> keys(n);
  for (size_t i = 0; i < n; ++i) keys[i] = first + static_cast<int64_t>(i) * stride;
  return keys;
}

// Row i of a lookup result.
std::vector<float> row_of(const std::vector<float>& values, size_t i, uint32_t dim) {
  return {values.begin() + i * dim, values.begin() + (i + 1) * dim};
}

}  // namespace

TEST_CASE("find-or-insert then find", "[table]") {
  StoreGuard store(make_store());
  const uint32_t dim = 8;
  embstore_table_t* t = make_table(store, table_config("t", dim));

  const auto keys = iota_keys(100, -50);
  const auto inserted = lookup_ok(t, keys);
  auto s = stats(t);
  REQUIRE(s.rows == 100);
  REQUIRE(s.inserted == 100);
  REQUIRE(s.dirty_rows == 100);
  REQUIRE(s.capacity >= 100);
  // Default init is uniform in [-0.01, 0.01] and not all equal.
  for (float v : inserted) REQUIRE((v >= -0.01f && v <= 0.01f));
  REQUIRE(std::adjacent_find(inserted.begin(), inserted.end(), std::not_equal_to<>()) !=
          inserted.end());

  // Found rows read the same with or without INSERT; nothing new is stored.
  REQUIRE(lookup_ok(t, keys, 0) == inserted);
  REQUIRE(lookup_ok(t, keys, EMBSTORE_LOOKUP_INSERT) == inserted);
  REQUIRE(stats(t).rows == 100);
}

TEST_CASE("lookup without INSERT reads zeros and stores nothing", "[table]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, table_config("t", 5));
  lookup_ok(t, {1, 2});
  const auto out = lookup_ok(t, {1, 999, 2, -7}, 0);
  REQUIRE(row_of(out, 1, 5) == std::vector<float>(5, 0.0f));
  REQUIRE(row_of(out, 3, 5) == std::vector<float>(5, 0.0f));
  REQUIRE(row_of(out, 0, 5) != std::vector<float>(5, 0.0f));
  REQUIRE(stats(t).rows == 2);
  REQUIRE(stats(t).dirty_rows == 2);
}

TEST_CASE("duplicate keys in one lookup get one row", "[table]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, table_config("t", 4));
  const auto out = lookup_ok(t, {7, 7, 3, 7, 3});
  REQUIRE(stats(t).rows == 2);
  REQUIRE(stats(t).inserted == 2);
  REQUIRE(row_of(out, 0, 4) == row_of(out, 1, 4));
  REQUIRE(row_of(out, 0, 4) == row_of(out, 3, 4));
  REQUIRE(row_of(out, 2, 4) == row_of(out, 4, 4));
  REQUIRE(row_of(out, 0, 4) != row_of(out, 2, 4));
}

TEST_CASE("initial values depend only on seed, key and column", "[table][init]") {
  const embstore_init_t kinds[] = {EMBSTORE_INIT_UNIFORM, EMBSTORE_INIT_NORMAL};
  for (embstore_init_t kind : kinds) {
    CAPTURE(kind);
    StoreGuard store(make_store());
    auto config = table_config("a", 16);
    config.init = kind;
    config.init_a = 0.0f;
    config.init_b = 1.0f;
    config.seed = 42;
    config.initial_capacity = 64;
    embstore_table_t* a = make_table(store, config);
    config.name = "b";
    embstore_table_t* b = make_table(store, config);
    config.name = "c";
    config.seed = 43;
    embstore_table_t* c = make_table(store, config);

    auto keys = iota_keys(3000, -1500, 7919);
    const auto in_order = lookup_ok(a, keys);
    // b: reversed, in uneven batches, with duplicates, across growth.
    auto shuffled = keys;
    std::mt19937_64 rng(1);
    std::shuffle(shuffled.begin(), shuffled.end(), rng);
    for (size_t i = 0; i < shuffled.size(); i += 333) {
      std::vector<int64_t> part(shuffled.begin() + i,
                                shuffled.begin() + std::min(shuffled.size(), i + 333));
      part.push_back(part.front());
      lookup_ok(b, part);
    }
    REQUIRE(lookup_ok(b, keys, 0) == in_order);
    REQUIRE(lookup_ok(c, keys) != in_order);
    // Columns of one row differ.
    REQUIRE(in_order[0] != in_order[1]);
  }
}

TEST_CASE("initializer distributions", "[table][init]") {
  StoreGuard store(make_store());
  const uint32_t dim = 32;
  const auto keys = iota_keys(4000, 1);

  auto moments = [&](const std::vector<float>& v) {
    double sum = 0, sq = 0;
    for (float x : v) sum += x;
    const double mean = sum / v.size();
    for (float x : v) sq += (x - mean) * (x - mean);
    return std::pair<double, double>(mean, std::sqrt(sq / v.size()));
  };

  auto config = table_config("normal", dim);
  config.init = EMBSTORE_INIT_NORMAL;
  config.init_a = 0.5f;
  config.init_b = 2.0f;
  const auto [nmean, nstd] = moments(lookup_ok(make_table(store, config), keys));
  REQUIRE(nmean == Approx(0.5).margin(0.05));
  REQUIRE(nstd == Approx(2.0).epsilon(0.02));

  config = table_config("uniform", dim);
  config.init = EMBSTORE_INIT_UNIFORM;
  config.init_a = -3.0f;
  config.init_b = 1.0f;
  const auto uniform = lookup_ok(make_table(store, config), keys);
  for (float v : uniform) REQUIRE((v >= -3.0f && v <= 1.0f));
  const auto [umean, ustd] = moments(uniform);
  REQUIRE(umean == Approx(-1.0).margin(0.03));
  REQUIRE(ustd == Approx(4.0 / std::sqrt(12.0)).epsilon(0.02));

  config = table_config("constant", 3);
  config.init = EMBSTORE_INIT_CONSTANT;
  config.init_a = 0.25f;
  REQUIRE(lookup_ok(make_table(store, config), {5, 6}) == std::vector<float>(6, 0.25f));

  config = table_config("zeros", 3);
  config.init = EMBSTORE_INIT_ZEROS;
  REQUIRE(lookup_ok(make_table(store, config), {5, 6}) == std::vector<float>(6, 0.0f));
}

TEST_CASE("tables grow without losing rows", "[table]") {
  StoreGuard store(make_store());
  const uint32_t dim = 4;
  auto config = table_config("small", dim);
  config.initial_capacity = 64;
  embstore_table_t* small = make_table(store, config);
  config.name = "big";
  config.initial_capacity = 1 << 17;
  embstore_table_t* big = make_table(store, config);
  REQUIRE(stats(small).capacity < 1000);

  const auto keys = iota_keys(100000, 1LL << 40, 3);
  for (size_t i = 0; i < keys.size(); i += 10000) {
    lookup_ok(small, std::vector<int64_t>(keys.begin() + i, keys.begin() + i + 10000));
  }
  const auto s = stats(small);
  REQUIRE(s.rows == 100000);
  REQUIRE(s.capacity >= 100000);
  REQUIRE(lookup_ok(small, keys, 0) == lookup_ok(big, keys));
}

TEST_CASE("max_capacity: all or nothing", "[table]") {
  StoreGuard store(make_store());
  auto config = table_config("t", 2);
  config.initial_capacity = 64;
  config.max_capacity = 100;
  embstore_table_t* t = make_table(store, config);
  lookup_ok(t, iota_keys(90));

  // 5 existing, 20 new (with duplicates): 110 > 100.
  std::vector<int64_t> batch = iota_keys(5, 85);
  for (int64_t k : iota_keys(20, 1000)) {
    batch.push_back(k);
    batch.push_back(k);
  }
  std::vector<float> out;
  REQUIRE(lookup(t, batch, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
  REQUIRE(std::string(embstore_last_error()).find("max_capacity") != std::string::npos);
  auto s = stats(t);
  REQUIRE(s.rows == 90);
  REQUIRE(s.inserted == 90);
  REQUIRE(lookup_ok(t, {1000, 1019}, 0) == std::vector<float>(4, 0.0f));

  // Exactly to the bound is fine, one more is not.
  lookup_ok(t, iota_keys(10, 1000));
  REQUIRE(stats(t).rows == 100);
  REQUIRE(lookup(t, {5000}, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
  lookup_ok(t, iota_keys(90));  // existing keys still work at the bound
  lookup_ok(t, iota_keys(10, 1000));
  REQUIRE(stats(t).rows == 100);
}

TEST_CASE("gradients for keys without a row are skipped and counted", "[table]") {
  StoreGuard store(make_store());
  auto config = table_config("t", 2);
  config.optimizer = EMBSTORE_OPT_SGD;
  config.learning_rate = 1.0f;
  config.init = EMBSTORE_INIT_ZEROS;
  embstore_table_t* t = make_table(store, config);
  lookup_ok(t, {1, 2});
  apply_ok(t, {1, 77, 2, 78, 77}, {1, 1, 5, 5, 2, 2, 6, 6, 7, 7});
  const auto s = stats(t);
  REQUIRE(s.skipped_keys == 3);
  REQUIRE(s.rows == 2);
  REQUIRE(lookup_ok(t, {1, 2, 77}, 0) == std::vector<float>{-1, -1, -2, -2, 0, 0});
}

TEST_CASE("dirty rows are exactly the inserted and updated rows", "[table]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, table_config("t", 3));
  REQUIRE(stats(t).dirty_rows == 0);
  lookup_ok(t, {10, 11, 12, 13}, 0);  // reads store nothing
  REQUIRE(stats(t).dirty_rows == 0);
  apply_ok(t, {10}, {1, 1, 1});  // no row: skipped, nothing dirty
  REQUIRE(stats(t).dirty_rows == 0);
  lookup_ok(t, {10, 11, 12});
  REQUIRE(stats(t).dirty_rows == 3);
  apply_ok(t, {10, 10, 12}, std::vector<float>(9, 0.5f));
  REQUIRE(stats(t).dirty_rows == 3);
  lookup_ok(t, {13});
  REQUIRE(stats(t).dirty_rows == 4);
}

TEST_CASE("tables of one store work from several threads", "[table]") {
  StoreGuard store(make_store());
  embstore_table_t* a = make_table(store, table_config("a", 8));
  embstore_table_t* b = make_table(store, table_config("b", 8));
  // Catch2's assertions are not thread-safe: workers count failures instead.
  std::atomic<int> failures{0};
  auto work = [&failures](embstore_table_t* t, int64_t base) {
    for (int i = 0; i < 20; ++i) {
      const auto keys = iota_keys(500, base + i * 100);
      std::vector<float> out;
      if (lookup(t, keys, EMBSTORE_LOOKUP_INSERT, &out) != EMBSTORE_OK) ++failures;
      if (apply_gradients(t, keys, std::vector<float>(keys.size() * 8, 0.1f)) != EMBSTORE_OK) {
        ++failures;
      }
    }
  };
  std::thread ta(work, a, 0), tb(work, b, 1 << 20), tc(work, a, 5000);
  ta.join();
  tb.join();
  tc.join();
  REQUIRE(failures == 0);
  REQUIRE(stats(b).rows == 500 + 19 * 100);
  REQUIRE(stats(a).rows > 500 + 19 * 100);
}
