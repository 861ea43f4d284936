// A synthetic training loop through the C API that is killed and resumed: two Adagrad tables,
// Zipf-distributed feature ids, and a toy objective (pull each embedding towards a fixed
// per-key target). Training is deterministic in the step number, so any step can be replayed.
//
//   embstore-demo train DIR [--steps N] [--kill-at S] [--incremental-every K] [--full-every M]
//     Trains with a checkpoint policy into DIR (an incremental checkpoint every K steps, a full
//     one every M), reporting each checkpoint as it commits. With --kill-at, the process kills
//     itself with SIGKILL right after step S, while a checkpoint may be in flight: a crash.
//   embstore-demo resume DIR [--more N]
//     Restores the newest checkpoint in DIR into a new store, replays the same training from
//     scratch up to the restored step in another store (a checkpoint at step S holds the state
//     before S's batch, and the trainer resumes at S), and checks that both hold the same rows
//     bit for bit; then trains both N more steps (default 20) and checks again, which also
//     compares the optimizer state. Exits 1 when anything differs.
//
// Runs on the default backend (CUDA where a device is usable, else host).
#include <embstore/embstore.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <set>
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

constexpr size_t kBatch = 4096;
constexpr const char* kTrainerState = "trainer_state";

// Zipf(s) over [1, n] by inverse transform on a precomputed CDF (n is small here).
class Zipf {
 public:
  Zipf(uint64_t n, double s) : cdf_(n) {
    double sum = 0;
    for (uint64_t k = 1; k <= n; ++k) cdf_[k - 1] = (sum += std::pow(double(k), -s));
    for (auto& c : cdf_) c /= sum;
  }
  template <typename Rng>
  int64_t operator()(Rng& rng) const {
    const double u = std::uniform_real_distribution<double>(0, 1)(rng);
    return std::lower_bound(cdf_.begin(), cdf_.end(), u) - cdf_.begin() + 1;
  }

 private:
  std::vector<double> cdf_;
};

float target(int64_t key, uint32_t col) {
  return std::sin(0.001f * float(key % 100003) + 0.37f * float(col));
}

// Host data copied where the backend reads it (device memory on CUDA).
class Staging {
 public:
  Staging(bool device, uint32_t dim) : device_(device) {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device_) {
      check(cudaMalloc(&keys_, kBatch * sizeof(int64_t)) == cudaSuccess ? EMBSTORE_OK
                                                                        : EMBSTORE_DEVICE_ERROR,
            "cudaMalloc");
      check(cudaMalloc(&floats_, kBatch * dim * sizeof(float)) == cudaSuccess
                ? EMBSTORE_OK
                : EMBSTORE_DEVICE_ERROR,
            "cudaMalloc");
    }
#endif
    (void)dim;
  }
  ~Staging() {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device_) {
      cudaFree(keys_);
      cudaFree(floats_);
    }
#endif
  }
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  const int64_t* keys(const std::vector<int64_t>& k) {
    if (!device_) return k.data();
    copy(keys_, k.data(), k.size() * sizeof(int64_t), true);
    return static_cast<const int64_t*>(keys_);
  }
  const float* floats(const std::vector<float>& f) {
    if (!device_) return f.data();
    copy(floats_, f.data(), f.size() * sizeof(float), true);
    return static_cast<const float*>(floats_);
  }
  float* out(std::vector<float>& f) { return device_ ? static_cast<float*>(floats_) : f.data(); }
  void fetch(std::vector<float>& f) {
    if (device_) copy(f.data(), floats_, f.size() * sizeof(float), false);
  }

 private:
  void copy([[maybe_unused]] void* dst, [[maybe_unused]] const void* src,
            [[maybe_unused]] size_t bytes, [[maybe_unused]] bool to_device) {
#if defined(EMBSTORE_HAVE_CUDA)
    check(cudaMemcpy(dst, src, bytes,
                     to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost) == cudaSuccess
              ? EMBSTORE_OK
              : EMBSTORE_DEVICE_ERROR,
          "cudaMemcpy");
#endif
  }

  bool device_;
  void* keys_ = nullptr;
  void* floats_ = nullptr;
};

struct Feature {
  const char* name;
  uint32_t dim;
  uint64_t key_space;
};
constexpr Feature kFeatures[] = {{"user_id", 32, 200000}, {"item_id", 64, 50000}};

// One store and the deterministic training of the demo on it.
class Trainer {
 public:
  // create_tables: false when a restore brings them.
  explicit Trainer(bool create_tables) {
    check(embstore_store_create(nullptr, &store_), "embstore_store_create");
    cuda_ = embstore_store_backend(store_) == EMBSTORE_BACKEND_CUDA;
    for (const Feature& f : kFeatures) {
      zipfs_.emplace_back(f.key_space, 1.05);
      stagings_.push_back(std::make_unique<Staging>(cuda_, f.dim));
      if (!create_tables) continue;
      embstore_table_config_t c;
      embstore_table_config_init(&c);
      c.name = f.name;
      c.dim = f.dim;
      c.optimizer = EMBSTORE_OPT_ADAGRAD;
      c.learning_rate = 0.1f;
      c.init = EMBSTORE_INIT_NORMAL;
      c.init_a = 0.0f;
      c.init_b = 0.1f;
      c.seed = 2026;
      embstore_table_t* t = nullptr;
      check(embstore_table_create(store_, &c, &t), "embstore_table_create");
    }
  }
  ~Trainer() { check(embstore_store_destroy(store_), "embstore_store_destroy"); }
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  embstore_store_t* store() const { return store_; }
  bool cuda() const { return cuda_; }

  embstore_table_t* table(size_t t) const {
    embstore_table_t* table = nullptr;
    check(embstore_table_get(store_, kFeatures[t].name, &table), "embstore_table_get");
    return table;
  }

  // The keys of table t at a step: a function of the two alone.
  std::vector<int64_t> batch_keys(size_t t, uint64_t step) const {
    std::mt19937_64 rng(step * 2 + t);
    std::vector<int64_t> keys(kBatch);
    for (auto& k : keys) k = zipfs_[t](rng) * 2654435761LL;  // spread the ids out
    return keys;
  }

  // Step `step`: the trainer's state is attached for a checkpoint the policy may take, the
  // step boundary is set, then each table trains one batch. Returns the loss.
  double step(uint64_t step) {
    check(embstore_checkpoint_attach(store_, kTrainerState, &step, sizeof(step)),
          "embstore_checkpoint_attach");
    check(embstore_step(store_, step), "embstore_step");
    double loss = 0;
    for (size_t t = 0; t < 2; ++t) {
      const uint32_t dim = kFeatures[t].dim;
      embstore_table_t* table = this->table(t);
      Staging& staging = *stagings_[t];
      const std::vector<int64_t> keys = batch_keys(t, step);
      std::vector<float> values(kBatch * dim), grads(kBatch * dim);
      const int64_t* k = staging.keys(keys);
      check(embstore_lookup(table, k, kBatch, staging.out(values), EMBSTORE_LOOKUP_INSERT, nullptr),
            "embstore_lookup");
      staging.fetch(values);
      for (size_t i = 0; i < kBatch; ++i) {
        for (uint32_t c = 0; c < dim; ++c) {
          const float d = values[i * dim + c] - target(keys[i], c);
          grads[i * dim + c] = d / float(kBatch);
          loss += 0.5 * d * d / double(kBatch);
        }
      }
      check(embstore_apply_gradients(table, k, staging.floats(grads), kBatch, nullptr),
            "embstore_apply_gradients");
    }
#if defined(EMBSTORE_HAVE_CUDA)
    if (cuda_) cudaDeviceSynchronize();
#endif
    return loss;
  }

  // The rows of `keys` in table t, read without inserting.
  std::vector<float> rows(size_t t, const std::vector<int64_t>& keys) {
    const uint32_t dim = kFeatures[t].dim;
    std::vector<float> out(keys.size() * dim);
    for (size_t first = 0; first < keys.size(); first += kBatch) {
      const size_t n = std::min(kBatch, keys.size() - first);
      std::vector<int64_t> part(keys.begin() + first, keys.begin() + first + n);
      std::vector<float> values(n * dim);
      check(embstore_lookup(table(t), stagings_[t]->keys(part), n, stagings_[t]->out(values), 0,
                            nullptr),
            "embstore_lookup");
      stagings_[t]->fetch(values);
      std::copy(values.begin(), values.end(), out.begin() + first * dim);
    }
    return out;
  }

  uint64_t row_count(size_t t) const {
    embstore_table_stats_t s{};
    s.struct_size = sizeof(s);
    check(embstore_table_stats(table(t), &s), "embstore_table_stats");
    return s.rows;
  }

 private:
  embstore_store_t* store_ = nullptr;
  bool cuda_ = false;
  std::vector<Zipf> zipfs_;
  std::vector<std::unique_ptr<Staging>> stagings_;
};

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

void print_checkpoint(const embstore_checkpoint_info_t& c) {
  const double mb = c.bytes_written / 1e6;
  std::printf("  checkpoint %5llu  %-11s %7llu rows %8.1f MB  %7.1f MB/s  training stall %.2f ms\n",
              (unsigned long long)c.version, c.kind == EMBSTORE_CKPT_FULL ? "full" : "incremental",
              (unsigned long long)c.rows_written, mb,
              c.write_seconds > 0 ? mb / c.write_seconds : 0.0,
              (c.capture_seconds + c.stall_seconds) * 1e3);
}

// "--name value" options after the positional arguments.
std::map<std::string, uint64_t> parse_options(int argc, char** argv, int first,
                                              const std::map<std::string, uint64_t>& defaults) {
  std::map<std::string, uint64_t> o = defaults;
  for (int i = first; i < argc; i += 2) {
    const std::string name = argv[i];
    if (name.rfind("--", 0) != 0 || o.count(name.substr(2)) == 0 || i + 1 >= argc) {
      std::fprintf(stderr, "embstore-demo: unknown or incomplete option '%s'\n", argv[i]);
      std::exit(2);
    }
    o[name.substr(2)] = std::strtoull(argv[i + 1], nullptr, 10);
  }
  return o;
}

int train(const std::string& dir, const std::map<std::string, uint64_t>& o) {
  const uint64_t steps = o.at("steps"), kill_at = o.at("kill-at");
  Trainer trainer(true);
  std::printf("training %llu steps of %zu keys per table on the %s backend\n",
              (unsigned long long)steps, kBatch, trainer.cuda() ? "CUDA" : "host");
  std::printf("checkpoints into %s: incremental every %llu steps, full every %llu\n", dir.c_str(),
              (unsigned long long)o.at("incremental-every"),
              (unsigned long long)o.at("full-every"));
  embstore_checkpoint_policy_t policy;
  embstore_checkpoint_policy_init(&policy);
  policy.dir = dir.c_str();
  policy.incremental_every_steps = o.at("incremental-every");
  policy.full_every_steps = o.at("full-every");
  policy.keep_full = 2;
  check(embstore_checkpoint_set_policy(trainer.store(), &policy), "embstore_checkpoint_set_policy");

  std::vector<uint64_t> pending;  // versions in flight, reported once committed
  auto report_committed = [&](bool wait) {
    while (!pending.empty()) {
      embstore_checkpoint_info_t c;
      c.struct_size = sizeof(c);
      if (wait) check(embstore_checkpoint_wait(trainer.store(), pending.front()), "wait");
      check(embstore_checkpoint_info(trainer.store(), pending.front(), &c),
            "embstore_checkpoint_info");
      if (c.in_flight) return;
      if (c.status != EMBSTORE_OK) {
        std::fprintf(stderr, "checkpoint %llu failed: %s (the library logged why)\n",
                     (unsigned long long)c.version, embstore_status_name(c.status));
        std::exit(1);
      }
      print_checkpoint(c);
      pending.erase(pending.begin());
    }
  };
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t s = 1; s <= steps; ++s) {
    const double loss = trainer.step(s);
    embstore_checkpoint_info_t c;
    c.struct_size = sizeof(c);
    if (embstore_checkpoint_info(trainer.store(), s, &c) == EMBSTORE_OK) pending.push_back(s);
    report_committed(false);
    if (s == 1 || s % 100 == 0)
      std::printf("  step %5llu  loss %.4f\n", (unsigned long long)s, loss);
    if (s == kill_at) {
      std::printf("  step %5llu  %.1f steps/s; killing the trainer (SIGKILL)%s\n",
                  (unsigned long long)s, s / seconds_since(start),
                  pending.empty() ? "" : ", a checkpoint in flight");
      std::fflush(stdout);
      std::raise(SIGKILL);
    }
  }
  std::printf("trained %llu steps at %.1f steps/s\n", (unsigned long long)steps,
              steps / seconds_since(start));
  report_committed(true);
  return 0;
}

int resume(const std::string& dir, const std::map<std::string, uint64_t>& o) {
  Trainer restored(false);
  uint64_t version = 0;
  const auto start = std::chrono::steady_clock::now();
  check(embstore_restore(restored.store(), dir.c_str(), EMBSTORE_LATEST, &version),
        "embstore_restore");
  const double restore_seconds = seconds_since(start);
  uint64_t step = 0;
  size_t bytes = 0;
  check(embstore_restore_attachment(restored.store(), kTrainerState, &step, sizeof(step), &bytes),
        "embstore_restore_attachment");
  std::printf("restored version %llu from %s in %.2f s: %llu + %llu rows, trainer at step %llu\n",
              (unsigned long long)version, dir.c_str(), restore_seconds,
              (unsigned long long)restored.row_count(0), (unsigned long long)restored.row_count(1),
              (unsigned long long)step);
  if (bytes != sizeof(step) || step != version) {
    std::printf("MISMATCH: the trainer state says step %llu\n", (unsigned long long)step);
    return 1;
  }

  // The same training from scratch, without checkpoints, up to the restored step: a checkpoint
  // taken at embstore_step(s) holds the state before batch s.
  Trainer replay(true);
  std::vector<std::set<int64_t>> seen(2);
  auto remember = [&](uint64_t s) {
    for (size_t t = 0; t < 2; ++t) {
      const std::vector<int64_t> keys = replay.batch_keys(t, s);
      seen[t].insert(keys.begin(), keys.end());
    }
  };
  for (uint64_t s = 1; s < step; ++s) {
    replay.step(s);
    remember(s);
  }
  auto compare = [&](const char* when) {
    bool same = true;
    for (size_t t = 0; t < 2; ++t) {
      const std::vector<int64_t> keys(seen[t].begin(), seen[t].end());
      const std::vector<float> a = restored.rows(t, keys), b = replay.rows(t, keys);
      const bool rows_same = restored.row_count(t) == replay.row_count(t) && a.size() == b.size() &&
                             std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
      std::printf("  %-8s %7llu rows: %s %s\n", kFeatures[t].name,
                  (unsigned long long)replay.row_count(t),
                  rows_same ? "bit-identical to the replay" : "DIFFERENT from the replay", when);
      same = same && rows_same;
    }
    return same;
  };
  bool same = compare("at the restored step");
  const uint64_t more = o.at("more");
  for (uint64_t s = step; s < step + more; ++s) {
    restored.step(s);
    replay.step(s);
    remember(s);
  }
  same = compare(("after " + std::to_string(more) + " more steps").c_str()) && same;
  std::printf("%s\n", same ? "resume: OK" : "resume: MISMATCH");
  return same ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // in order with the library's log lines
  if (argc < 3 || (std::strcmp(argv[1], "train") != 0 && std::strcmp(argv[1], "resume") != 0)) {
    std::fprintf(stderr,
                 "usage: embstore-demo train DIR [--steps N] [--kill-at S] "
                 "[--incremental-every K] [--full-every M]\n"
                 "       embstore-demo resume DIR [--more N]\n");
    return 2;
  }
  const std::string dir = argv[2];
  if (std::strcmp(argv[1], "train") == 0) {
    return train(
        dir, parse_options(
                 argc, argv, 3,
                 {{"steps", 300}, {"kill-at", 0}, {"incremental-every", 10}, {"full-every", 100}}));
  }
  return resume(dir, parse_options(argc, argv, 3, {{"more", 20}}));
}
