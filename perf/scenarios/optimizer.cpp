// Scenario `optimizer`: fused update throughput (embstore_apply_gradients) on Zipf batches over
// a pre-populated table, with dirty marking on and off in the same run, to measure what
// marking costs. Marking is toggled on the internal table (Table::set_dirty_tracking), which
// the C API does not expose.
//
// The key space defaults to 1,000,000 so population takes about a second; every key of the
// stream then has a row, so no update is skipped. To see a cost of about 1% on a shared
// machine the two modes alternate over many short rounds (ON/OFF, then OFF/ON, ...), each
// round running the same batches in both modes; the medians, the best rounds and the median
// of the per-round paired costs are reported.
#include <embstore/embstore.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <vector>

#include "host/store/store.hpp"
#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

// Distinct gradient batches cycled over the stream: enough that no batch repeats its
// neighbour, few enough to stay small next to the table.
constexpr size_t kGradientBatches = 4;

size_t unique_count(const int64_t* keys, size_t n, std::vector<int64_t>& scratch) {
  scratch.assign(keys, keys + n);
  std::sort(scratch.begin(), scratch.end());
  return std::unique(scratch.begin(), scratch.end()) - scratch.begin();
}

class OptimizerScenario final : public Scenario {
 public:
  const char* name() const override { return "optimizer"; }
  const char* description() const override {
    return "fused update throughput (apply_gradients) with dirty marking on vs off";
  }

  void set_defaults(CommonOptions& o) const override {
    o.key_space = 1'000'000;
    o.steps = 100;
  }

  void add_options(CLI::App& app) override {
    app.add_option("--optimizer", optimizer_, "optimizer of the table")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--rounds", rounds_,
                   "ON/OFF rounds; the --steps batches per mode are split over them")
        ->check(CLI::Range(size_t{1}, size_t{1} << 20))
        ->capture_default_str();
    app.add_option("--warmup", warmup_, "untimed batches per mode before the first round")
        ->capture_default_str();
  }

  int run(const CommonOptions& o, Report& report) override {
    const size_t per_round = std::max<size_t>(1, o.steps / rounds_);
    const size_t timed_batches = per_round * rounds_;
    const size_t stream_batches = timed_batches + warmup_;
    const Stopwatch generation;
    const std::vector<int64_t> keys =
        zipf_key_stream(stream_batches * o.batch, o.key_space, o.zipf, o.seed);
    std::vector<float> grads(kGradientBatches * o.batch * o.dim);
    SplitMix64 rng(o.seed ^ 0x67726164ull);
    for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);
    std::vector<int64_t> scratch;
    double unique_rows = 0;
    for (size_t b = 0; b < timed_batches; ++b) {
      unique_rows += unique_count(keys.data() + b * o.batch, o.batch, scratch);
    }
    const double unique_rows_per_batch = unique_rows / timed_batches;
    const double generation_seconds = generation.seconds();

    Store store(o);
    const embstore_backend_t backend = store.backend();
    embstore_table_t* table =
        create_table(store, "perf_optimizer", o.dim, optimizer_from_name(optimizer_));

    BackendBuffer<int64_t> device_keys(backend, keys.size());
    device_keys.upload(keys.data(), keys.size());
    BackendBuffer<float> device_grads(backend, grads.size());
    device_grads.upload(grads.data(), grads.size());

    // Every rank of the key space gets its row before anything is timed.
    const double populate_seconds = populate(table, backend, o);
    const embstore_table_stats_t populated = table_stats(table);

    uint64_t step = 0;
    auto run_batches = [&](size_t first, size_t count) {
      for (size_t b = first; b < first + count; ++b) {
        check(embstore_step(store.get(), ++step), "embstore_step");
        check(embstore_apply_gradients(
                  table, device_keys.data() + b * o.batch,
                  device_grads.data() + (b % kGradientBatches) * o.batch * o.dim, o.batch, nullptr),
              "embstore_apply_gradients");
      }
      backend_sync(backend);
    };
    auto timed_block = [&](bool marking, size_t first) {
      table->impl->set_dirty_tracking(marking);
      const Stopwatch t;
      run_batches(first, per_round);
      return t.elapsed();
    };

    for (bool marking : {true, false}) {
      table->impl->set_dirty_tracking(marking);
      run_batches(timed_batches, warmup_);
    }
    std::vector<double> on_rates, off_rates, paired_costs, on_cpu_rates, off_cpu_rates;
    Elapsed on_total, off_total;
    const double keys_per_round = static_cast<double>(per_round * o.batch);
    for (size_t r = 0; r < rounds_; ++r) {
      // Alternating which mode goes first cancels drift within a round.
      Elapsed on, off;
      if (r % 2 == 0) {
        on = timed_block(true, r * per_round);
        off = timed_block(false, r * per_round);
      } else {
        off = timed_block(false, r * per_round);
        on = timed_block(true, r * per_round);
      }
      on_total += on;
      off_total += off;
      on_rates.push_back(keys_per_round / on.wall);
      off_rates.push_back(keys_per_round / off.wall);
      on_cpu_rates.push_back(keys_per_round / on.cpu);
      off_cpu_rates.push_back(keys_per_round / off.cpu);
      paired_costs.push_back(1.0 - off.wall / on.wall);
    }
    table->impl->set_dirty_tracking(true);
    const embstore_table_stats_t stats = table_stats(table);

    const double on_median = median(on_rates), off_median = median(off_rates);
    const double on_best = *std::max_element(on_rates.begin(), on_rates.end());
    const double off_best = *std::max_element(off_rates.begin(), off_rates.end());
    const double cost = 1.0 - on_median / off_median;
    const double cost_best = 1.0 - on_best / off_best;
    const double cost_paired = median(paired_costs);
    const double on_cpu_median = median(on_cpu_rates), off_cpu_median = median(off_cpu_rates);
    const double cost_cpu = 1.0 - on_cpu_median / off_cpu_median;
    const bool ok = stats.skipped_keys == 0 && stats.rows == populated.rows;

    report.say(
        "optimizer: {}, marking on {}keys/s, off {}keys/s, cost {:.2f}%  (medians of {} rounds)",
        optimizer_, si(on_median), si(off_median), 100 * cost, rounds_);
    report.say(
        "           best rounds: on {}keys/s, off {}keys/s, cost {:.2f}%; paired median {:.2f}%; "
        "cpu-time medians {:.2f}%",
        si(on_best), si(off_best), 100 * cost_best, 100 * cost_paired, 100 * cost_cpu);
    report.say("           round spread: on {:.2f}..{:.2f}, off {:.2f}..{:.2f} Mkeys/s",
               *std::min_element(on_rates.begin(), on_rates.end()) / 1e6, on_best / 1e6,
               *std::min_element(off_rates.begin(), off_rates.end()) / 1e6, off_best / 1e6);
    report.say(
        "           {} batches of {} keys per mode ({} per round), {:.0f} unique rows per batch; "
        "dim {}, zipf {} over {} rows (populated in {:.2f} s); backend {}, {} thread(s)",
        timed_batches, o.batch, per_round, unique_rows_per_batch, o.dim, o.zipf, populated.rows,
        populate_seconds, backend_name(backend), o.threads);
    if (!ok) {
      report.say("check:     FAILED: {} gradient keys skipped, rows {} -> {}", stats.skipped_keys,
                 populated.rows, stats.rows);
    }

    report_common(report, o, backend);
    report.set("optimizer", optimizer_);
    report.set("rounds", rounds_);
    report.set("batches_per_round", per_round);
    report.set("warmup_batches", warmup_);
    report.set("rows", populated.rows);
    report.set("stream_generation_seconds", generation_seconds);
    report.set("populate_seconds", populate_seconds);
    report.set("update_unit", "gradient keys applied, duplicates included");
    report.set("unique_rows_per_batch", unique_rows_per_batch);
    report.set("updates_per_second_marking_on", on_median);
    report.set("updates_per_second_marking_off", off_median);
    report.set("best_updates_per_second_marking_on", on_best);
    report.set("best_updates_per_second_marking_off", off_best);
    report.set("rows_per_second_marking_on", on_median * unique_rows_per_batch / o.batch);
    report.set("rows_per_second_marking_off", off_median * unique_rows_per_batch / o.batch);
    report.set("cpu_updates_per_second_marking_on", on_cpu_median);
    report.set("cpu_updates_per_second_marking_off", off_cpu_median);
    report.set("seconds_marking_on", on_total.wall);
    report.set("seconds_marking_off", off_total.wall);
    report.set("cpu_seconds_marking_on", on_total.cpu);
    report.set("cpu_seconds_marking_off", off_total.cpu);
    report.set("marking_cost_fraction", cost);
    report.set("marking_cost_fraction_best", cost_best);
    report.set("marking_cost_fraction_paired_median", cost_paired);
    report.set("marking_cost_fraction_cpu", cost_cpu);
    report.set("skipped_keys", stats.skipped_keys);
    return ok ? 0 : kExitMismatch;
  }

 private:
  // Inserts ranks 1..key_space in batches; returns the seconds it took.
  static double populate(embstore_table_t* table, embstore_backend_t backend,
                         const CommonOptions& o) {
    const Stopwatch t;
    std::vector<int64_t> batch_keys;
    BackendBuffer<int64_t> device_keys(backend, o.batch);
    BackendBuffer<float> out(backend, o.batch * o.dim);
    for (uint64_t first = 1; first <= o.key_space; first += o.batch) {
      const uint64_t last = std::min<uint64_t>(o.key_space, first + o.batch - 1);
      batch_keys.clear();
      for (uint64_t rank = first; rank <= last; ++rank) batch_keys.push_back(key_of_rank(rank));
      device_keys.upload(batch_keys.data(), batch_keys.size());
      check(embstore_lookup(table, device_keys.data(), batch_keys.size(), out.data(),
                            EMBSTORE_LOOKUP_INSERT, nullptr),
            "embstore_lookup");
    }
    backend_sync(backend);
    return t.seconds();
  }

  std::string optimizer_ = "adagrad";
  size_t rounds_ = 20;  // short blocks, many pairs: the median shrugs off bursts of load
  size_t warmup_ = 2;
};

}  // namespace

std::unique_ptr<Scenario> make_optimizer_scenario() {
  return std::make_unique<OptimizerScenario>();
}

}  // namespace embstore::perf
