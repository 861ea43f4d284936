// Scenario `step`: the training step's breakdown, per call, on either backend: lookup with
// insert, apply_gradients and embstore_step each timed over the same batches, then the whole
// step (the three in a loop), for a grid of key distributions (Zipf exponents and uniform) and
// batch sizes. Each cell runs on a fresh store and table:
//   warm-up   --warmup steps of the whole step (untimed): the hot keys have rows, buffers are
//             grown, the device's kernels are loaded;
//   lookup    --steps calls of embstore_lookup(INSERT) over --steps batches, then one sync;
//   apply     --steps calls of embstore_apply_gradients over the same batches, then one sync;
//   step      --steps calls of embstore_step;
//   train     --steps whole steps over as many further batches: steps/s.
// A call's time is its phase's time over its calls: what a loop that does not wait for the
// device in between sees (on CUDA the calls queue; on the host each returns when done).
// Reported per cell: the per-call times, keys/s of lookup and apply, the mean distinct keys and
// the mean count of the hottest key per batch, train steps/s. --rounds R repeats every cell R
// times (fresh stores) and reports the medians.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <string>
#include <unordered_map>
#include <vector>

#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

struct Cell {
  std::string dist;  // "uniform" or the Zipf exponent as given
  size_t batch = 0;
  double lookup = 0, apply = 0, step = 0;  // seconds per call
  double train_steps_per_second = 0;
  double distinct = 0, hottest = 0;  // per batch, means
  uint64_t skipped = 0;
  bool ok = true;  // the table's rows and skipped keys as the stream implies
};

class StepScenario final : public Scenario {
 public:
  const char* name() const override { return "step"; }
  const char* description() const override {
    return "the training step's breakdown per call (lookup, apply_gradients, step) over key "
           "distributions and batch sizes";
  }

  void set_defaults(CommonOptions& o) const override { o.steps = 20; }

  void add_options(CLI::App& app) override {
    app.add_option("--dists", dists_,
                   "key distributions: Zipf exponents (> 0) or 'uniform', comma-separated")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--batches", batches_, "batch sizes, comma-separated")
        ->delimiter(',')
        ->check(CLI::Range(size_t{1}, size_t{1} << 31))
        ->capture_default_str();
    app.add_option("--optimizer", optimizer_, "optimizer of the table")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--warmup", warmup_, "untimed whole steps before the timed phases")
        ->capture_default_str();
    app.add_option("--rounds", rounds_, "runs of every cell on fresh stores (medians reported)")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    app.add_option("--admit-after", admit_after_,
                   "a key gets its row at its N-th occurrence (0 or 1: at once)")
        ->capture_default_str();
  }

  int run(const CommonOptions& o, Report& report) override {
    for (const std::string& d : dists_) {
      if (d != "uniform" && !(std::strtod(d.c_str(), nullptr) > 0)) {
        throw std::runtime_error(fmt::format("--dists: '{}' is neither 'uniform' nor > 0", d));
      }
    }
    report.say("{:>8} {:>8} {:>9} {:>8} | {:>10} {:>10} {:>9} | {:>9} {:>9} | {:>9}", "dist",
               "batch", "distinct", "hottest", "lookup us", "apply us", "step us", "lookup/s",
               "apply/s", "train/s");
    std::vector<Cell> cells;
    embstore_backend_t backend = EMBSTORE_BACKEND_HOST;
    for (const std::string& dist : dists_) {
      for (const size_t batch : batches_) {
        std::vector<Cell> runs;
        for (int r = 0; r < rounds_; ++r) runs.push_back(run_cell(o, dist, batch, &backend));
        Cell c = runs[0];
        for (const Cell& x : runs) c.ok = c.ok && x.ok;
        auto med = [&](double Cell::*field) {
          std::vector<double> v;
          for (const Cell& x : runs) v.push_back(x.*field);
          return median(v);
        };
        c.lookup = med(&Cell::lookup);
        c.apply = med(&Cell::apply);
        c.step = med(&Cell::step);
        c.train_steps_per_second = med(&Cell::train_steps_per_second);
        report.say(
            "{:>8} {:>8} {:>9.0f} {:>8.0f} | {:>10.1f} {:>10.1f} {:>9.2f} | {:>9} {:>9} | {:>9.1f}",
            dist, batch, c.distinct, c.hottest, c.lookup * 1e6, c.apply * 1e6, c.step * 1e6,
            si(batch / c.lookup), si(batch / c.apply), c.train_steps_per_second);
        cells.push_back(c);
      }
    }
    report.say(
        "per call: each phase's time over its {} calls (one sync at the end); dim {}, {}, "
        "key space {}, {} backend, {} thread(s), median of {} round(s)",
        o.steps, o.dim, optimizer_, o.key_space, backend_name(backend), o.threads, rounds_);

    report_common(report, o, backend);
    report.set("optimizer", optimizer_);
    report.set("warmup", warmup_);
    report.set("rounds", rounds_);
    report.set("admit_after", admit_after_);
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const Cell& c : cells) {
      nlohmann::ordered_json j;
      j["dist"] = c.dist;
      j["batch"] = c.batch;
      j["distinct_keys_per_batch"] = c.distinct;
      j["hottest_key_count_per_batch"] = c.hottest;
      j["lookup_seconds_per_call"] = c.lookup;
      j["apply_seconds_per_call"] = c.apply;
      j["step_seconds_per_call"] = c.step;
      j["lookup_keys_per_second"] = c.batch / c.lookup;
      j["apply_keys_per_second"] = c.batch / c.apply;
      j["train_steps_per_second"] = c.train_steps_per_second;
      list.push_back(std::move(j));
    }
    report.set("cells", std::move(list));
    for (const Cell& c : cells) {
      if (!c.ok) {
        report.say(
            "MISMATCH: dist {}, batch {}: rows or skipped keys ({}) not as the stream implies",
            c.dist, c.batch, c.skipped);
        return kExitMismatch;
      }
    }
    return 0;
  }

 private:
  Cell run_cell(const CommonOptions& o, const std::string& dist, size_t batch,
                embstore_backend_t* backend_out) {
    const size_t warm = warmup_ * batch, timed = o.steps * batch;
    const size_t total = warm + 2 * timed;  // warm-up, the phases' batches, the train batches
    const std::vector<int64_t> keys =
        dist == "uniform"
            ? uniform_key_stream(total, o.key_space, o.seed)
            : zipf_key_stream(total, o.key_space, std::strtod(dist.c_str(), nullptr), o.seed);
    Cell cell;
    cell.dist = dist;
    cell.batch = batch;
    {
      std::unordered_map<int64_t, uint32_t> counts;
      for (size_t s = 0; s < o.steps; ++s) {
        counts.clear();
        uint32_t hottest = 0;
        for (size_t i = 0; i < batch; ++i) {
          hottest = std::max(hottest, ++counts[keys[warm + s * batch + i]]);
        }
        cell.distinct += static_cast<double>(counts.size()) / o.steps;
        cell.hottest += static_cast<double>(hottest) / o.steps;
      }
    }
    std::vector<float> grads(batch * o.dim);
    SplitMix64 rng(o.seed ^ 0x73746570ull);
    for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);

    Store store(o);
    const embstore_backend_t backend = store.backend();
    *backend_out = backend;
    embstore_table_t* table =
        create_table(store, "perf_step", o.dim, optimizer_from_name(optimizer_),
                     [&](embstore_table_config_t& c) { c.admit_after = admit_after_; });
    BackendBuffer<int64_t> d_keys(backend, keys.size());
    d_keys.upload(keys.data(), keys.size());
    BackendBuffer<float> d_grads(backend, grads.size());
    d_grads.upload(grads.data(), grads.size());
    BackendBuffer<float> d_out(backend, batch * o.dim);

    uint64_t step = 0;
    auto at = [&](size_t b) { return d_keys.data() + b * batch; };
    auto lookup = [&](size_t b) {
      check(embstore_lookup(table, at(b), batch, d_out.data(), EMBSTORE_LOOKUP_INSERT, nullptr),
            "embstore_lookup");
    };
    auto apply = [&](size_t b) {
      check(embstore_apply_gradients(table, at(b), d_grads.data(), batch, nullptr),
            "embstore_apply_gradients");
    };
    auto next_step = [&] { check(embstore_step(store.get(), ++step), "embstore_step"); };
    auto whole_steps = [&](size_t first, size_t count) {
      for (size_t b = first; b < first + count; ++b) {
        lookup(b);
        apply(b);
        next_step();
      }
      backend_sync(backend);
    };
    auto per_call = [&](auto&& call) {
      const Stopwatch t;
      for (size_t s = 0; s < o.steps; ++s) call(warmup_ + s);
      backend_sync(backend);
      return t.seconds() / static_cast<double>(o.steps);
    };

    whole_steps(0, warmup_);
    cell.lookup = per_call(lookup);
    cell.apply = per_call(apply);
    cell.step = per_call([&](size_t) { next_step(); });
    const Stopwatch t;
    whole_steps(warmup_ + o.steps, o.steps);
    cell.train_steps_per_second = static_cast<double>(o.steps) / t.seconds();
    // Every gradient key was looked up with insert first: none may be skipped (without
    // admission), and the rows are the distinct keys seen.
    const embstore_table_stats_t stats = table_stats(table);
    cell.skipped = stats.skipped_keys;
    if (admit_after_ <= 1) {
      std::vector<int64_t> seen(keys);
      std::sort(seen.begin(), seen.end());
      cell.ok =
          stats.skipped_keys == 0 &&
          stats.rows == static_cast<uint64_t>(std::unique(seen.begin(), seen.end()) - seen.begin());
    }
    return cell;
  }

  std::vector<std::string> dists_{"0.8", "1.1", "1.3", "uniform"};
  std::vector<size_t> batches_{8192, 65536, 1048576};
  std::string optimizer_ = "adagrad";
  size_t warmup_ = 3;
  int rounds_ = 1;
  uint32_t admit_after_ = 1;
};

}  // namespace

std::unique_ptr<Scenario> make_step_scenario() { return std::make_unique<StepScenario>(); }

}  // namespace embstore::perf
