// Scenario `follow` (issue 17): a trainer process and a follower process. The trainer, forked
// before this process starts any thread, fills a table of --key-space rows, commits a full
// checkpoint, then trains Zipf batches (a lookup with insert and the gradients) and commits an
// incremental checkpoint every --steps-per-version steps, as the follower process asks over a
// pipe. The follower process runs --lookup-threads threads of lookups (Zipf batches of
// --lookup-batch keys: the rows the trainer updates most are the rows served most) through
// these phases:
//   live        a background follower polling every --poll-interval-ms follows --versions
//               deltas committed while training goes on; its stats give the lag from each
//               commit to its visibility (p50, p99);
//   interval    the same with EMBSTORE_FOLLOWER_INTERVAL_ONLY: woken by the interval alone, as
//               on a file system without inotify (NFS);
//   interval_paced  the same with apply_bytes_per_second at --paced-bytes-per-second (below);
//   apply       --rounds rounds in which the trainer trains and commits one delta, then waits;
//               the lookups are counted for --idle-ms with nothing to apply, then during a
//               poll that applies the delta. Lookups/s of each, and the lookup latency.
//   paced       the same rounds with the follower's apply_bytes_per_second at
//               --paced-bytes-per-second: a longer apply that leaves lookups more of the memory
//               bandwidth and caches.
// Every lookup batch's start and end are recorded, and a batch that straddles a window counts
// for the part of it inside. The follower's versions are checked against the trainer's.
// --serving-codec (issue 35): the trainer's deltas also get values-only files in that codec
// (serving_deltas), which the followers read; each phase reports the bytes its follower read per
// delta against the bytes of the deltas' whole row files, from the same deltas.
#include <embstore/embstore.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "io/codec/block_codec.hpp"
#include "io/format/commit.hpp"
#include "io/format/manifest.hpp"
#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

// What the follower process asks of the trainer, one byte each.
constexpr char kTrainVersions = 'L';  // --versions deltas while training goes on
constexpr char kTrainOne = 'R';       // one delta, then wait
// The trainer's answer: the newest version committed and the rows the deltas wrote, and the
// bytes of their row files and of their values-only files (their manifests').
struct TrainerReply {
  uint64_t version = 0;
  uint64_t rows = 0;
  uint64_t row_file_bytes = 0;
  uint64_t serving_bytes = 0;
};

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void write_all(int fd, const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  while (n > 0) {
    const ssize_t w = ::write(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) throw std::runtime_error(fmt::format("pipe write: {}", std::strerror(errno)));
    c += w;
    n -= static_cast<size_t>(w);
  }
}

// false at end of file (the other process is gone).
bool read_all(int fd, void* p, size_t n) {
  char* c = static_cast<char*>(p);
  while (n > 0) {
    const ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw std::runtime_error(fmt::format("pipe read: {}", std::strerror(errno)));
    if (r == 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

struct Params {
  std::string dir;
  size_t steps_per_version = 50;
  size_t versions = 20;
  size_t rounds = 20;
  uint32_t poll_interval_ms = 100;
  unsigned lookup_threads = 0;
  size_t lookup_batch = 1024;
  unsigned idle_ms = 200;
  double paced_bytes_per_second = 5e8;
  std::string serving_codec = "off";  // or a codec: values-only deltas in it
};

// The table's serving codec for --serving-codec, or none for "off".
std::optional<embstore_codec_t> serving_codec_of(const std::string& name) {
  if (name == "off") return std::nullopt;
  io::Codec codec;
  if (!io::codec_from_name(name, &codec)) {
    throw std::invalid_argument(fmt::format("--serving-codec: unknown codec '{}'", name));
  }
  return static_cast<embstore_codec_t>(codec);
}

// Adds the bytes of version's row files and values-only files (its manifest's) to *r.
void add_delta_bytes(const std::string& dir, uint64_t version, TrainerReply* r) {
  io::Manifest m;
  std::string detail;
  if (io::read_manifest(dir + "/" + io::version_dir_name(version, false), &m, &detail) != 0) {
    throw std::runtime_error(fmt::format("delta {}: {}", version, detail));
  }
  for (const io::TableEntry& t : m.tables) {
    for (const io::FileEntry& f : t.files) r->row_file_bytes += f.bytes;
    for (const io::FileEntry& f : t.serving) r->serving_bytes += f.bytes;
  }
}

// The bytes a phase's follower read per delta (its stats) against the bytes of the deltas'
// whole row files, and of their values-only files, as their manifests give them.
void report_bytes(Report& report, const std::string& key, const embstore_follower_stats_t& s,
                  const TrainerReply& r, size_t deltas) {
  const double n = static_cast<double>(std::max<size_t>(deltas, 1));
  const double read = static_cast<double>(s.delta_bytes_read) / n;
  const double whole = static_cast<double>(r.row_file_bytes) / n;
  report.set(key + "_follower_bytes_per_delta", read);
  report.set(key + "_row_file_bytes_per_delta", whole);
  report.set(key + "_serving_bytes_per_delta", static_cast<double>(r.serving_bytes) / n);
  report.set(key + "_serving_files_read", s.serving_files_read);
  report.set(key + "_serving_fallbacks", s.serving_fallbacks);
  report.set(key + "_read_to_row_files", whole > 0 ? read / whole : 0.0);
  report.say("{:>14}: the follower read {}B a delta: {:.1f}% of the {}B of its row files", key,
             si(read), whole > 0 ? 100 * read / whole : 0.0, si(whole));
}

// The trainer process: answers each command until the pipe closes. Returns its exit code.
int trainer_main(const CommonOptions& o, const Params& p, int commands, int replies) {
  Store store(o);
  const embstore_backend_t backend = store.backend();
  const std::optional<embstore_codec_t> serving = serving_codec_of(p.serving_codec);
  embstore_table_t* table = create_table(
      store, "follow", o.dim, EMBSTORE_OPT_ADAGRAD,
      [&](embstore_table_config_t& c) { c.serving_codec = serving.value_or(EMBSTORE_CODEC_NONE); });
  // Deltas only: no rebaseline turns one into a full checkpoint mid-phase.
  embstore_checkpoint_policy_t policy;
  embstore_checkpoint_policy_init(&policy);
  policy.max_chain_length = 0;
  policy.rebaseline_fraction = 0;
  policy.serving_deltas = serving ? 1 : 0;
  check(embstore_checkpoint_set_policy(store.get(), &policy), "embstore_checkpoint_set_policy");
  fill_table(table, backend, o.key_space, o.dim);

  uint64_t step = 1;
  check(embstore_step(store.get(), step), "embstore_step");
  uint64_t version = 0;
  check(embstore_checkpoint(store.get(), p.dir.c_str(), EMBSTORE_CKPT_FULL, &version),
        "embstore_checkpoint");
  check(embstore_checkpoint_wait(store.get(), version), "embstore_checkpoint_wait");
  TrainerReply reply{version, checkpoint_stats(store.get()).rows_written};
  write_all(replies, &reply, sizeof(reply));

  const ZipfSampler zipf(o.key_space, o.zipf);
  SplitMix64 rng(o.seed);
  std::vector<int64_t> keys(o.batch);
  std::vector<float> grads(o.batch * o.dim);
  for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);
  BackendBuffer<int64_t> d_keys(backend, o.batch);
  BackendBuffer<float> d_grads(backend, grads.size());
  BackendBuffer<float> d_out(backend, o.batch * o.dim);
  d_grads.upload(grads.data(), grads.size());
  std::vector<uint64_t> deltas;  // of the command being answered
  const auto train_version = [&] {
    for (size_t s = 0; s < p.steps_per_version; ++s) {
      check(embstore_step(store.get(), ++step), "embstore_step");
      for (int64_t& k : keys) k = key_of_rank(zipf(rng));
      d_keys.upload(keys.data(), keys.size());
      check(embstore_lookup(table, d_keys.data(), o.batch, d_out.data(), EMBSTORE_LOOKUP_INSERT,
                            nullptr),
            "embstore_lookup");
      check(embstore_apply_gradients(table, d_keys.data(), d_grads.data(), o.batch, nullptr),
            "embstore_apply_gradients");
    }
    backend_sync(backend);
    check(embstore_step(store.get(), ++step), "embstore_step");
    // Written while the next steps train (a checkpoint still in flight is finished first).
    check(embstore_checkpoint(store.get(), p.dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &version),
          "embstore_checkpoint");
    deltas.push_back(version);
  };

  char command = 0;
  while (read_all(commands, &command, 1)) {
    const uint64_t rows_before = checkpoint_stats(store.get()).rows_written;
    const size_t count = command == kTrainVersions ? p.versions : 1;
    deltas.clear();
    for (size_t v = 0; v < count; ++v) train_version();
    check(embstore_checkpoint_wait(store.get(), version), "embstore_checkpoint_wait");
    reply = {version, checkpoint_stats(store.get()).rows_written - rows_before};
    for (uint64_t d : deltas) add_delta_bytes(p.dir, d, &reply);
    write_all(replies, &reply, sizeof(reply));
  }
  return 0;
}

// The trainer process seen from the follower's side: forked at construction, asked over a pipe,
// reaped at destruction (closing the pipe ends it).
class TrainerProcess {
 public:
  TrainerProcess(const CommonOptions& o, const Params& p) {
    int commands[2], replies[2];
    if (::pipe2(commands, O_CLOEXEC) != 0 || ::pipe2(replies, O_CLOEXEC) != 0) {
      throw std::runtime_error(fmt::format("pipe: {}", std::strerror(errno)));
    }
    std::fflush(nullptr);
    pid_ = ::fork();
    if (pid_ < 0) throw std::runtime_error(fmt::format("fork: {}", std::strerror(errno)));
    if (pid_ == 0) {
      ::close(commands[1]);
      ::close(replies[0]);
      int code = 1;
      try {
        code = trainer_main(o, p, commands[0], replies[1]);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "embstore-perf follow: the trainer process: %s\n", e.what());
      } catch (...) {  // nothing may unwind into the parent's frames (its directory, its report)
        std::fprintf(stderr, "embstore-perf follow: the trainer process failed\n");
      }
      std::fflush(nullptr);
      ::_exit(code);
    }
    ::close(commands[0]);
    ::close(replies[1]);
    commands_ = commands[1];
    replies_ = replies[0];
  }
  ~TrainerProcess() {
    if (pid_ > 0) finish();
  }
  // Ends the trainer (its command pipe closes) and returns its wait status.
  int finish() {
    ::close(commands_);
    ::close(replies_);
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
    return status;
  }
  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;

  void ask(char command) { write_all(commands_, &command, 1); }
  TrainerReply reply() {
    TrainerReply r;
    if (!read_all(replies_, &r, sizeof(r))) {
      throw std::runtime_error("the trainer process ended early (its error is above)");
    }
    return r;
  }

 private:
  pid_t pid_ = -1;
  int commands_ = -1, replies_ = -1;
};

// One lookup batch: when it started and ended (steady clock, ns).
struct Batch {
  int64_t start, end;
};

// Threads looking up Zipf batches in a follower until stopped, recording every batch.
class Lookups {
 public:
  Lookups(embstore_follower_t* follower, const CommonOptions& o, const Params& p, unsigned threads,
          uint64_t seed)
      : batches_(threads) {
    for (unsigned t = 0; t < threads; ++t) {
      threads_.emplace_back([this, follower, &o, &p, t, seed] {
        const std::vector<int64_t> keys =
            zipf_key_stream(p.lookup_batch * 256, o.key_space, o.zipf, seed + 131 * t);
        std::vector<float> out(p.lookup_batch * o.dim);
        for (size_t b = 0; !stop_.load(std::memory_order_relaxed); b = (b + 1) % 256) {
          const int64_t start = now_ns();
          const embstore_status_t st =
              embstore_follower_lookup(follower, "follow", keys.data() + b * p.lookup_batch,
                                       p.lookup_batch, out.data(), nullptr);
          if (st != EMBSTORE_OK) {
            failed_ = true;
            break;
          }
          batches_[t].push_back({start, now_ns()});
        }
      });
    }
  }
  ~Lookups() { join(); }
  Lookups(const Lookups&) = delete;
  Lookups& operator=(const Lookups&) = delete;

  // Joins the threads; throws when a lookup failed.
  void stop() {
    join();
    if (failed_) throw std::runtime_error("a follower lookup failed");
  }
  const std::vector<std::vector<Batch>>& batches() const { return batches_; }

 private:
  void join() {
    stop_ = true;
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

  std::atomic<bool> stop_{false}, failed_{false};
  std::vector<std::vector<Batch>> batches_;
  std::vector<std::thread> threads_;
};

// Lookups inside a set of windows: batches (a straddling one counts for the part inside) per
// second of window, and the latency of batches that overlap a window.
struct WindowFigures {
  double seconds = 0, batches = 0;
  std::vector<double> latencies;
  double rate() const { return seconds > 0 ? batches / seconds : 0; }
};

WindowFigures in_windows(const Lookups& lookups, const std::vector<Batch>& windows) {
  WindowFigures f;
  for (const Batch& w : windows) f.seconds += 1e-9 * static_cast<double>(w.end - w.start);
  for (const std::vector<Batch>& thread : lookups.batches()) {
    for (const Batch& b : thread) {
      double inside = 0;
      for (const Batch& w : windows) {
        inside += static_cast<double>(
            std::max<int64_t>(0, std::min(b.end, w.end) - std::max(b.start, w.start)));
      }
      if (inside <= 0) continue;
      f.batches += inside / static_cast<double>(std::max<int64_t>(1, b.end - b.start));
      f.latencies.push_back(1e-9 * static_cast<double>(b.end - b.start));
    }
  }
  return f;
}

embstore_follower_stats_t follower_stats(embstore_follower_t* f) {
  embstore_follower_stats_t s;
  s.struct_size = sizeof(s);
  check(embstore_follower_stats(f, &s), "embstore_follower_stats");
  return s;
}

class FollowerHandle {
 public:
  FollowerHandle(const std::string& dir, uint32_t poll_interval_ms, uint32_t flags,
                 uint64_t apply_bytes_per_second = 0) {
    embstore_follower_config_t c;
    embstore_follower_config_init(&c);
    c.dir = dir.c_str();
    c.backend = EMBSTORE_BACKEND_HOST;
    c.poll_interval_ms = poll_interval_ms;
    c.flags = flags;
    c.apply_bytes_per_second = apply_bytes_per_second;
    check(embstore_follower_create(&c, &f_), "embstore_follower_create");
  }
  ~FollowerHandle() { embstore_follower_destroy(f_); }
  FollowerHandle(const FollowerHandle&) = delete;
  FollowerHandle& operator=(const FollowerHandle&) = delete;
  embstore_follower_t* get() const { return f_; }
  uint64_t version() const {
    uint64_t v = 0;
    check(embstore_follower_version(f_, &v), "embstore_follower_version");
    return v;
  }
  // Up to 60 s (a bound for a hung run, not a goal) for the background polls to reach version.
  bool reaches(uint64_t version) const {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (this->version() != version) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }

 private:
  embstore_follower_t* f_ = nullptr;
};

class FollowScenario final : public Scenario {
 public:
  const char* name() const override { return "follow"; }
  const char* description() const override {
    return "a follower process beside a trainer process: lag from commit to visibility, lookup "
           "throughput while deltas are applied against idle";
  }

  void set_defaults(CommonOptions& o) const override {
    o.backend = "host";
    o.dim = 64;
    o.batch = 16384;
    o.key_space = 1'000'000;  // the table's rows: every rank of the Zipf streams has one
  }

  void add_options(CLI::App& app) override {
    app.add_option("--dir", p_.dir, "directory the checkpoints are written under")->required();
    app.add_option("--steps-per-version", p_.steps_per_version, "training steps per delta")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))
        ->capture_default_str();
    app.add_option("--versions", p_.versions, "deltas in each live phase")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))
        ->capture_default_str();
    app.add_option("--rounds", p_.rounds, "apply/idle rounds (one delta each)")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))
        ->capture_default_str();
    app.add_option("--poll-interval-ms", p_.poll_interval_ms, "the live followers' interval")
        ->check(CLI::Range(1u, 30'000u))
        ->capture_default_str();
    app.add_option("--lookup-threads", p_.lookup_threads,
                   "follower lookup threads (0: one per core but one, at least one)")
        ->capture_default_str();
    app.add_option("--lookup-batch", p_.lookup_batch, "keys per follower lookup")
        ->check(CLI::Range(size_t{1}, size_t{1} << 24))
        ->capture_default_str();
    app.add_option("--idle-ms", p_.idle_ms, "each round's idle window")
        ->check(CLI::Range(1u, 60'000u))
        ->capture_default_str();
    app.add_option("--paced-bytes-per-second", p_.paced_bytes_per_second,
                   "then the rounds again with the follower's apply_bytes_per_second (0: skip)")
        ->check(CLI::NonNegativeNumber)
        ->capture_default_str();
    app.add_option("--serving-codec", p_.serving_codec,
                   "values-only deltas for the followers in this codec (none, lossless, bf16, "
                   "int8); off: the whole deltas")
        ->capture_default_str();
    app.add_flag("--keep", keep_, "keep the checkpoint directory");
  }

  int run(const CommonOptions& o, Report& report) override {
    const ScenarioDir scenario_dir(p_.dir, "follow", keep_);
    Params p = p_;
    p.dir = scenario_dir.path();
    const unsigned threads = p.lookup_threads > 0
                                 ? p.lookup_threads
                                 : std::max(2u, std::thread::hardware_concurrency()) - 1;
    int code = 0;
    size_t deltas = 0;  // asked of the trainer
    const auto mismatch = [&](const std::string& what) {
      report.say("MISMATCH: {}", what);
      code = kExitMismatch;
    };
    report_common(report, o, backend_from_name(o.backend));
    report.set("steps_per_version", p.steps_per_version);
    report.set("versions", p.versions);
    report.set("rounds", p.rounds);
    report.set("poll_interval_ms", p.poll_interval_ms);
    report.set("lookup_threads", threads);
    report.set("lookup_batch", p.lookup_batch);
    report.set("idle_ms", p.idle_ms);
    report.set("paced_bytes_per_second", p.paced_bytes_per_second);
    report.set("serving_codec", p.serving_codec);
    serving_codec_of(p.serving_codec);  // a bad name fails here, before the fork
    report.set("cores", std::thread::hardware_concurrency());

    // A trainer that ended early makes writes to its pipe fail (EPIPE), not kill this process.
    std::signal(SIGPIPE, SIG_IGN);
    // No thread exists yet in this process: the fork copies nothing half-done.
    TrainerProcess trainer(o, p);
    const TrainerReply full = trainer.reply();
    report.say(
        "trainer: {} rows x dim {} (Adagrad), full checkpoint {}; deltas of {} steps of {} "
        "keys (Zipf {})",
        full.rows, o.dim, full.version, p.steps_per_version, o.batch, o.zipf);

    // The live phases: a background follower beside training.
    const auto live = [&](const char* phase, uint32_t flags, uint64_t bytes_per_second) {
      FollowerHandle follower(p.dir, p.poll_interval_ms, flags, bytes_per_second);
      Lookups lookups(follower.get(), o, p, threads, o.seed + 1);
      const Stopwatch watch;
      const int64_t start = now_ns();
      trainer.ask(kTrainVersions);
      deltas += p.versions;
      const TrainerReply r = trainer.reply();
      if (!follower.reaches(r.version)) {
        mismatch(fmt::format("{}: the follower stayed at version {}, the trainer committed {}",
                             phase, follower.version(), r.version));
      }
      const double seconds = watch.seconds();
      const int64_t end = now_ns();
      lookups.stop();
      // The version is readable before its poll has finished counting it; a poll of ours
      // waits for the background one to end (polls take turns), and finds nothing new.
      check(embstore_follower_poll(follower.get(), nullptr), "embstore_follower_poll");
      embstore_follower_stats_t s = follower_stats(follower.get());
      --s.polls;
      if (s.versions_applied != p.versions || s.full_loads != 1 || s.chain_lost != 0 ||
          s.last_poll_status != EMBSTORE_OK) {
        mismatch(
            fmt::format("{}: {} deltas applied of {}, {} whole loads, {} chains lost, last "
                        "poll {}",
                        phase, s.versions_applied, p.versions, s.full_loads, s.chain_lost,
                        embstore_status_name(s.last_poll_status)));
      }
      const WindowFigures all = in_windows(lookups, {{start, end}});
      const std::string key(phase);
      report.set(key + "_lag_p50_seconds", s.lag_p50_seconds);
      report.set(key + "_lag_p99_seconds", s.lag_p99_seconds);
      report.set(key + "_versions_applied", s.versions_applied);
      report.set(key + "_polls", s.polls);
      report.set(key + "_delta_rows_mean", static_cast<double>(r.rows) / p.versions);
      report.set(key + "_seconds", seconds);
      report.set(key + "_lookups_per_second", all.batches * p.lookup_batch / seconds);
      report.say(
          "{:>14}: {} deltas ({:.0f} rows each) in {:.1f} s; lag from commit to visibility "
          "p50 {:.1f} ms, p99 {:.1f} ms ({} polls); {}keys/s looked up meanwhile",
          phase, s.versions_applied, static_cast<double>(r.rows) / p.versions, seconds,
          s.lag_p50_seconds * 1e3, s.lag_p99_seconds * 1e3, s.polls,
          si(all.batches * p.lookup_batch / seconds));
      report_bytes(report, key, s, r, p.versions);
    };
    live("live", 0, 0);
    live("interval", EMBSTORE_FOLLOWER_INTERVAL_ONLY, 0);
    if (p.paced_bytes_per_second > 0) {
      live("interval_paced", EMBSTORE_FOLLOWER_INTERVAL_ONLY,
           static_cast<uint64_t>(p.paced_bytes_per_second));
    }

    // Apply against idle: the trainer waits while the follower is measured. Then the same with
    // the follower's polls paced.
    const auto rounds = [&](const char* phase, uint64_t bytes_per_second) {
      FollowerHandle follower(p.dir, 0, 0, bytes_per_second);
      Lookups lookups(follower.get(), o, p, threads, o.seed + 2);
      std::vector<Batch> idle, applying;
      std::vector<double> apply_seconds;
      uint64_t delta_rows = 0;
      TrainerReply all;  // the rounds' bytes
      for (size_t round = 0; round < p.rounds; ++round) {
        trainer.ask(kTrainOne);
        ++deltas;
        const TrainerReply r = trainer.reply();
        delta_rows += r.rows;
        all.row_file_bytes += r.row_file_bytes;
        all.serving_bytes += r.serving_bytes;
        const int64_t idle_start = now_ns();
        std::this_thread::sleep_for(std::chrono::milliseconds(p.idle_ms));
        const int64_t apply_start = now_ns();
        uint64_t v = 0;
        check(embstore_follower_poll(follower.get(), &v), "embstore_follower_poll");
        const int64_t apply_end = now_ns();
        if (v != r.version) {
          mismatch(fmt::format("{} round {}: the poll reached {}, the trainer committed {}", phase,
                               round, v, r.version));
        }
        idle.push_back({idle_start, apply_start});
        applying.push_back({apply_start, apply_end});
        apply_seconds.push_back(1e-9 * static_cast<double>(apply_end - apply_start));
      }
      lookups.stop();
      const WindowFigures i = in_windows(lookups, idle), a = in_windows(lookups, applying);
      const double idle_rate = i.rate() * p.lookup_batch, apply_rate = a.rate() * p.lookup_batch;
      const double ratio = idle_rate > 0 ? apply_rate / idle_rate : 0;
      const double rows = static_cast<double>(delta_rows) / p.rounds;
      const double longest = *std::max_element(apply_seconds.begin(), apply_seconds.end());
      const std::string key(phase);
      report.set(key + "_bytes_per_second", bytes_per_second);
      report.set(key + "_delta_rows_mean", rows);
      report.set(key + "_seconds_median", median(apply_seconds));
      report.set(key + "_seconds_max", longest);
      report.set(key + "_lookups_per_second_idle", idle_rate);
      report.set(key + "_lookups_per_second_applying", apply_rate);
      report.set(key + "_throughput_to_idle", ratio);
      report.set(key + "_batch_seconds_p50_idle", percentile(i.latencies, 0.5));
      report.set(key + "_batch_seconds_p99_idle", percentile(i.latencies, 0.99));
      report.set(key + "_batch_seconds_p50_applying", percentile(a.latencies, 0.5));
      report.set(key + "_batch_seconds_p99_applying", percentile(a.latencies, 0.99));
      report.set(key + "_batch_seconds_max_applying", percentile(a.latencies, 1.0));
      report.say(
          "{:>14}: {} rounds, deltas of {:.0f} rows applied in {:.1f} ms (median), {:.1f} ms "
          "(max){}",
          phase, p.rounds, rows, median(apply_seconds) * 1e3, longest * 1e3,
          bytes_per_second > 0 ? fmt::format(", paced at {}B/s", si(bytes_per_second)) : "");
      report.say(
          "                lookups ({} threads, {} keys a batch): {}keys/s while applying, "
          "{}keys/s "
          "idle: {:.1f}%; batch p50/p99 {:.0f}/{:.0f} us applying, {:.0f}/{:.0f} us idle",
          threads, p.lookup_batch, si(apply_rate), si(idle_rate), 100 * ratio,
          percentile(a.latencies, 0.5) * 1e6, percentile(a.latencies, 0.99) * 1e6,
          percentile(i.latencies, 0.5) * 1e6, percentile(i.latencies, 0.99) * 1e6);
      report_bytes(report, key, follower_stats(follower.get()), all, p.rounds);
    };
    rounds("apply", 0);
    if (p.paced_bytes_per_second > 0) rounds("paced", p.paced_bytes_per_second);
    report.set("steps", deltas * p.steps_per_version);  // the trainer's, after the fill
    if (const int status = trainer.finish(); !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      throw std::runtime_error(
          fmt::format("the trainer process ended with wait status {}", status));
    }
    return code;
  }

 private:
  Params p_;
  bool keep_ = false;
};

}  // namespace

std::unique_ptr<Scenario> make_follow_scenario() { return std::make_unique<FollowScenario>(); }

}  // namespace embstore::perf
