// Scenario `restore`: how long a restore takes from a cold page cache, against the disk.
//
// A table of --rows rows (dim and optimizer as given) is filled and checkpointed in full, then
// --max-deltas times --delta-fraction of its rows (a different spread-out set each time) are
// updated and checkpointed incrementally. Then the source store is destroyed and, for each
// chain length K of --deltas, every file under the directory is dropped from the page cache
// (posix_fadvise DONTNEED; the files were fsynced at commit, so no page is dirty) and a new,
// empty store restores version K (the full and its first K deltas), timed from the call to its
// return. Each restore is checked: the row count, and a sample of rows against the values the
// source store had at that version.
//
// Reported per K: seconds, the bytes of the chain's row files and bytes/s, the peak resident
// memory the restore added (VmHWM, reset through /proc/self/clear_refs before each restore)
// against the restored rows' bytes, and seconds against K = 0. Where fio is installed, its
// sequential read of the full checkpoint's row file (O_DIRECT, io_uring, 1 MiB blocks, same
// cold cache) gives the disk's bandwidth, and each restore's bandwidth is reported against it.
//
// --numpy PYTHON: the same arrays a table of these rows holds (int64 keys, float32 values
// [rows, dim], float32 optimizer state [rows, state]) are also written as .npy files, and
// before each restore of the full alone PYTHON times numpy's np.load of the three from a cold
// page cache (interpreter start and import not counted). Runs alternate, so the disk's drift
// falls on both; reported: numpy's median and the full's speed against it.
//
// --replace: each timed restore replaces the table instead of creating it (the store restored
// the same version once before, untimed), with the store's restore_spill as --spill says
// (never, always, auto): the peak memory then shows what the restore needs beside the store.
// Spill files go to --spill-dir (default: the checkpoint directory's parent).
//
// --codecs V[/S],...: the chain is built once per codec pair (values' codec V, the state's S,
// default none) in its own directory, from the same rows, and each restore of K is timed for
// every pair in turn, so the disk's drift falls on all; with more than one pair every JSON key
// gets the pair's name as a prefix ("int8/bf16.deltas_0_seconds") and each pair's seconds and
// bytes are reported against the first pair's (list none first). A lossy pair's sampled rows
// are checked against its codec's bound instead of bit for bit.
//
// --quick: 200,000 rows and K in {0, 1, 4}, for a smoke run.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "io/codec/block_codec.hpp"
#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

namespace fs = std::filesystem;

// A field of /proc/self/status in bytes ("VmHWM", "VmRSS"), 0 where absent.
uint64_t proc_status_bytes(const std::string& field) {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    return std::stoull(line.substr(field.size() + 1)) * 1024;  // "NNN kB"
  }
  return 0;
}

// Resets VmHWM to the current RSS (Linux 4.0+); false where the kernel refuses.
bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";
  out.flush();
  return static_cast<bool>(out);
}

// The bytes of the row files of the version directories a restore of `version` reads.
uint64_t chain_row_bytes(const std::string& dir, const std::vector<uint64_t>& versions, size_t k) {
  uint64_t bytes = 0;
  for (const fs::directory_entry& v : fs::directory_iterator(dir)) {
    const std::string name = v.path().filename().string();
    const size_t dot = name.find('.');
    if (dot == std::string::npos || !v.is_directory()) continue;
    const uint64_t number = std::stoull(name.substr(0, dot));
    if (std::find(versions.begin(), versions.begin() + static_cast<long>(k) + 1, number) ==
        versions.begin() + static_cast<long>(k) + 1) {
      continue;
    }
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(v.path())) {
      if (e.is_regular_file() && e.path().extension() == ".rows") bytes += e.file_size();
    }
  }
  return bytes;
}

// fio's sequential read of `path` with a cold cache, in bytes/s; 0 without fio or on failure.
double fio_read_bandwidth(const std::string& path, std::string* how) {
  if (std::system("command -v fio >/dev/null 2>&1") != 0) {
    *how = "fio not installed (scripts/setup.sh --bench)";
    return 0;
  }
  const std::string cmd = fmt::format(
      "fio --name=seqread --filename='{}' --rw=read --bs=1M --direct=1 --ioengine=io_uring "
      "--iodepth=8 --readonly --output-format=terse --terse-version=3 2>/dev/null",
      path);
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return 0;
  std::string out;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  if (::pclose(pipe) != 0) {
    *how = "fio failed";
    return 0;
  }
  // Terse v3: field 7 (1-based) is the read bandwidth in KiB/s.
  std::vector<std::string> fields;
  size_t start = 0;
  for (size_t i = 0; i <= out.size(); ++i) {
    if (i == out.size() || out[i] == ';') {
      fields.push_back(out.substr(start, i - start));
      start = i + 1;
    }
  }
  if (fields.size() < 7) {
    *how = "fio output not understood";
    return 0;
  }
  *how = "fio --rw=read --bs=1M --direct=1 --ioengine=io_uring --iodepth=8";
  return std::stod(fields[6]) * 1024.0;
}

// Writes a C-order .npy file (format 1.0) of shape {rows} (cols 0) or {rows, cols}, dtype descr
// ("<i8", "<f4") of elem_bytes each, filled with pseudo-random bytes (the load's speed does
// not depend on them), and fsyncs it.
void write_npy(const std::string& path, const char* descr, size_t elem_bytes, uint64_t rows,
               uint64_t cols, uint64_t seed) {
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({},{}), }}",
                                   descr, rows, cols > 0 ? fmt::format(" {}", cols) : "");
  // Magic (6), version (2), header length (2), header: padded with spaces to 64 bytes, '\n'.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string prefix("\x93NUMPY\x01\x00", 8);
  prefix.push_back(static_cast<char>(header.size() & 0xFF));
  prefix.push_back(static_cast<char>(header.size() >> 8));
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw std::runtime_error(fmt::format("open {}: errno {}", path, errno));
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw std::runtime_error(fmt::format("write {}: errno {}", path, errno));
      p += w;
      n -= static_cast<size_t>(w);
    }
  };
  write_all(prefix.data(), prefix.size());
  write_all(header.data(), header.size());
  std::vector<uint64_t> chunk((size_t{4} << 20) / sizeof(uint64_t));
  SplitMix64 rng(seed);
  for (uint64_t left = rows * std::max<uint64_t>(cols, 1) * elem_bytes; left > 0;) {
    for (uint64_t& w : chunk) w = rng.next() & 0x3F7FFFFF3F7FFFFFull;  // finite floats
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, chunk.size() * 8));
    write_all(reinterpret_cast<const char*>(chunk.data()), n);
    left -= n;
  }
  ::fsync(fd);
  ::close(fd);
}

// Seconds numpy's np.load of paths takes (python is an interpreter with numpy), from a cold
// page cache; throws when python fails.
double numpy_load_seconds(const std::string& python, const std::vector<std::string>& paths,
                          const std::string& dir) {
  drop_from_page_cache(dir);
  std::string command = fmt::format(
      "'{}' -c 'import sys, time, numpy as np\n"
      "t = time.perf_counter()\n"
      "a = [np.load(p) for p in sys.argv[1:]]\n"
      "print(time.perf_counter() - t)'",
      python);
  for (const std::string& p : paths) command += fmt::format(" '{}'", p);
  FILE* out = ::popen(command.c_str(), "r");
  if (out == nullptr) throw std::runtime_error("popen of " + python + " failed");
  double seconds = -1;
  const int got = std::fscanf(out, "%lf", &seconds);
  const int status = ::pclose(out);
  if (got != 1 || status != 0 || seconds < 0) {
    throw std::runtime_error(
        fmt::format("'{}' could not time np.load (is numpy installed?)", python));
  }
  return seconds;
}

class RestoreScenario final : public Scenario {
 public:
  const char* name() const override { return "restore"; }
  const char* description() const override {
    return "restore of a full checkpoint and of chains of deltas from a cold page cache";
  }

  void set_defaults(CommonOptions& o) const override { o.threads = 0; }

  void add_options(CLI::App& app) override {
    app.add_option("--dir", dir_, "directory the checkpoints are written under")->required();
    app.add_option("--rows", rows_, "rows in the table")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 31))
        ->capture_default_str();
    app.add_option("--optimizer", optimizer_, "optimizer of the table")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--deltas", deltas_, "chain lengths to restore (deltas after the full)")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--delta-fraction", delta_fraction_, "fraction of the rows each delta holds")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    app.add_option("--repeat", repeat_, "restores per chain length (the median is reported)")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    app.add_option("--numpy", numpy_python_,
                   "a Python with numpy: time np.load of the same arrays, alternating with the "
                   "restores of the full alone");
    app.add_flag("--replace", replace_, "restore into a store that holds the table already");
    app.add_option("--spill", spill_, "the store's restore_spill, with --replace")
        ->check(CLI::IsMember({"never", "always", "auto"}))
        ->capture_default_str();
    app.add_option("--spill-dir", spill_dir_, "spill_dir (default: --dir)");
    app.add_option("--codecs", codecs_,
                   "codec pairs VALUES[/STATE] (none, lossless, bf16, int8), each restored in "
                   "turn; ratios against the first")
        ->delimiter(',')
        ->capture_default_str();
    app.add_flag("--quick", quick_, "200,000 rows and chain lengths 0, 1, 4");
    app.add_flag("--keep", keep_, "keep the checkpoint directory");
  }

  int run(const CommonOptions& o, Report& report) override {
    if (quick_) {
      rows_ = std::min<uint64_t>(rows_, 200'000);
      deltas_ = {0, 1, 4};
    }
    std::sort(deltas_.begin(), deltas_.end());
    deltas_.erase(std::unique(deltas_.begin(), deltas_.end()), deltas_.end());
    const size_t max_deltas = deltas_.empty() ? 0 : deltas_.back();
    const ScenarioDir scenario_dir(dir_, "restore", keep_);
    const std::vector<CodecPair> pairs = parse_codecs_option(codecs_);
    const bool several = pairs.size() > 1;
    // Each pair's chain in its own directory: "none-none", "int8-bf16".
    std::vector<std::string> dirs;
    for (const CodecPair& pair : pairs) {
      std::string slug = pair.name;
      std::replace(slug.begin(), slug.end(), '/', '-');
      dirs.push_back(scenario_dir.path() + "/" + slug);
      fs::create_directories(dirs.back());
    }
    const std::string& dir = dirs.front();

    // Build: the full checkpoint and max_deltas deltas, with a sample of rows at each version.
    const size_t sample = std::min<uint64_t>(rows_, 1024);
    std::vector<int64_t> sample_keys(sample);
    for (size_t i = 0; i < sample; ++i) sample_keys[i] = key_of_rank(1 + i * (rows_ / sample));
    std::vector<uint64_t> versions;               // versions[k]: the full (k = 0) or delta k
    std::vector<std::vector<float>> sample_rows;  // at each version
    embstore_backend_t backend = EMBSTORE_BACKEND_HOST;
    const Stopwatch build_watch;
    // Every pair's chain holds the same rows: the same fill and updates, from the same seed.
    for (size_t p = 0; p < pairs.size(); ++p) {
      const std::string& dir = dirs[p];
      versions.clear();
      sample_rows.clear();
      Store store(o);
      backend = store.backend();
      embstore_table_t* table =
          create_table(store, "perf_restore", o.dim, optimizer_from_name(optimizer_),
                       [&](embstore_table_config_t& c) {
                         c.value_codec = pairs[p].values;
                         c.state_codec = pairs[p].state;
                       });
      const size_t chunk = 1 << 16;
      std::vector<int64_t> keys(chunk);
      std::vector<float> grads(chunk * o.dim);
      SplitMix64 rng(o.seed);
      for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);
      BackendBuffer<int64_t> d_keys(backend, chunk);
      BackendBuffer<float> d_out(backend, chunk * o.dim);
      BackendBuffer<float> d_grads(backend, grads.size());
      d_grads.upload(grads.data(), grads.size());
      for (uint64_t first = 0; first < rows_; first += chunk) {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, rows_ - first));
        for (size_t i = 0; i < n; ++i) keys[i] = key_of_rank(first + i + 1);
        d_keys.upload(keys.data(), n);
        check(
            embstore_lookup(table, d_keys.data(), n, d_out.data(), EMBSTORE_LOOKUP_INSERT, nullptr),
            "embstore_lookup");
        // The optimizer state is not all zeros, as after training.
        check(embstore_apply_gradients(table, d_keys.data(), d_grads.data(), n, nullptr),
              "embstore_apply_gradients");
      }
      backend_sync(backend);
      uint64_t step = 0;
      auto checkpoint = [&](embstore_ckpt_kind_t kind) {
        check(embstore_step(store.get(), ++step), "embstore_step");
        uint64_t v = 0;
        check(embstore_checkpoint(store.get(), dir.c_str(), kind, &v), "embstore_checkpoint");
        check(embstore_checkpoint_wait(store.get(), v), "embstore_checkpoint_wait");
        versions.push_back(v);
        sample_rows.push_back(read_rows(table, backend, sample_keys, o.dim));
      };
      checkpoint(EMBSTORE_CKPT_FULL);
      const uint64_t dirty = std::max<uint64_t>(1, static_cast<uint64_t>(delta_fraction_ * rows_));
      const uint64_t stride = std::max<uint64_t>(1, rows_ / dirty);
      for (size_t k = 1; k <= max_deltas; ++k) {
        // Ranks k, k + stride, ...: a different set for each delta, spread over the table.
        for (uint64_t first = 0; first < dirty; first += chunk) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk, dirty - first));
          for (size_t i = 0; i < n; ++i) {
            keys[i] = key_of_rank(1 + (k + (first + i) * stride) % rows_);
          }
          d_keys.upload(keys.data(), n);
          check(embstore_apply_gradients(table, d_keys.data(), d_grads.data(), n, nullptr),
                "embstore_apply_gradients");
        }
        backend_sync(backend);
        checkpoint(EMBSTORE_CKPT_INCREMENTAL);
      }
    }
    const double build_seconds = build_watch.seconds();

    // A row: its key, value and optimizer state.
    const uint32_t state = optimizer_ == "sgd"               ? 0
                           : optimizer_ == "rowwise_adagrad" ? 1
                           : optimizer_ == "adam"            ? 2 * o.dim
                                                             : o.dim;
    const uint64_t row_bytes = 8 + uint64_t{o.dim + state} * 4;
    const uint64_t table_bytes = rows_ * row_bytes;

    // The disk's sequential read of the full checkpoint's row file.
    std::string fio_how;
    double fio_bps = 0;
    for (const fs::directory_entry& e : fs::recursive_directory_iterator(dir)) {
      if (e.path().string().find(".full/") == std::string::npos) continue;
      if (e.path().extension() != ".rows") continue;
      drop_from_page_cache(dir);
      fio_bps = fio_read_bandwidth(e.path().string(), &fio_how);
      break;
    }

    // numpy's files: the same arrays, beside the checkpoints (and dropped from the cache with
    // them).
    std::vector<std::string> npy_paths;
    if (!numpy_python_.empty()) {
      const std::string npy_dir = dir + "/numpy";
      fs::create_directories(npy_dir);
      npy_paths = {npy_dir + "/keys.npy", npy_dir + "/values.npy"};
      write_npy(npy_paths[0], "<i8", 8, rows_, 0, o.seed);
      write_npy(npy_paths[1], "<f4", 4, rows_, o.dim, o.seed + 1);
      if (state > 0) {
        npy_paths.push_back(npy_dir + "/state.npy");
        write_npy(npy_paths[2], "<f4", 4, rows_, state, o.seed + 2);
      }
    }

    report_common(report, o, backend);
    report.set("optimizer", optimizer_);
    report.set("rows", rows_);
    report.set("replace", replace_);
    report.set("spill", replace_ ? spill_ : "");
    report.set("delta_fraction", delta_fraction_);
    report.set("table_bytes", table_bytes);
    report.set("build_seconds", build_seconds);
    report.set("fio_bytes_per_second", fio_bps);
    report.say(
        "table: {} rows x dim {} ({}), {}B of rows; {} backend, host_threads {}{}", rows_, o.dim,
        optimizer_, si(static_cast<double>(table_bytes)), backend_name(backend), o.threads,
        replace_ ? fmt::format("; each restore replaces the table (restore_spill {})", spill_)
                 : "");
    report.say("disk: {}", fio_bps > 0
                               ? fmt::format("{}B/s sequential read ({})", si(fio_bps), fio_how)
                               : fio_how);

    int code = 0;
    std::vector<double> seconds_k0(pairs.size(), 0.0);
    std::vector<double> numpy_seconds;
    for (size_t k : deltas_) {
      std::vector<std::vector<double>> seconds(pairs.size());
      std::vector<uint64_t> peak(pairs.size(), 0);
      bool peak_known = true;
      for (int rep = 0; rep < repeat_; ++rep) {
        if (k == 0 && !npy_paths.empty()) {
          numpy_seconds.push_back(numpy_load_seconds(numpy_python_, npy_paths, dir));
        }
        for (size_t p = 0; p < pairs.size(); ++p) {
          embstore_store_config_t config = Store::default_config();
          config.restore_spill = spill_ == "always"  ? EMBSTORE_SPILL_ALWAYS
                                 : spill_ == "never" ? EMBSTORE_SPILL_NEVER
                                                     : EMBSTORE_SPILL_AUTO;
          const std::string spill_dir = spill_dir_.empty() ? dir_ : spill_dir_;
          config.spill_dir = spill_dir.c_str();
          Store store(o, config);
          if (replace_) {
            uint64_t v = 0;
            check(embstore_restore(store.get(), dirs[p].c_str(), versions[k], &v),
                  "embstore_restore");
          }
          drop_from_page_cache(scenario_dir.path());
          const uint64_t rss_before = proc_status_bytes("VmRSS");
          peak_known = reset_peak_rss() && peak_known;
          const Stopwatch w;
          uint64_t restored = 0;
          check(embstore_restore(store.get(), dirs[p].c_str(), versions[k], &restored),
                "embstore_restore");
          seconds[p].push_back(w.seconds());
          const uint64_t hwm = proc_status_bytes("VmHWM");
          peak[p] = std::max(peak[p], hwm > rss_before ? hwm - rss_before : 0);
          embstore_table_t* table = nullptr;
          check(embstore_table_get(store.get(), "perf_restore", &table), "embstore_table_get");
          const uint64_t rows = table_stats(table).rows;
          if (restored != versions[k] || rows != rows_ ||
              !sample_matches(pairs[p], read_rows(table, backend, sample_keys, o.dim),
                              sample_rows[k], o.dim)) {
            report.say(
                "MISMATCH: {} restore of version {} gave version {}, {} rows (of {}), or "
                "sampled rows that differ from the source's (beyond the codec's bound)",
                pairs[p].name, versions[k], restored, rows, rows_);
            code = kExitMismatch;
          }
        }
      }
      if (k == 0 && !numpy_seconds.empty()) {
        const double np_s = median(numpy_seconds);
        const double s = median(seconds[0]);
        report.set("numpy_load_seconds", np_s);
        report.set("deltas_0_speed_to_numpy", np_s / s);
        std::string runs;
        for (double t : numpy_seconds) runs += fmt::format("{}{:.3f}", runs.empty() ? "" : ", ", t);
        report.say(
            "numpy np.load of the same arrays ({} files), alternating: {:.3f} s (runs {}); "
            "the full alone restores at x{:.2f} numpy's speed",
            npy_paths.size(), np_s, runs, np_s / s);
      }
      for (size_t p = 0; p < pairs.size(); ++p) {
        const double s = median(seconds[p]);
        if (k == 0) seconds_k0[p] = s;
        const uint64_t bytes = chain_row_bytes(dirs[p], versions, k);
        const std::string key =
            fmt::format("{}deltas_{}", several ? pairs[p].name + "." : std::string(), k);
        report.set(key + "_seconds", s);
        report.set(key + "_row_file_bytes", bytes);
        report.set(key + "_bytes_per_second", bytes / s);
        if (fio_bps > 0) report.set(key + "_to_fio", bytes / s / fio_bps);
        if (seconds_k0[p] > 0) report.set(key + "_to_full_seconds", s / seconds_k0[p]);
        if (peak_known) {
          report.set(key + "_peak_rss_to_table_bytes", double(peak[p]) / table_bytes);
        }
        std::string against;
        if (p > 0) {
          const double s0 = median(seconds[0]);
          const uint64_t bytes0 = chain_row_bytes(dirs[0], versions, k);
          report.set(key + "_seconds_ratio", s / s0);
          report.set(key + "_bytes_ratio", static_cast<double>(bytes) / bytes0);
          against = fmt::format(
              "; against {}: {:.3f} of the bytes, {:.2f}x the time ({:.2f}x "
              "as fast)",
              pairs[0].name, static_cast<double>(bytes) / bytes0, s / s0, s0 / s);
        }
        report.say(
            "{}full + {:2} deltas: {:.3f} s, {}B of row files, {}B/s{}; x{:.2f} the full alone; "
            "peak memory {}{}",
            several ? pairs[p].name + ": " : std::string(), k, s, si(static_cast<double>(bytes)),
            si(bytes / s), fio_bps > 0 ? fmt::format(" ({:.2f} of fio)", bytes / s / fio_bps) : "",
            seconds_k0[p] > 0 ? s / seconds_k0[p] : 0.0,
            peak_known ? fmt::format("+{}B, {:.2f}x the rows' bytes", si(double(peak[p])),
                                     double(peak[p]) / table_bytes)
                       : "unknown (no /proc/self/clear_refs)",
            against);
      }
    }
    return code;
  }

 private:
  // Whether a restore's sampled values are the source's: bit for bit where the values' codec
  // is lossless, else within its bound (cuda/row/codec.h).
  static bool sample_matches(const CodecPair& pair, const std::vector<float>& got,
                             const std::vector<float>& want, uint32_t dim) {
    return got.size() == want.size() &&
           io::within_bound(static_cast<io::Codec>(pair.values), want.data(), got.data(),
                            want.size() / dim, dim);
  }

  // The values of `keys` (find, no insert), on the host.
  static std::vector<float> read_rows(embstore_table_t* table, embstore_backend_t backend,
                                      const std::vector<int64_t>& keys, uint32_t dim) {
    BackendBuffer<int64_t> d_keys(backend, keys.size());
    BackendBuffer<float> d_out(backend, keys.size() * dim);
    d_keys.upload(keys.data(), keys.size());
    check(embstore_lookup(table, d_keys.data(), keys.size(), d_out.data(), 0, nullptr),
          "embstore_lookup");
    backend_sync(backend);
    std::vector<float> scratch;
    const float* values = d_out.host_view(0, keys.size() * dim, scratch);
    return std::vector<float>(values, values + keys.size() * dim);
  }

  std::string dir_;
  std::string numpy_python_;
  bool replace_ = false;
  std::string spill_ = "auto";
  std::string spill_dir_;
  uint64_t rows_ = 10'000'000;
  std::string optimizer_ = "adagrad";
  std::vector<size_t> deltas_ = {0, 1, 4, 16};
  std::vector<std::string> codecs_ = {"none"};
  double delta_fraction_ = 0.01;
  int repeat_ = 1;
  bool quick_ = false;
  bool keep_ = false;
};

}  // namespace

std::unique_ptr<Scenario> make_restore_scenario() { return std::make_unique<RestoreScenario>(); }

}  // namespace embstore::perf
