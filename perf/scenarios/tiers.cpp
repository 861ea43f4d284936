// Scenario `tiers`: what a table's tiers cost a training loop: the host backend's SSD tier below
// memory_rows, or the CUDA backend's host memory below device_rows (rows there read and written
// by the kernels over the bus). For each key distribution in --dists (Zipf exponents or
// 'uniform') and each first-tier share in --shares, a fresh store and table of --rows rows (the
// budget = share x rows; share 1 is the untiered table, budget 0, and the baseline of its
// distribution) is:
//   filled    every key of the key space inserted by lookups with EMBSTORE_LOOKUP_INSERT, in
//             batches of 65536 (untimed; the host's tiered tables move most rows down on the
//             way), in rank order (the hottest keys first) or, with --fill-order scattered, in
//             an order unrelated to heat: the CUDA device tier keeps the rows created first,
//             so rank order is its best case and scattered its fair one;
//   warmed    --warmup whole steps (untimed);
//   saved     one full checkpoint into a fresh directory, timed from embstore_checkpoint to
//             embstore_checkpoint_wait (not in steps/s): a tiered table's drain reads every
//             row below the first tier back;
//   trained   --steps timed whole steps: lookup with insert, embstore_prefetch of the next
//             step's keys (unless --no-prefetch; the warm-up steps too), --dense-ms of waiting
//             (the dense part of a step, which a GPU runs while the host thread waits: 0 by
//             default), apply_gradients of fixed pseudo-random gradients, embstore_step; each
//             call timed on its own too (the host backend's calls return when done, tier moves
//             included, except a prefetch's moves, which go on in the background until the next
//             call that needs their rows; on CUDA each call is followed by a device
//             synchronization, inside its time);
//   saved     one incremental checkpoint, timed from embstore_checkpoint to
//             embstore_checkpoint_wait: its delta holds the rows the timed steps touched.
// The key space is [1, --rows] by rank (keys key_of_rank(rank), as every scenario draws them):
// the fill inserts all of it and the streams (perf/zipf.hpp) draw from it, so the table never
// grows while timed. --key-space is not used: the report's key_space is --rows. Every share of
// a distribution trains on the same keys: the warm-up's drawn as the steps go, the timed steps'
// drawn ahead, after the full checkpoint (in memory: --steps x --batch keys, at most 1 GiB; freed
// before the resident memory at the end is read), as a trainer's input pipeline has its batches
// ready; each timed step copies its batch to where the backend reads it.
//
// Reported per cell: steps/s and its ratio to the untiered table's steps/s of the same
// distribution (taken in the same run; never asserted); the mean time per step of lookup,
// apply_gradients and embstore_step, and outside them, of copying a batch's keys to the backend
// (steps/s counts it: on a GPU a gap between the calls' sum and the step shows there) and of
// drawing them (ahead: not in steps/s); rows moved up and down and the SSD tier's bytes read and
// written per timed step (deltas of the table's stats); rows in memory at the end; the
// process's resident memory (VmRSS) after the fill and at the end; the incremental
// checkpoint's time and bytes (embstore_checkpoint_info). A cell's working files (the tier's
// file, the checkpoints) live under a directory in --dir (the checkpoints under one in
// --ckpt-dir when given), which must be on a disk, not tmpfs; its checkpoints are removed after
// the cell and the directories at the end, unless --keep.
//
// Defaults: 2 distributions x 4 shares of a 1,000,000-row dim-64 Adagrad table (512 B of value
// and state a row), 20 timed steps of 16384 keys (not the harness's 100 of 65536) after 5
// warm-up steps: about 50 s on two cores, in about equal parts the fills, the full checkpoints
// (each writes every row) and the tiered cells' steps. --batch 65536 takes about twice that.
#include <linux/magic.h>
#include <sys/vfs.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

namespace fs = std::filesystem;

// The process's resident memory (VmRSS in /proc/self/status) in bytes; 0 where unknown.
uint64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.compare(0, 6, "VmRSS:") == 0) {
      return std::strtoull(line.c_str() + 6, nullptr, 10) * 1024;  // "   NNN kB"
    }
  }
  return 0;
}

// Throws unless dir exists on a file system whose pages are not memory (tmpfs, ramfs): the SSD
// tier there would measure memory copies, and embstore_table_create refuses it anyway.
void require_disk(const char* option, const std::string& dir) {
  struct statfs sfs {};
  if (::statfs(dir.c_str(), &sfs) != 0) {
    throw std::runtime_error(fmt::format("{} '{}': {}", option, dir, std::strerror(errno)));
  }
  if (sfs.f_type == TMPFS_MAGIC || sfs.f_type == RAMFS_MAGIC) {
    throw std::runtime_error(fmt::format(
        "{} '{}' is on tmpfs or ramfs: the tier and the checkpoints need a disk", option, dir));
  }
}

struct Cell {
  std::string dist;
  double share = 1;
  uint64_t budget = 0;  // memory_rows (host) or device_rows (CUDA); 0: untiered
  double fill_seconds = 0;
  double steps_per_second = 0;
  double ratio = NAN;  // to the untiered table of dist; NaN: none ran
  double lookup = 0, prefetch = 0, apply = 0, step = 0;  // seconds per timed step
  // Outside the calls, per timed step: drawing a batch's keys (ahead of the timed steps, so
  // not in steps/s), and copying them to where the backend reads them (a device copy on CUDA;
  // in steps/s).
  double draw = 0, upload = 0;
  // The draw's CPU time on its thread, per timed step (below its wall time: the thread waited
  // for a core), and the process's CPU time over the timed steps per wall second (above 1:
  // other threads of the process were busy meanwhile).
  double draw_cpu = 0, cpu_per_wall = 0;
  double moved_up = 0, moved_down = 0;       // rows per timed step
  double bytes_read = 0, bytes_written = 0;  // SSD tier, per timed step
  // At the end: rows, those in the first tier (memory on the host, device memory on CUDA) and
  // below it (the SSD tier on the host, host memory on CUDA).
  uint64_t rows = 0, rows_in_first = 0, rows_below = 0, rows_on_disk = 0;
  uint64_t rss_filled = 0, rss_end = 0;
  double full_seconds = 0;            // the full checkpoint before the timed steps
  uint64_t full_tier_bytes_read = 0;  // the tier's reads while it was written
  double delta_seconds = 0;
  uint64_t delta_bytes = 0, delta_rows = 0;
  uint64_t delta_tier_bytes_read = 0;  // the tier's reads while the delta was written
  bool delta_incremental = true;       // false: the store took it as a full checkpoint
  uint64_t skipped = 0;
  // fold_keys over every batch the cell's steps used, in order; keys_ok: equal to the key
  // stream's own batches.
  uint64_t keys_hash = 0;
  bool keys_ok = true;
};

// The most memory the timed steps' keys, drawn ahead, may take.
constexpr uint64_t kMaxAheadBytes = uint64_t{1} << 30;

// Folds keys[0..n) into h, in order.
uint64_t fold_keys(uint64_t h, const int64_t* keys, size_t n) {
  for (size_t i = 0; i < n; ++i) h = row::mix64(h ^ static_cast<uint64_t>(keys[i])) + i;
  return h;
}

class TiersScenario final : public Scenario {
 public:
  const char* name() const override { return "tiers"; }
  const char* description() const override {
    return "training steps/s, tier moves and SSD bytes per step, memory and an incremental "
           "checkpoint of a table with its first tier (memory_rows on the host backend, "
           "device_rows on CUDA) at shares of its rows";
  }

  void set_defaults(CommonOptions& o) const override {
    o.backend = "host";  // the SSD tier; --backend cuda: the device tier
    o.batch = 16384;
    o.steps = 20;
  }

  void add_options(CLI::App& app) override {
    app.add_option("--rows", rows_, "rows of the table: the key space, all inserted first")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 32))
        ->capture_default_str();
    app.add_option("--dists", dists_,
                   "key distributions: Zipf exponents (> 0) or 'uniform', comma-separated")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--shares", shares_,
                   "rows kept in memory, as shares of --rows in (0, 1], comma-separated (1: "
                   "untiered, the baseline)")
        ->delimiter(',')
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    app.add_option("--memory-share", memory_share_,
                   "CUDA: rows in host memory below the device's (memory_rows), as a share of "
                   "--rows, for the tiered cells; the rest in --dir (an SSD tier below a CUDA "
                   "table). 0: none, every row beyond device_rows in host memory")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    app.add_option("--optimizer", optimizer_, "optimizer of the table")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--warmup", warmup_, "untimed whole steps before the timed ones")
        ->capture_default_str();
    app.add_option("--dir", dir_,
                   "the working directory (tier file, checkpoints) is created under this one; "
                   "it must be on a disk, not tmpfs")
        ->capture_default_str();
    app.add_option("--ckpt-dir", ckpt_parent_,
                   "checkpoints go to a directory created under this one rather than under "
                   "--dir (a tier on a small fast disk, checkpoints elsewhere); on a disk too");
    app.add_flag("--keep", keep_, "keep the working directory and its checkpoints");
    app.add_flag("--prefetch,!--no-prefetch", prefetch_,
                 "each step prefetches the next step's keys after its lookup, as a pipelined "
                 "trainer does (the read overlaps the update)")
        ->capture_default_str();
    app.add_option("--dense-ms", dense_ms_,
                   "milliseconds each step waits between its prefetch and its update, standing "
                   "for the dense forward and backward a GPU runs meanwhile (a prefetch's moves "
                   "go on behind it)")
        ->check(CLI::Range(0.0, 10000.0))
        ->capture_default_str();
    app.add_option("--staging-mib", staging_mib_,
                   "the stores' checkpoint staging (staging_bytes) in MiB; 0: the default "
                   "(256). Resident once a checkpoint fills it: part of the memory reported")
        ->check(CLI::Range(0, 1 << 20))
        ->capture_default_str();
    app.add_option("--fill-order", fill_order_,
                   "order of the fill's inserts: 'rank' (the hottest keys first) or 'scattered' "
                   "(unrelated to heat)")
        ->check(CLI::IsMember({"rank", "scattered"}))
        ->capture_default_str();
  }

  int run(const CommonOptions& options, Report& report) override {
    CommonOptions o = options;
    o.key_space = rows_;
    for (const std::string& d : dists_) {
      if (d != "uniform" && !(std::strtod(d.c_str(), nullptr) > 0)) {
        throw std::runtime_error(fmt::format("--dists: '{}' is neither 'uniform' nor > 0", d));
      }
    }
    for (const double s : shares_) {
      if (!(s > 0 && s <= 1))
        throw std::runtime_error(fmt::format("--shares: {} not in (0, 1]", s));
    }
    if (const uint64_t bytes = uint64_t{o.steps} * o.batch * sizeof(int64_t);
        bytes > kMaxAheadBytes) {
      throw std::runtime_error(fmt::format(
          "--steps {} x --batch {}: the timed steps' keys, drawn ahead, would take {}B of memory "
          "(at most 1 GiB); take fewer steps",
          o.steps, o.batch, si(static_cast<double>(bytes))));
    }
    // The untiered baseline first, so that every tiered cell's ratio is known when printed.
    std::vector<double> shares = shares_;
    std::sort(shares.begin(), shares.end(), std::greater<>());
    shares.erase(std::unique(shares.begin(), shares.end()), shares.end());

    require_disk("--dir", dir_);
    const ScenarioDir work(dir_, name(), keep_);
    const std::string tier_dir = work.path() + "/tier";
    fs::create_directories(tier_dir);
    std::optional<ScenarioDir> ckpt_work;
    // The same directory as --dir: the checkpoints go in the working directory, as without.
    std::error_code same;
    if (!ckpt_parent_.empty() && !fs::equivalent(ckpt_parent_, dir_, same)) {
      require_disk("--ckpt-dir", ckpt_parent_);
      ckpt_work.emplace(ckpt_parent_, name(), keep_);
      fs::create_directories(ckpt_work->path());
    }
    const std::string ckpt_root = ckpt_work ? ckpt_work->path() : work.path();

    std::vector<float> grads(o.batch * o.dim);
    SplitMix64 rng(o.seed ^ 0x7469657273ull);
    for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);

    report.say(
        "{:>7} {:>5} {:>8} | {:>8} {:>5} | {:>7} {:>6} {:>7} {:>7} | {:>7} {:>6} {:>8} | {:>7} "
        "{:>7} | "
        "{:>8} {:>8} | {:>7} | {:>8} {:>8} | {:>6} {:>8} | {:>7} {:>8}",
        "dist", "share", "budget", "steps/s", "ratio", "look ms", "pf ms", "apply ms", "step ms",
        "draw ms", "up ms", "cpu/wall", "up/st", "down/st", "wr B/st", "rd B/st", "in 1st",
        "RSS fill", "RSS end", "full s", "full rd B", "delta s", "delta B");
    std::vector<Cell> cells;
    embstore_backend_t backend = EMBSTORE_BACKEND_HOST;
    for (const std::string& dist : dists_) {
      const double exponent = dist == "uniform" ? 0 : std::strtod(dist.c_str(), nullptr);
      double baseline = NAN;
      // What every cell of dist must have trained on: the key stream's batches, in order.
      uint64_t want_keys = 0;
      {
        KeyStream stream(rows_, exponent, o.seed);
        std::vector<int64_t> batch(o.batch);
        for (size_t b = 0; b < warmup_ + o.steps; ++b) {
          stream.fill(batch.data(), o.batch);
          want_keys = fold_keys(want_keys, batch.data(), o.batch);
        }
      }
      for (const double share : shares) {
        const std::string ckpt_dir = fmt::format("{}/ckpt-{}-{}", ckpt_root, dist, share);
        Cell c = run_cell(o, dist, share, exponent, grads, tier_dir, ckpt_dir, &backend);
        c.keys_ok = c.keys_hash == want_keys;
        std::error_code ec;
        if (!keep_) fs::remove_all(ckpt_dir, ec);
        if (c.budget == 0) baseline = c.steps_per_second;
        c.ratio = c.steps_per_second / baseline;
        report.say(
            "{:>7} {:>5} {:>8} | {:>8.2f} {:>5} | {:>7.1f} {:>6.1f} {:>8.1f} {:>7.2f} | "
            "{:>7.2f} {:>6.2f} {:>8.2f} | {:>7} {:>7} | "
            "{:>8} {:>8} | {:>7} | {:>8} {:>8} | {:>6.2f} {:>8} | {:>7.3f} {:>8}",
            dist, share, c.budget == 0 ? std::string("all") : si(c.budget), c.steps_per_second,
            std::isnan(c.ratio) ? std::string("-") : fmt::format("{:.2f}", c.ratio), c.lookup * 1e3,
            c.prefetch * 1e3, c.apply * 1e3, c.step * 1e3, c.draw * 1e3, c.upload * 1e3,
            c.cpu_per_wall, si(c.moved_up), si(c.moved_down), si(c.bytes_written), si(c.bytes_read),
            si(c.rows_in_first), si(static_cast<double>(c.rss_filled)),
            si(static_cast<double>(c.rss_end)), c.full_seconds,
            si(static_cast<double>(c.full_tier_bytes_read)), c.delta_seconds,
            si(static_cast<double>(c.delta_bytes)));
        cells.push_back(std::move(c));
      }
    }
    report.say(
        "{} rows of dim {} ({}), {} timed steps of {} keys (drawn ahead: draw ms is not in "
        "steps/s, up ms is) after {} warm-up, {}, {} ms of dense "
        "compute each; per step: means over the timed steps; full: the full checkpoint before "
        "them, to its commit, and the tier's reads meanwhile; delta: one incremental checkpoint "
        "after them, to its commit; {} backend ({}), {} thread(s), fill in {} order, --dir {}{}",
        rows_, o.dim, optimizer_, o.steps, o.batch, warmup_,
        prefetch_ ? "each prefetching the next" : "no prefetch", dense_ms_, backend_name(backend),
        backend != EMBSTORE_BACKEND_CUDA ? "budget: memory_rows, the rest on disk"
        : memory_share_ > 0
            ? fmt::format("budget: device_rows, memory_rows {} of the rows, the rest on disk",
                          memory_share_)
            : std::string("budget: device_rows, the rest in host memory"),
        o.threads, fill_order_, dir_,
        ckpt_parent_.empty() ? "" : fmt::format(", --ckpt-dir {}", ckpt_parent_));

    report_common(report, o, backend);
    report.set("rows", rows_);
    report.set("optimizer", optimizer_);
    report.set("warmup", warmup_);
    report.set("prefetch", prefetch_);
    report.set("dense_ms", dense_ms_);
    report.set("dir", dir_);
    report.set("ckpt_dir", ckpt_parent_.empty() ? dir_ : ckpt_parent_);
    report.set("fill_order", fill_order_);
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Cell& c : cells) {
      nlohmann::ordered_json j;
      j["dist"] = c.dist;
      j["share"] = c.share;
      // Each backend's names: memory_rows, rows_in_memory and rows_on_disk on the host;
      // device_rows, rows_in_device and rows_in_memory on CUDA.
      const bool cuda = backend == EMBSTORE_BACKEND_CUDA;
      j[cuda ? "device_rows" : "memory_rows"] = c.budget;
      j["fill_seconds"] = c.fill_seconds;
      j["steps_per_second"] = c.steps_per_second;
      if (std::isnan(c.ratio)) {
        j["steps_per_second_ratio_to_untiered"] = nullptr;
      } else {
        j["steps_per_second_ratio_to_untiered"] = c.ratio;
      }
      j["lookup_seconds_per_step"] = c.lookup;
      j["prefetch_seconds_per_step"] = c.prefetch;
      j["apply_seconds_per_step"] = c.apply;
      j["step_call_seconds_per_step"] = c.step;
      j["keys_drawn_ahead"] = true;  // draw_keys_*: before the timed steps, not in steps/s
      j["keys_match_stream"] = c.keys_ok;
      j["draw_keys_seconds_per_step"] = c.draw;
      j["upload_keys_seconds_per_step"] = c.upload;
      j["draw_keys_thread_cpu_seconds_per_step"] = c.draw_cpu;
      j["process_cpu_seconds_per_wall_second"] = c.cpu_per_wall;
      j["rows_moved_up_per_step"] = c.moved_up;
      j["rows_moved_down_per_step"] = c.moved_down;
      j["tier_bytes_written_per_step"] = c.bytes_written;
      j["tier_bytes_read_per_step"] = c.bytes_read;
      j["rows"] = c.rows;
      j[cuda ? "rows_in_device" : "rows_in_memory"] = c.rows_in_first;
      j[cuda ? "rows_in_memory" : "rows_on_disk"] = c.rows_below - (cuda ? c.rows_on_disk : 0);
      if (cuda) {
        j["memory_share"] = memory_share_;
        j["rows_on_disk"] = c.rows_on_disk;
      }
      j["rss_bytes_after_fill"] = c.rss_filled;
      j["rss_bytes_end"] = c.rss_end;
      j["full_checkpoint_seconds"] = c.full_seconds;
      j["full_checkpoint_tier_bytes_read"] = c.full_tier_bytes_read;
      j["incremental_checkpoint_seconds"] = c.delta_seconds;
      j["incremental_checkpoint_bytes"] = c.delta_bytes;
      j["incremental_checkpoint_rows"] = c.delta_rows;
      j["incremental_checkpoint_was_incremental"] = c.delta_incremental;
      j["incremental_checkpoint_tier_bytes_read"] = c.delta_tier_bytes_read;
      list.push_back(std::move(j));
    }
    report.set("cells", std::move(list));

    int code = 0;
    for (const Cell& c : cells) {
      const bool budget_kept = c.budget == 0 ? c.rows_below == 0 : c.rows_in_first <= c.budget;
      if (c.rows != rows_ || c.rows_in_first + c.rows_below != c.rows || !budget_kept ||
          c.skipped != 0 || !c.delta_incremental || !c.keys_ok) {
        report.say(
            "MISMATCH: dist {}, share {}: {} rows ({} in the first tier, {} below; of {}, budget "
            "{}), "
            "{} skipped keys, delta taken as {}, {}",
            c.dist, c.share, c.rows, c.rows_in_first, c.rows_below, rows_, c.budget, c.skipped,
            c.delta_incremental ? "incremental" : "full",
            c.keys_ok ? "the key stream's batches" : "batches other than the key stream's");
        code = kExitMismatch;
      }
    }
    return code;
  }

 private:
  // exponent: of the Zipf key stream; 0: uniform keys.
  Cell run_cell(const CommonOptions& o, const std::string& dist, double share, double exponent,
                const std::vector<float>& grads, const std::string& tier_dir,
                const std::string& ckpt_dir, embstore_backend_t* backend_out) {
    Cell cell;
    cell.dist = dist;
    cell.share = share;
    cell.budget = share >= 1 ? 0
                             : std::max<uint64_t>(1, static_cast<uint64_t>(std::llround(
                                                         share * static_cast<double>(rows_))));

    embstore_store_config_t config = Store::default_config();
    config.tier_dir = tier_dir.c_str();
    if (staging_mib_ != 0) config.staging_bytes = size_t{staging_mib_} << 20;
    Store store(o, config);
    const embstore_backend_t backend = store.backend();
    *backend_out = backend;
    const bool cuda = backend == EMBSTORE_BACKEND_CUDA;
    if (!cuda && memory_share_ > 0) {
      throw std::runtime_error(
          "--memory-share: the CUDA backend's (on the host, --shares sets "
          "memory_rows)");
    }
    const uint64_t memory_rows =
        cell.budget != 0 ? static_cast<uint64_t>(memory_share_ * static_cast<double>(rows_)) : 0;
    embstore_table_t* table =
        create_table(store, "perf_tiers", o.dim, optimizer_from_name(optimizer_),
                     [&](embstore_table_config_t& c) {
                       (cuda ? c.device_rows : c.memory_rows) = cell.budget;
                       if (cuda) c.memory_rows = memory_rows;
                     });

    const Stopwatch fill;
    fill_table(table, backend, rows_, o.dim,
               fill_order_ == "scattered" ? FillOrder::kScattered : FillOrder::kRank);
    cell.fill_seconds = fill.seconds();
    cell.rss_filled = resident_bytes();

    // Where the backend reads them: host memory, or device memory on CUDA.
    BackendBuffer<float> out(backend, o.batch * o.dim);
    BackendBuffer<float> device_grads(backend, grads.size());
    device_grads.upload(grads.data(), grads.size());
    uint64_t step = 0;
    // Batch b's keys; drawn in order, two batches held where the backend reads them (a step's
    // and the next, prefetched). The warm-up draws each batch as it goes; the timed steps' keys
    // are drawn before them (ahead), as a trainer's input pipeline has its batches ready, so
    // that steps/s is the table's and the copy's alone: on the H200 (2026-11-28) the draw and
    // the copy together took 2.9 ms a step beside 0.34 ms of calls, and ten times that in the
    // tiered cells.
    KeyStream stream(rows_, exponent, o.seed);
    const size_t batches = warmup_ + o.steps;
    std::vector<int64_t> drawn_keys(o.batch);
    std::vector<int64_t> ahead;  // batches ahead_first.. once drawn ahead
    size_t ahead_first = batches;
    BackendBuffer<int64_t> window(backend, 2 * o.batch);
    size_t drawn = 0;  // batches drawn (ahead of those copied into the window, once ahead)
    auto draw = [&](int64_t* out) {
      const Stopwatch d;
      const double cpu_before = thread_cpu_seconds();
      stream.fill(out, o.batch);
      if (drawn >= warmup_) {  // a timed step's batch
        cell.draw += d.seconds();
        cell.draw_cpu += thread_cpu_seconds() - cpu_before;
      }
    };
    size_t uploaded = 0;
    auto at = [&](size_t b) {
      for (; uploaded <= b; ++uploaded) {
        const int64_t* keys = drawn_keys.data();
        if (uploaded >= ahead_first) {
          keys = ahead.data() + (uploaded - ahead_first) * o.batch;
        } else {
          draw(drawn_keys.data());
          ++drawn;
        }
        cell.keys_hash = fold_keys(cell.keys_hash, keys, o.batch);
        const Stopwatch u;
        window.upload(keys, o.batch, (uploaded % 2) * o.batch);
        if (uploaded >= warmup_) cell.upload += u.seconds();  // a timed step's batch
      }
      // Batch b's slot holds it until batch b + 2 is copied there.
      if (uploaded > b + 2) throw std::logic_error("tiers: a step's keys were overwritten");
      return window.data() + (b % 2) * o.batch;
    };
    // The batches not drawn yet: the timed steps' (the first may have been drawn for the
    // warm-up's last prefetch).
    auto draw_ahead = [&] {
      const size_t n = batches - drawn;
      ahead_first = drawn;
      ahead.resize(n * o.batch);
      for (size_t i = 0; i < n; ++i, ++drawn) draw(ahead.data() + i * o.batch);
    };
    auto lookup = [&](size_t b) {
      check(embstore_lookup(table, at(b), o.batch, out.data(), EMBSTORE_LOOKUP_INSERT, nullptr),
            "embstore_lookup");
      backend_sync(backend);
    };
    auto apply = [&](size_t b) {
      check(embstore_apply_gradients(table, at(b), device_grads.data(), o.batch, nullptr),
            "embstore_apply_gradients");
      backend_sync(backend);
    };
    auto next_step = [&] { check(embstore_step(store.get(), ++step), "embstore_step"); };
    auto prefetch_next = [&](size_t b) -> double {  // the call's seconds
      if (!prefetch_ || b + 1 == batches) return 0;
      const int64_t* keys = at(b + 1);  // drawn (and copied) outside the call's time
      const Stopwatch p;
      check(embstore_prefetch(table, keys, o.batch, nullptr), "embstore_prefetch");
      backend_sync(backend);
      return p.seconds();
    };

    const auto dense = [&] {
      if (dense_ms_ > 0)
        std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(dense_ms_));
    };
    for (size_t b = 0; b < warmup_; ++b) {
      lookup(b);
      prefetch_next(b);
      dense();
      apply(b);
      next_step();
    }
    const embstore_table_stats_t warmed = table_stats(table);
    const Stopwatch full_time;
    uint64_t full = 0;
    check(embstore_checkpoint(store.get(), ckpt_dir.c_str(), EMBSTORE_CKPT_FULL, &full),
          "embstore_checkpoint");
    check(embstore_checkpoint_wait(store.get(), full), "embstore_checkpoint_wait");
    cell.full_seconds = full_time.seconds();

    draw_ahead();

    const embstore_table_stats_t before = table_stats(table);
    cell.full_tier_bytes_read = before.tier_bytes_read - warmed.tier_bytes_read;
    const Stopwatch timed;
    for (size_t b = warmup_; b < warmup_ + o.steps; ++b) {
      at(b);  // the batch's keys, drawn and copied before the timed call
      const Stopwatch l;
      lookup(b);
      cell.lookup += l.seconds();
      cell.prefetch += prefetch_next(b);
      dense();
      const Stopwatch a;
      apply(b);
      cell.apply += a.seconds();
      const Stopwatch s;
      next_step();
      cell.step += s.seconds();
    }
    const Elapsed timed_elapsed = timed.elapsed();
    const double seconds = timed_elapsed.wall;
    cell.cpu_per_wall = timed_elapsed.cpu / seconds;
    std::vector<int64_t>().swap(ahead);  // not counted in the resident memory at the end
    const embstore_table_stats_t after = table_stats(table);
    const double n = static_cast<double>(o.steps);
    cell.steps_per_second = n / seconds;
    cell.lookup /= n;
    cell.prefetch /= n;
    cell.apply /= n;
    cell.step /= n;
    cell.draw /= n;
    cell.draw_cpu /= n;
    cell.upload /= n;
    cell.moved_up = static_cast<double>(after.rows_moved_up - before.rows_moved_up) / n;
    cell.moved_down = static_cast<double>(after.rows_moved_down - before.rows_moved_down) / n;
    cell.bytes_read = static_cast<double>(after.tier_bytes_read - before.tier_bytes_read) / n;
    cell.bytes_written =
        static_cast<double>(after.tier_bytes_written - before.tier_bytes_written) / n;

    const Stopwatch delta;
    uint64_t version = 0;
    check(embstore_checkpoint(store.get(), ckpt_dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &version),
          "embstore_checkpoint");
    check(embstore_checkpoint_wait(store.get(), version), "embstore_checkpoint_wait");
    cell.delta_seconds = delta.seconds();
    embstore_checkpoint_info_t info;
    info.struct_size = sizeof(info);
    check(embstore_checkpoint_info(store.get(), version, &info), "embstore_checkpoint_info");
    cell.delta_bytes = info.bytes_written;
    cell.delta_rows = info.rows_written;
    cell.delta_incremental = info.kind == EMBSTORE_CKPT_INCREMENTAL;

    const embstore_table_stats_t end = table_stats(table);
    cell.delta_tier_bytes_read = end.tier_bytes_read - after.tier_bytes_read;
    cell.rows = end.rows;
    cell.rows_in_first = cuda ? end.rows_in_device : end.rows_in_memory;
    cell.rows_below = cuda ? end.rows_in_memory + end.rows_on_disk : end.rows_on_disk;
    cell.rows_on_disk = end.rows_on_disk;
    cell.skipped = end.skipped_keys;
    cell.rss_end = resident_bytes();
    return cell;
  }

  uint64_t rows_ = 1'000'000;
  std::vector<std::string> dists_{"1.1", "uniform"};
  std::vector<double> shares_{1, 0.5, 0.1, 0.01};
  double memory_share_ = 0;  // CUDA: memory_rows as a share of rows_ (tiered cells)
  std::string optimizer_ = "adagrad";
  size_t warmup_ = 5;
  bool prefetch_ = true;
  double dense_ms_ = 0;
  std::string dir_ = "/var/tmp";
  std::string ckpt_parent_;  // empty: checkpoints under dir_
  bool keep_ = false;
  std::string fill_order_ = "rank";
  unsigned staging_mib_ = 0;
};

}  // namespace

std::unique_ptr<Scenario> make_tiers_scenario() { return std::make_unique<TiersScenario>(); }

}  // namespace embstore::perf
