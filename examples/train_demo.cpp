// A small synthetic training loop through the C API: two embedding tables, Zipf-distributed
// feature ids, and a toy objective (pull each embedding towards a fixed per-key target) whose
// loss must fall. Runs on the default backend (CUDA where a device is usable, else host).
#include <embstore/embstore.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <vector>

#if defined(EMBSTORE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace {

void check(embstore_status_t st, const char* what) {
  if (st == EMBSTORE_OK) return;
  std::fprintf(stderr, "%s failed: %s: %s\n", what, embstore_status_name(st),
               embstore_last_error());
  std::exit(1);
}

// Zipf(s) over [1, n] by inverse transform on a precomputed CDF (n is small here).
class Zipf {
 public:
  Zipf(uint64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (uint64_t k = 1; k <= n; ++k) cdf_[k - 1] = (sum += std::pow(double(k), -s));
    for (auto& c : cdf_) c /= sum;
  }
  template <typename Rng>
  int64_t operator()(Rng& rng) {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin() + 1;
  }

 private:
  std::vector<double> cdf_;
};

float target(int64_t key, uint32_t col) {
  return std::sin(0.001f * float(key % 100003) + 0.37f * float(col));
}

// Copies of host data where the backend wants them (device memory on CUDA).
struct Staging {
  bool device = false;
  void* keys = nullptr;
  void* buf = nullptr;
  Staging(bool on_device, size_t n, uint32_t dim) : device(on_device) {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device) {
      cudaMalloc(&keys, n * sizeof(int64_t));
      cudaMalloc(&buf, n * dim * sizeof(float));
      return;
    }
#endif
    (void)n;
    (void)dim;
  }
  ~Staging() {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device) {
      cudaFree(keys);
      cudaFree(buf);
    }
#endif
  }
  void put(void* dst, const void* src, size_t bytes) {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device) {
      cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice);
      return;
    }
#endif
    (void)dst, (void)src, (void)bytes;
  }
  void get(void* dst, const void* src, size_t bytes) {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device) {
      cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost);
      return;
    }
#endif
    (void)dst, (void)src, (void)bytes;
  }
};

struct Feature {
  const char* name;
  uint32_t dim;
  embstore_optimizer_t optimizer;
  uint64_t key_space;
  embstore_table_t* table = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  const size_t batch = 4096;

  embstore_store_t* store = nullptr;
  check(embstore_store_create(nullptr, &store), "embstore_store_create");
  const bool cuda = embstore_store_backend(store) == EMBSTORE_BACKEND_CUDA;
  std::printf("embstore %d demo: backend %s, %d steps of %zu keys per table\n", embstore_version(),
              cuda ? "CUDA" : "host", steps, batch);

  Feature features[] = {{"user_id", 32, EMBSTORE_OPT_ADAGRAD, 200000},
                        {"item_id", 64, EMBSTORE_OPT_ADAM, 50000}};
  for (auto& f : features) {
    embstore_table_config_t c;
    embstore_table_config_init(&c);
    c.name = f.name;
    c.dim = f.dim;
    c.optimizer = f.optimizer;
    c.learning_rate = f.optimizer == EMBSTORE_OPT_ADAM ? 0.01f : 0.1f;
    c.init = EMBSTORE_INIT_NORMAL;
    c.init_a = 0.0f;
    c.init_b = 0.1f;
    c.seed = 2026;
    check(embstore_table_create(store, &c, &f.table), "embstore_table_create");
  }

  std::mt19937_64 rng(7);
  std::vector<Zipf> zipfs;
  std::vector<std::unique_ptr<Staging>> stagings;
  for (auto& f : features) {
    zipfs.emplace_back(f.key_space, 1.05);
    stagings.push_back(std::make_unique<Staging>(cuda, batch, f.dim));
  }
  const auto start = std::chrono::steady_clock::now();
  double first_loss = 0, last_loss = 0;
  for (int step = 1; step <= steps; ++step) {
    check(embstore_step(store, step), "embstore_step");
    double loss = 0;
    for (size_t t = 0; t < 2; ++t) {
      Feature& f = features[t];
      Staging& staging = *stagings[t];
      std::vector<int64_t> keys(batch);
      for (auto& k : keys) k = zipfs[t](rng) * 2654435761LL;  // spread the ids out
      std::vector<float> values(batch * f.dim), grads(batch * f.dim);
      const int64_t* k_ptr = keys.data();
      float* v_ptr = values.data();
      if (cuda) {
        staging.put(staging.keys, keys.data(), batch * sizeof(int64_t));
        k_ptr = static_cast<int64_t*>(staging.keys);
        v_ptr = static_cast<float*>(staging.buf);
      }
      check(embstore_lookup(f.table, k_ptr, batch, v_ptr, EMBSTORE_LOOKUP_INSERT, nullptr),
            "embstore_lookup");
      if (cuda) staging.get(values.data(), staging.buf, values.size() * sizeof(float));
      for (size_t i = 0; i < batch; ++i) {
        for (uint32_t c = 0; c < f.dim; ++c) {
          const float d = values[i * f.dim + c] - target(keys[i], c);
          grads[i * f.dim + c] = d / float(batch);
          loss += 0.5 * d * d / double(batch);
        }
      }
      const float* g_ptr = grads.data();
      if (cuda) {
        staging.put(staging.buf, grads.data(), grads.size() * sizeof(float));
        g_ptr = static_cast<float*>(staging.buf);
      }
      check(embstore_apply_gradients(f.table, k_ptr, g_ptr, batch, nullptr),
            "embstore_apply_gradients");
#if defined(EMBSTORE_HAVE_CUDA)
      if (cuda) cudaDeviceSynchronize();
#endif
    }
    if (step == 1) first_loss = loss;
    last_loss = loss;
    if (step == 1 || step % 100 == 0 || step == steps) {
      std::printf("  step %4d  loss %.4f\n", step, loss);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  std::printf("trained %d steps in %.2f s (%.0f steps/s)\n", steps, seconds, steps / seconds);
  for (auto& f : features) {
    embstore_table_stats_t s{};
    s.struct_size = sizeof(s);
    check(embstore_table_stats(f.table, &s), "embstore_table_stats");
    std::printf(
        "  table %-8s dim %3u: %8llu rows, capacity %8llu, %8llu dirty, %llu keys skipped\n",
        f.name, f.dim, (unsigned long long)s.rows, (unsigned long long)s.capacity,
        (unsigned long long)s.dirty_rows, (unsigned long long)s.skipped_keys);
  }
  std::printf("loss %.4f -> %.4f\n", first_loss, last_loss);
  check(embstore_store_destroy(store), "embstore_store_destroy");
  if (!(last_loss < first_loss)) {
    std::fprintf(stderr, "demo: loss did not fall\n");
    return 1;
  }
  return 0;
}
