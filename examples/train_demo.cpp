// A small synthetic training loop through the C API: two embedding tables, Zipf-distributed
// feature ids, and a toy objective (pull each embedding towards a fixed per-key target) whose
// loss must fall. Runs on the default backend (CUDA where a device is usable, else host).
#include <embstore/embstore.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
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

// Reads `n` keys of a table into host memory, whichever backend holds it.
std::vector<float> read_rows(embstore_table_t* table, const std::vector<int64_t>& keys, bool cuda,
                             Staging& staging) {
  const uint32_t dim = embstore_table_dim(table);
  std::vector<float> out(keys.size() * dim);
  const int64_t* k = keys.data();
  float* v = out.data();
  if (cuda) {
    staging.put(staging.keys, keys.data(), keys.size() * sizeof(int64_t));
    k = static_cast<int64_t*>(staging.keys);
    v = static_cast<float*>(staging.buf);
  }
  check(embstore_lookup(table, k, keys.size(), v, 0, nullptr), "embstore_lookup");
  if (cuda) staging.get(out.data(), staging.buf, out.size() * sizeof(float));
  return out;
}

int main(int argc, char** argv) {
  // embstore-demo [STEPS [CHECKPOINT_DIR]]: without a directory, a temporary one is used and
  // removed at the end.
  const int steps = argc > 1 ? std::atoi(argv[1]) : 300;
  const size_t batch = 4096;
  std::string ckpt_dir;
  bool remove_dir = false;
  if (argc > 2) {
    ckpt_dir = argv[2];
  } else {
    char tmpl[] = "/tmp/embstore-demo-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) {
      std::perror("mkdtemp");
      return 1;
    }
    ckpt_dir = tmpl;
    remove_dir = true;
  }

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

  // A full checkpoint every 100 steps, written while training goes on; the newest 2 are kept.
  embstore_checkpoint_policy_t policy;
  embstore_checkpoint_policy_init(&policy);
  policy.dir = ckpt_dir.c_str();
  policy.full_every_steps = 100;
  policy.keep_full = 2;
  check(embstore_checkpoint_set_policy(store, &policy), "embstore_checkpoint_set_policy");

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
    // The trainer's own state goes with the checkpoint the policy may take at this step.
    const uint64_t trainer_state[2] = {static_cast<uint64_t>(step), rng()};
    check(embstore_checkpoint_attach(store, "trainer_state", trainer_state, sizeof(trainer_state)),
          "embstore_checkpoint_attach");
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

  // A last checkpoint, then a restore into a new store: the tables come back bit for bit.
  uint64_t version = 0;
  check(embstore_step(store, steps + 1), "embstore_step");
  check(embstore_checkpoint(store, ckpt_dir.c_str(), EMBSTORE_CKPT_FULL, &version),
        "embstore_checkpoint");
  check(embstore_checkpoint_wait(store, version), "embstore_checkpoint_wait");
  embstore_checkpoint_stats_t cs{};
  cs.struct_size = sizeof(cs);
  check(embstore_checkpoint_stats(store, &cs), "embstore_checkpoint_stats");
  std::printf(
      "checkpoints in %s: %llu committed, %llu rows / %.1f MB written, %llu rows copied "
      "on write, longest training stall %.2f ms\n",
      ckpt_dir.c_str(), (unsigned long long)cs.committed, (unsigned long long)cs.rows_written,
      cs.bytes_written / 1e6, (unsigned long long)cs.copy_on_write_rows,
      cs.stall_seconds_max * 1e3);

  embstore_store_t* restored = nullptr;
  check(embstore_store_create(nullptr, &restored), "embstore_store_create");
  uint64_t restored_version = 0;
  check(embstore_restore(restored, ckpt_dir.c_str(), EMBSTORE_LATEST, &restored_version),
        "embstore_restore");
  bool identical = true;
  for (size_t t = 0; t < 2; ++t) {
    embstore_table_t* copy = nullptr;
    check(embstore_table_get(restored, features[t].name, &copy), "embstore_table_get");
    std::vector<int64_t> keys(batch);
    for (auto& k : keys) k = zipfs[t](rng) * 2654435761LL;
    identical = identical && read_rows(features[t].table, keys, cuda, *stagings[t]) ==
                                 read_rows(copy, keys, cuda, *stagings[t]);
  }
  std::printf("restored version %llu into a new store: %s\n", (unsigned long long)restored_version,
              identical ? "rows identical" : "ROWS DIFFER");
  check(embstore_store_destroy(restored), "embstore_store_destroy");
  check(embstore_store_destroy(store), "embstore_store_destroy");
  if (remove_dir) std::filesystem::remove_all(ckpt_dir);
  if (!identical) return 1;
  if (!(last_loss < first_loss)) {
    std::fprintf(stderr, "demo: loss did not fall\n");
    return 1;
  }
  return 0;
}
