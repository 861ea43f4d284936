// Fused optimizers against a straightforward reference written here, duplicate keys, and
// bit-identical results across runs and thread counts.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "support/backend.hpp"

using namespace embstore_test;

namespace {

// The textbook update of one row with gradient g (duplicates already summed), in double.
struct RefRow {
  std::vector<double> w, a, m, v;
  double row_acc = 0, b1_power = 1, b2_power = 1;
};

void ref_update(const embstore_table_config_t& c, RefRow& r, const std::vector<double>& grad) {
  const size_t dim = r.w.size();
  std::vector<double> g(dim);
  for (size_t i = 0; i < dim; ++i) g[i] = grad[i] + c.weight_decay * r.w[i];
  switch (c.optimizer) {
    case EMBSTORE_OPT_SGD:
      for (size_t i = 0; i < dim; ++i) r.w[i] -= c.learning_rate * g[i];
      break;
    case EMBSTORE_OPT_ADAGRAD:
      for (size_t i = 0; i < dim; ++i) {
        r.a[i] += g[i] * g[i];
        r.w[i] -= c.learning_rate * g[i] / (std::sqrt(r.a[i]) + c.epsilon);
      }
      break;
    case EMBSTORE_OPT_ROWWISE_ADAGRAD: {
      double mean_sq = 0;
      for (size_t i = 0; i < dim; ++i) mean_sq += g[i] * g[i];
      r.row_acc += mean_sq / dim;
      for (size_t i = 0; i < dim; ++i) {
        r.w[i] -= c.learning_rate * g[i] / (std::sqrt(r.row_acc) + c.epsilon);
      }
      break;
    }
    case EMBSTORE_OPT_ADAM:
      r.b1_power *= c.beta1;
      r.b2_power *= c.beta2;
      for (size_t i = 0; i < dim; ++i) {
        r.m[i] = c.beta1 * r.m[i] + (1 - c.beta1) * g[i];
        r.v[i] = c.beta2 * r.v[i] + (1 - c.beta2) * g[i] * g[i];
        const double m_hat = r.m[i] / (1 - r.b1_power);
        const double v_hat = r.v[i] / (1 - r.b2_power);
        r.w[i] -= c.learning_rate * m_hat / (std::sqrt(v_hat) + c.epsilon);
      }
      break;
  }
}

// Batches over a small key space so duplicates are common; gradients of both signs.
struct Workload {
  std::vector<std::vector<int64_t>> keys;
  std::vector<std::vector<float>> grads;
};

Workload make_workload(uint32_t dim, int batches, int batch_size, int key_space, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> key(0, key_space - 1);
  std::normal_distribution<float> grad(0.0f, 1.0f);
  Workload w;
  for (int b = 0; b < batches; ++b) {
    std::vector<int64_t> k(batch_size);
    for (auto& x : k) x = static_cast<int64_t>(key(rng)) * 1000003 - 77;
    std::vector<float> g(size_t{dim} * batch_size);
    for (auto& x : g) x = grad(rng);
    w.keys.push_back(std::move(k));
    w.grads.push_back(std::move(g));
  }
  return w;
}

// Trains a fresh table on the workload: lookup with INSERT, then gradients, each batch.
std::vector<float> train(embstore_store_t* store, const embstore_table_config_t& config,
                         const Workload& w, const std::vector<int64_t>& probe) {
  embstore_table_t* t = make_table(store, config);
  for (size_t b = 0; b < w.keys.size(); ++b) {
    REQUIRE(embstore_step(store, b + 1) == EMBSTORE_OK);
    lookup_ok(t, w.keys[b]);
    apply_ok(t, w.keys[b], w.grads[b]);
  }
  return lookup_ok(t, probe, 0);
}

const char* opt_name(embstore_optimizer_t o) {
  switch (o) {
    case EMBSTORE_OPT_SGD:
      return "sgd";
    case EMBSTORE_OPT_ADAGRAD:
      return "adagrad";
    case EMBSTORE_OPT_ROWWISE_ADAGRAD:
      return "rowwise_adagrad";
    case EMBSTORE_OPT_ADAM:
      return "adam";
  }
  return "?";
}

const embstore_optimizer_t kOptimizers[] = {EMBSTORE_OPT_SGD, EMBSTORE_OPT_ADAGRAD,
                                            EMBSTORE_OPT_ROWWISE_ADAGRAD, EMBSTORE_OPT_ADAM};

}  // namespace

TEST_CASE("each optimizer matches the reference", "[optimizer]") {
  for (embstore_optimizer_t opt : kOptimizers) {
    for (uint32_t dim : {1u, 37u, 64u}) {
      for (float wd : {0.0f, 0.01f}) {
        CAPTURE(opt_name(opt), dim, wd);
        StoreGuard store(make_store());
        auto config = table_config("t", dim);
        config.optimizer = opt;
        config.learning_rate = 0.05f;
        config.epsilon = 1e-6f;
        config.weight_decay = wd;
        config.initial_accumulator = 0.1f;
        config.init = EMBSTORE_INIT_NORMAL;
        config.init_b = 0.1f;
        embstore_table_t* t = make_table(store, config);
        const Workload w = make_workload(dim, 12, 64, 40, 7 + dim);

        std::map<int64_t, RefRow> ref;
        for (size_t b = 0; b < w.keys.size(); ++b) {
          const auto& keys = w.keys[b];
          const auto initial = lookup_ok(t, keys);
          for (size_t i = 0; i < keys.size(); ++i) {
            if (ref.count(keys[i])) continue;
            RefRow r;
            r.w.assign(initial.begin() + i * dim, initial.begin() + (i + 1) * dim);
            r.a.assign(dim, config.initial_accumulator);
            r.m.assign(dim, 0.0);
            r.v.assign(dim, 0.0);
            r.row_acc = config.initial_accumulator;
            ref.emplace(keys[i], std::move(r));
          }
          apply_ok(t, keys, w.grads[b]);
          // The reference sums duplicates, then updates each row once.
          std::map<int64_t, std::vector<double>> summed;
          for (size_t i = 0; i < keys.size(); ++i) {
            auto& s = summed[keys[i]];
            s.resize(dim, 0.0);
            for (uint32_t c = 0; c < dim; ++c) s[c] += w.grads[b][i * dim + c];
          }
          for (auto& [key, g] : summed) ref_update(config, ref.at(key), g);
        }

        std::vector<int64_t> probe;
        for (auto& [key, r] : ref) probe.push_back(key);
        const auto got = lookup_ok(t, probe, 0);
        size_t i = 0;
        for (auto& [key, r] : ref) {
          for (uint32_t c = 0; c < dim; ++c, ++i) {
            CAPTURE(key, c);
            REQUIRE(got[i] == Approx(r.w[c]).epsilon(1e-4).margin(1e-5));
          }
        }
        const auto s = stats(t);
        REQUIRE(s.rows == ref.size());
        REQUIRE(s.dirty_rows == ref.size());
      }
    }
  }
}

TEST_CASE("duplicate gradients are summed before one update", "[optimizer]") {
  // Adagrad makes the difference visible: one update with g1+g2 is not two updates.
  StoreGuard store(make_store());
  auto config = table_config("t", 2);
  config.optimizer = EMBSTORE_OPT_ADAGRAD;
  config.learning_rate = 1.0f;
  config.epsilon = 0.0f;
  config.initial_accumulator = 1.0f;
  config.init = EMBSTORE_INIT_ZEROS;
  embstore_table_t* t = make_table(store, config);
  lookup_ok(t, {5});
  apply_ok(t, {5, 5, 5}, {1, 0, 2, 0, -1, 4});
  // g = (2, 4); a = 1 + g^2 = (5, 17); w = -g / sqrt(a)
  const auto got = lookup_ok(t, {5}, 0);
  REQUIRE(got[0] == Approx(-2.0 / std::sqrt(5.0)).epsilon(1e-6));
  REQUIRE(got[1] == Approx(-4.0 / std::sqrt(17.0)).epsilon(1e-6));
}

TEST_CASE("adam bias correction counts each row's own updates", "[optimizer]") {
  StoreGuard store(make_store());
  auto config = table_config("t", 1);
  config.optimizer = EMBSTORE_OPT_ADAM;
  config.learning_rate = 0.1f;
  config.epsilon = 1e-8f;
  config.init = EMBSTORE_INIT_ZEROS;
  embstore_table_t* t = make_table(store, config);
  lookup_ok(t, {1, 2});
  for (int i = 0; i < 5; ++i) apply_ok(t, {1}, {1.0f});
  apply_ok(t, {2}, {1.0f});
  // A row's first Adam step with a constant gradient moves it by lr (m_hat/sqrt(v_hat) = 1),
  // whatever other rows did before.
  const auto got = lookup_ok(t, {1, 2}, 0);
  REQUIRE(got[1] == Approx(-0.1).epsilon(1e-5));
  REQUIRE(got[0] == Approx(-0.5).epsilon(1e-4));
}

TEST_CASE("updates are bit-identical across runs and thread counts", "[optimizer]") {
  for (embstore_optimizer_t opt : kOptimizers) {
    CAPTURE(opt_name(opt));
    const uint32_t dim = 48;
    auto config = table_config("t", dim);
    config.optimizer = opt;
    config.init = EMBSTORE_INIT_NORMAL;
    config.init_b = 0.05f;
    config.weight_decay = 0.001f;
    config.initial_capacity = 64;  // growth happens during training
    // Big enough batches that the host backend splits them across threads.
    const Workload w = make_workload(dim, 6, 20000, 30000, 99);
    std::vector<int64_t> probe;
    for (int k = 0; k < 30000; k += 7) probe.push_back(static_cast<int64_t>(k) * 1000003 - 77);

    std::vector<float> first;
    for (int threads : {1, 2, 3, 1}) {
      CAPTURE(threads);
      StoreGuard store(make_store(threads));
      const auto got = train(store, config, w, probe);
      if (first.empty()) {
        first = got;
        continue;
      }
      REQUIRE(got.size() == first.size());
      REQUIRE(std::memcmp(got.data(), first.data(), got.size() * sizeof(float)) == 0);
    }
  }
}
