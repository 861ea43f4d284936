// Pieces every scenario shares: options, the scenario interface, an owning store, memory on
// the store's backend, timing and result checks.
#pragma once

#include <embstore/embstore.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <functional>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#if defined(EMBSTORE_HAVE_CUDA)
#include <cuda_runtime_api.h>
#endif

#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace CLI {
class App;
}

namespace embstore::perf {

// Options every scenario takes; a scenario may change the defaults (Scenario::set_defaults).
struct CommonOptions {
  std::string backend = "auto";
  int threads = 1;  // host_threads of the store; 0: one per core
  uint32_t dim = 64;
  size_t batch = 65536;
  uint64_t key_space = 10'000'000;
  double zipf = 1.1;
  size_t steps = 100;  // batches
  uint64_t seed = 42;
  std::string json_path;
};

class Scenario {
 public:
  virtual ~Scenario() = default;
  virtual const char* name() const = 0;
  virtual const char* description() const = 0;
  virtual void set_defaults(CommonOptions&) const {}
  virtual void add_options(CLI::App&) {}
  // Returns the exit code: 0, or kExitMismatch when results fail their check. Throws
  // std::runtime_error on errors.
  virtual int run(const CommonOptions& options, Report& report) = 0;
};

inline constexpr int kExitError = 1;
inline constexpr int kExitMismatch = 2;

std::unique_ptr<Scenario> make_lookup_scenario();
std::unique_ptr<Scenario> make_optimizer_scenario();
std::unique_ptr<Scenario> make_checkpoint_scenario();
std::unique_ptr<Scenario> make_train_scenario();
std::unique_ptr<Scenario> make_restore_scenario();
std::unique_ptr<Scenario> make_sharded_scenario();
std::unique_ptr<Scenario> make_follow_scenario();
std::unique_ptr<Scenario> make_step_scenario();
std::unique_ptr<Scenario> make_tiers_scenario();
std::unique_ptr<Scenario> make_codecs_scenario();

// A scenario's working directory, <parent>/embstore-perf-<scenario>-<pid>, removed with
// everything in it at the end unless kept.
class ScenarioDir {
 public:
  ScenarioDir(const std::string& parent, const char* scenario, bool keep)
      : path_(fmt::format("{}/embstore-perf-{}-{}", parent, scenario, ::getpid())), keep_(keep) {}
  ~ScenarioDir() {
    std::error_code ec;
    if (!keep_) std::filesystem::remove_all(path_, ec);
  }
  ScenarioDir(const ScenarioDir&) = delete;
  ScenarioDir& operator=(const ScenarioDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  bool keep_;
};

// Throws with the library's own message (which names the call): a benchmark that silently
// measures failures lies.
inline void check(embstore_status_t status, const char* what) {
  if (status != EMBSTORE_OK) {
    const std::string detail = embstore_last_error();
    throw std::runtime_error(
        fmt::format("{} ({})", detail.empty() ? what : detail, embstore_status_name(status)));
  }
}

inline embstore_backend_t backend_from_name(const std::string& name) {
  if (name == "host") return EMBSTORE_BACKEND_HOST;
  if (name == "cuda") return EMBSTORE_BACKEND_CUDA;
  return EMBSTORE_BACKEND_AUTO;
}

inline const char* backend_name(embstore_backend_t backend) {
  return backend == EMBSTORE_BACKEND_CUDA ? "cuda" : "host";
}

// The parameters every scenario reports, in the same order.
inline void report_common(Report& report, const CommonOptions& o, embstore_backend_t backend) {
  report.set("backend", backend_name(backend));
  report.set("threads", o.threads);
  report.set("dim", o.dim);
  report.set("batch", o.batch);
  report.set("key_space", o.key_space);
  report.set("zipf", o.zipf);
  report.set("steps", o.steps);
  report.set("seed", o.seed);
}

// "sgd", "adagrad", "rowwise_adagrad", "adam" (CLI checks the name).
inline embstore_optimizer_t optimizer_from_name(const std::string& name) {
  if (name == "sgd") return EMBSTORE_OPT_SGD;
  if (name == "rowwise_adagrad") return EMBSTORE_OPT_ROWWISE_ADAGRAD;
  if (name == "adam") return EMBSTORE_OPT_ADAM;
  return EMBSTORE_OPT_ADAGRAD;
}

inline const std::vector<std::string>& optimizer_names() {
  static const std::vector<std::string> names{"sgd", "adagrad", "rowwise_adagrad", "adam"};
  return names;
}

// A table's codec pair (--codecs of the checkpoint and restore scenarios): "VALUES[/STATE]",
// each of none, lossless, bf16, int8; the state's default is none.
struct CodecPair {
  std::string name;  // "int8/bf16", the state's spelled out
  embstore_codec_t values = EMBSTORE_CODEC_NONE, state = EMBSTORE_CODEC_NONE;
  bool lossless() const {
    return values <= EMBSTORE_CODEC_LOSSLESS && state <= EMBSTORE_CODEC_LOSSLESS;
  }
};

// Throws std::invalid_argument for an unknown name.
inline CodecPair parse_codec_pair(const std::string& text) {
  static const char* const kNames[] = {"none", "lossless", "bf16", "int8"};
  const auto codec = [&](const std::string& name) {
    for (int i = 0; i < 4; ++i) {
      if (name == kNames[i]) return static_cast<embstore_codec_t>(i);
    }
    throw std::invalid_argument("unknown codec pair '" + text + "'");
  };
  const size_t slash = text.find('/');
  const std::string v = text.substr(0, slash);
  const std::string s = slash == std::string::npos ? "none" : text.substr(slash + 1);
  return {v + "/" + s, codec(v), codec(s)};
}

// --codecs of a scenario: each name parsed; CLI::ValidationError for an unknown one.
std::vector<CodecPair> parse_codecs_option(const std::vector<std::string>& names);

class Store {
 public:
  explicit Store(const CommonOptions& options) : Store(options, default_config()) {}
  // config's backend and host_threads come from options.
  Store(const CommonOptions& options, embstore_store_config_t config) {
    config.backend = backend_from_name(options.backend);
    config.host_threads = options.threads;
    check(embstore_store_create(&config, &store_), "embstore_store_create");
  }
  ~Store() { embstore_store_destroy(store_); }
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  embstore_store_t* get() const { return store_; }
  embstore_backend_t backend() const { return embstore_store_backend(store_); }

  static embstore_store_config_t default_config() {
    embstore_store_config_t config;
    embstore_store_config_init(&config);
    return config;
  }

 private:
  embstore_store_t* store_ = nullptr;
};

// A table of the scenario's dim and optimizer, everything else at its default.
// configure: changes the rest of the config (eviction ...) before the table is created.
inline embstore_table_t* create_table(
    const Store& store, const char* name, uint32_t dim, embstore_optimizer_t optimizer,
    const std::function<void(embstore_table_config_t&)>& configure = {}) {
  embstore_table_config_t config;
  embstore_table_config_init(&config);
  config.name = name;
  config.dim = dim;
  config.optimizer = optimizer;
  if (configure) configure(config);
  embstore_table_t* table = nullptr;
  check(embstore_table_create(store.get(), &config, &table), "embstore_table_create");
  return table;
}

inline embstore_table_stats_t table_stats(embstore_table_t* table) {
  embstore_table_stats_t stats;
  stats.struct_size = sizeof(stats);
  check(embstore_table_stats(table, &stats), "embstore_table_stats");
  return stats;
}

inline embstore_checkpoint_stats_t checkpoint_stats(embstore_store_t* store) {
  embstore_checkpoint_stats_t s;
  s.struct_size = sizeof(s);
  check(embstore_checkpoint_stats(store, &s), "embstore_checkpoint_stats");
  return s;
}

// Waits for the backend's queued work; the host backend's calls are already synchronous.
inline void backend_sync([[maybe_unused]] embstore_backend_t backend) {
#if defined(EMBSTORE_HAVE_CUDA)
  if (backend == EMBSTORE_BACKEND_CUDA) {
    const cudaError_t err = cudaDeviceSynchronize();
    if (err != cudaSuccess) throw std::runtime_error(cudaGetErrorString(err));
  }
#endif
}

// n elements where the backend reads them: host memory, or device memory on CUDA.
template <typename T>
class BackendBuffer {
 public:
  BackendBuffer(embstore_backend_t backend, size_t n) : backend_(backend), size_(n) {
#if defined(EMBSTORE_HAVE_CUDA)
    if (backend_ == EMBSTORE_BACKEND_CUDA) {
      void* p = nullptr;
      cuda_check(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)));
      device_ = static_cast<T*>(p);
      return;
    }
#endif
    host_.resize(n);
  }
  ~BackendBuffer() {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device_ != nullptr) cudaFree(device_);
#endif
  }
  BackendBuffer(const BackendBuffer&) = delete;
  BackendBuffer& operator=(const BackendBuffer&) = delete;

  T* data() { return device_ != nullptr ? device_ : host_.data(); }
  size_t size() const { return size_; }

  void upload(const T* src, size_t n, size_t offset = 0) {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device_ != nullptr) {
      cuda_check(cudaMemcpy(device_ + offset, src, n * sizeof(T), cudaMemcpyHostToDevice));
      return;
    }
#endif
    std::copy(src, src + n, host_.begin() + offset);
  }

  // [offset, offset + n) readable on the host: the buffer itself, or a copy in scratch.
  const T* host_view(size_t offset, size_t n, std::vector<T>& scratch) const {
#if defined(EMBSTORE_HAVE_CUDA)
    if (device_ != nullptr) {
      scratch.resize(n);
      cuda_check(
          cudaMemcpy(scratch.data(), device_ + offset, n * sizeof(T), cudaMemcpyDeviceToHost));
      return scratch.data();
    }
#endif
    (void)n;
    (void)scratch;
    return host_.data() + offset;
  }

 private:
#if defined(EMBSTORE_HAVE_CUDA)
  static void cuda_check(cudaError_t err) {
    if (err != cudaSuccess) throw std::runtime_error(cudaGetErrorString(err));
  }
#endif

  embstore_backend_t backend_;
  size_t size_;
  std::vector<T> host_;
  T* device_ = nullptr;
};

// The order of fill_table's inserts: by rank (the hottest keys of the Zipf streams first), or
// scattered (rank = a * i mod rows + 1 for the i-th insert, a coprime to rows near 0.618 rows:
// every rank once, in an order unrelated to heat).
enum class FillOrder { kRank, kScattered };

// Inserts the rows of ranks 1..rows (key_of_rank) into table, at their initial values.
inline void fill_table(embstore_table_t* table, embstore_backend_t backend, uint64_t rows,
                       uint32_t dim, FillOrder order = FillOrder::kRank) {
  const size_t chunk = 1 << 16;
  std::vector<int64_t> keys(chunk);
  BackendBuffer<int64_t> d_keys(backend, chunk);
  BackendBuffer<float> d_out(backend, chunk * dim);
  uint64_t stride = 1;
  if (order == FillOrder::kScattered && rows > 2) {
    stride = static_cast<uint64_t>(static_cast<double>(rows) * 0.6180339887) | 1;
    while (std::gcd(stride, rows) != 1) stride += 2;
  }
  for (uint64_t first = 0; first < rows; first += chunk) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, rows - first));
    for (size_t i = 0; i < n; ++i) {
      const uint64_t at = first + i;
      const auto rank = static_cast<uint64_t>((static_cast<unsigned __int128>(at) * stride) % rows);
      keys[i] = key_of_rank(rank + 1);
    }
    d_keys.upload(keys.data(), n);
    check(embstore_lookup(table, d_keys.data(), n, d_out.data(), EMBSTORE_LOOKUP_INSERT, nullptr),
          "embstore_lookup");
  }
  backend_sync(backend);
}

// Drops every file under dir from the page cache; returns the files' bytes.
inline uint64_t drop_from_page_cache(const std::string& dir) {
  uint64_t bytes = 0;
  for (const std::filesystem::directory_entry& e :
       std::filesystem::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", e.path().string(), errno));
    ::fdatasync(fd);  // cheap when clean; DONTNEED skips dirty pages
    (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
    bytes += e.file_size();
  }
  return bytes;
}

// Wall and process CPU seconds. CPU time counts every thread of the process and none of the
// time it waits for a core, so on a shared machine it shows what preemption hides in the wall
// time (cache and memory-bandwidth interference remain in both).
struct Elapsed {
  double wall = 0, cpu = 0;
  Elapsed& operator+=(const Elapsed& o) {
    wall += o.wall;
    cpu += o.cpu;
    return *this;
  }
};

// Seconds of a CPU-time clock (CLOCK_PROCESS_CPUTIME_ID, CLOCK_THREAD_CPUTIME_ID).
inline double cpu_clock_seconds(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// The calling thread's CPU seconds: below the wall time of a stretch of pure computation when
// the thread waited for a core.
inline double thread_cpu_seconds() { return cpu_clock_seconds(CLOCK_THREAD_CPUTIME_ID); }

class Stopwatch {
 public:
  Stopwatch() : wall_(std::chrono::steady_clock::now()), cpu_(cpu_now()) {}
  Elapsed elapsed() const {
    const double cpu = cpu_now() - cpu_;
    return {std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_).count(), cpu};
  }
  double seconds() const { return elapsed().wall; }

 private:
  static double cpu_now() { return cpu_clock_seconds(CLOCK_PROCESS_CPUTIME_ID); }

  std::chrono::steady_clock::time_point wall_;
  double cpu_;
};

inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 == 1 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// The q-quantile (0 <= q <= 1) by the nearest-rank rule: the smallest value with at least
// q of the values at or below it.
inline double percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(v.size())));
  return v[std::min(v.size() - 1, rank == 0 ? 0 : rank - 1)];
}

// Order-sensitive checksum of float bit patterns: equal outputs give equal sums, and reading
// every output keeps the compiler from dropping the work that produced it.
inline uint64_t checksum_floats(const float* values, size_t n, uint64_t seed) {
  uint64_t h = seed * 0x100000001b3ull;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], sizeof(bits));
    h += uint64_t{bits} * (2 * i + 1);
  }
  return h;
}

}  // namespace embstore::perf
