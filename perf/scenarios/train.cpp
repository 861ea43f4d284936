// Scenario `train`: what checkpointing costs a training loop. The embedding work alone is the
// step (lookup with insert, apply_gradients, embstore_step; no simulated dense compute, so
// this is the worst case), over a Zipf stream whose new keys keep growing the table. The same
// stream runs on fresh stores with checkpointing off, and on with a policy taking an
// incremental checkpoint every --incremental-every steps (and a full one every --full-every;
// the first is full in any case, and the rebaseline rule applies with its defaults). --repeat
// N runs N of each, in the order off on, on off, off on, ..., so that a drift of the machine
// over the run weighs on both; steps/s are over all runs of a kind, and each pair's cost (an
// off run and an on run back to back) is reported too, with the pairs' median and range.
//
// --evict-idle-steps N and --max-capacity R give the table an eviction rule (idle steps, and
// least recently used at R rows), on both kinds of run: the table's rows, the rows evicted and
// the deltas' sizes (with their tombstones) are reported. --admit-after N gives it feature
// admission (exact counting, or a counting Bloom filter of --admit-bloom-mib MiB): the keys
// admitted, those still pending and the gradient keys skipped are reported too.
//
// Reported: steps/s off and on and their ratio; per checkpoint, the training-thread stall
// (the embstore_step call that captured it, plus the training calls' waits for staging room
// while it was written: embstore_checkpoint_info's stall_seconds) with its p99 and max; each
// checkpoint's kind, rows, bytes and write time.
//
// The keys of every step are drawn before the timed loops, so both runs time the store alone.
// Checkpoints go into a fresh directory under --dir, removed afterwards unless --keep.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

struct Run {
  double seconds = 0;  // the timed loop
  std::vector<double> step_seconds;
  std::vector<double> capture_call_seconds;  // on: the embstore_step calls that captured
  // Sums over the steps of each part of a step: copying the keys to the backend, the training
  // calls (lookup, apply_gradients and the device synchronization), embstore_step, and the
  // embstore_checkpoint_info that asks whether that step captured one (on runs only).
  double upload = 0, calls = 0, step_call = 0, info = 0;
  std::vector<embstore_checkpoint_info_t> checkpoints;
  embstore_checkpoint_stats_t stats{};
  uint64_t rows = 0;
  uint64_t evicted = 0;
  uint64_t admitted = 0, pending = 0, skipped = 0;
};

class TrainScenario final : public Scenario {
 public:
  const char* name() const override { return "train"; }
  const char* description() const override {
    return "training steps/s with incremental checkpoints on against off, stall per checkpoint";
  }

  void add_options(CLI::App& app) override {
    app.add_option("--dir", dir_, "directory the checkpoints are written under")
        ->capture_default_str();
    app.add_option("--incremental-every", incremental_every_,
                   "an incremental checkpoint every K steps")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 40))
        ->capture_default_str();
    app.add_option("--full-every", full_every_,
                   "a full checkpoint every M steps (0: only the first)")
        ->capture_default_str();
    app.add_option("--optimizer", optimizer_, "optimizer of the table")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--staging-mib", staging_mib_, "staging_bytes of the store, in MiB")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    app.add_option("--repeat", repeat_, "runs of each kind, alternating which goes first")
        ->check(CLI::Range(1, 100))
        ->capture_default_str();
    app.add_option("--evict-idle-steps", evict_idle_steps_,
                   "evict rows untouched for more steps (0: never)")
        ->capture_default_str();
    app.add_option("--max-capacity", max_capacity_,
                   "rows at most; with an eviction rule the least recently used make room")
        ->capture_default_str();
    app.add_option("--admit-after", admit_after_,
                   "a key gets its row at its N-th occurrence (0 or 1: at once)")
        ->capture_default_str();
    app.add_option("--admit-bloom-mib", admit_bloom_mib_,
                   "count admission in a counting Bloom filter of this many MiB (0: exactly)")
        ->capture_default_str();
    app.add_flag("--keep", keep_, "keep the checkpoint directory");
  }

  // --steps is not given a default: it is chosen in run() from --incremental-every.
  void set_defaults(CommonOptions& o) const override { o.steps = 0; }

  int run(const CommonOptions& options, Report& report) override {
    CommonOptions o = options;
    // At least three incremental checkpoints, and the interval after the last one.
    if (o.steps == 0) o.steps = std::max<uint64_t>(300, 4 * incremental_every_);
    const ScenarioDir scenario_dir(dir_, "train", keep_);
    const std::string& dir = scenario_dir.path();

    report.say("drawing {} steps of {} keys (Zipf {} over {})", o.steps, o.batch, o.zipf,
               o.key_space);
    const std::vector<int64_t> stream =
        zipf_key_stream(o.steps * o.batch, o.key_space, o.zipf, o.seed);
    std::vector<float> grads(o.batch * o.dim);
    SplitMix64 rng(o.seed ^ 0x747261696eull);
    for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);

    Run off, on;                                                  // all runs of a kind together
    std::vector<double> paired_costs, sps_runs_off, sps_runs_on;  // per pair of runs
    auto add = [](Run& all, Run r) {
      all.seconds += r.seconds;
      all.step_seconds.insert(all.step_seconds.end(), r.step_seconds.begin(), r.step_seconds.end());
      all.capture_call_seconds.insert(all.capture_call_seconds.end(),
                                      r.capture_call_seconds.begin(), r.capture_call_seconds.end());
      all.checkpoints.insert(all.checkpoints.end(), r.checkpoints.begin(), r.checkpoints.end());
      all.stats.deferred += r.stats.deferred;
      all.stats.copy_on_write_rows += r.stats.copy_on_write_rows;
      if (all.rows != 0 && all.rows != r.rows) all.rows = UINT64_MAX;  // flagged below
      if (all.rows == 0) all.rows = r.rows;
      all.evicted += r.evicted;
      all.admitted += r.admitted;
      all.pending += r.pending;
      all.skipped += r.skipped;
    };
    nlohmann::ordered_json parts_off = nlohmann::ordered_json::array();
    nlohmann::ordered_json parts_on = nlohmann::ordered_json::array();
    for (unsigned i = 0; i < repeat_; ++i) {
      double pair_sps[2] = {0, 0};  // off, on
      for (const bool checkpointing : {i % 2 == 1, i % 2 == 0}) {
        const std::string run_dir = fmt::format("{}/{}", dir, i);
        Run r = train(o, stream, grads, checkpointing ? run_dir : "");
        pair_sps[checkpointing ? 1 : 0] = o.steps / r.seconds;
        // Where a step's time goes, per step: a cost that the calls do not show is the
        // machine's (on a GPU, the copies and the driver), not the store's.
        const double per = 1e6 / static_cast<double>(o.steps);
        report.say(
            "  run {} checkpointing {}: {:.2f} steps/s (per step: keys copied {:.1f} us, "
            "lookup + apply {:.1f} us, embstore_step {:.1f} us, info {:.1f} us)",
            i + 1, checkpointing ? "on" : "off", o.steps / r.seconds, r.upload * per, r.calls * per,
            r.step_call * per, r.info * per);
        (checkpointing ? parts_on : parts_off)
            .push_back({{"upload_seconds_per_step", r.upload / o.steps},
                        {"calls_seconds_per_step", r.calls / o.steps},
                        {"step_call_seconds_per_step", r.step_call / o.steps},
                        {"info_seconds_per_step", r.info / o.steps}});
        add(checkpointing ? on : off, std::move(r));
        std::error_code ec;
        if (!keep_) std::filesystem::remove_all(run_dir, ec);
      }
      sps_runs_off.push_back(pair_sps[0]);
      sps_runs_on.push_back(pair_sps[1]);
      paired_costs.push_back(1.0 - pair_sps[1] / pair_sps[0]);
    }

    const double sps_off = repeat_ * o.steps / off.seconds;
    const double sps_on = repeat_ * o.steps / on.seconds;
    std::vector<double> stalls;
    uint64_t fulls = 0, deltas = 0, delta_bytes = 0, full_bytes = 0;
    for (size_t i = 0; i < on.checkpoints.size(); ++i) {
      const embstore_checkpoint_info_t& c = on.checkpoints[i];
      stalls.push_back(on.capture_call_seconds[i] + c.stall_seconds);
      if (c.kind == EMBSTORE_CKPT_FULL) {
        ++fulls;
        full_bytes += c.bytes_written;
      } else {
        ++deltas;
        delta_bytes += c.bytes_written;
      }
    }
    const double stall_p99 = percentile(stalls, 0.99);
    const double stall_max = stalls.empty() ? 0 : *std::max_element(stalls.begin(), stalls.end());

    report_common(report, o, backend_);
    report.set("optimizer", optimizer_);
    report.set("incremental_every", incremental_every_);
    report.set("full_every", full_every_);
    report.set("staging_bytes", size_t{staging_mib_} << 20);
    report.set("repeat", repeat_);
    report.set("rows", on.rows);
    report.set("evict_idle_steps", evict_idle_steps_);
    report.set("max_capacity", max_capacity_);
    report.set("evicted", on.evicted / repeat_);
    report.set("admit_after", admit_after_);
    report.set("admit_bloom_bytes", uint64_t{admit_bloom_mib_} << 20);
    report.set("admitted", on.admitted / repeat_);
    report.set("pending_admission", on.pending / repeat_);
    report.set("skipped_keys", on.skipped / repeat_);
    report.set("steps_per_second_off", sps_off);
    report.set("steps_per_second_on", sps_on);
    report.set("steps_per_second_ratio", sps_on / sps_off);
    // The spread of the pairs (each an off run and an on run back to back): on a shared machine
    // one pair's cost says little; the median and the range say how far to trust it.
    report.set("steps_per_second_runs_off", sps_runs_off);
    report.set("steps_per_second_runs_on", sps_runs_on);
    report.set("step_parts_runs_off", std::move(parts_off));
    report.set("step_parts_runs_on", std::move(parts_on));
    report.set("cost_fraction_pairs", paired_costs);
    report.set("cost_fraction_paired_median", median(paired_costs));
    report.set("cost_fraction_paired_min",
               *std::min_element(paired_costs.begin(), paired_costs.end()));
    report.set("cost_fraction_paired_max",
               *std::max_element(paired_costs.begin(), paired_costs.end()));
    report.set("step_seconds_p99_off", percentile(off.step_seconds, 0.99));
    report.set("step_seconds_p99_on", percentile(on.step_seconds, 0.99));
    // The slowest step: a one-time cost (on CUDA before 8b9b572, pinning the staging ring on a
    // thread beside training) shows there, where a short run's steps/s spreads it over all.
    report.set("step_seconds_max_off", percentile(off.step_seconds, 1.0));
    report.set("step_seconds_max_on", percentile(on.step_seconds, 1.0));
    report.set("checkpoints", on.checkpoints.size());
    report.set("checkpoints_full", fulls);
    report.set("checkpoints_incremental", deltas);
    report.set("checkpoints_deferred", on.stats.deferred);
    report.set("full_bytes_mean", fulls > 0 ? full_bytes / fulls : 0);
    report.set("delta_bytes_mean", deltas > 0 ? delta_bytes / deltas : 0);
    report.set("stall_seconds_p99", stall_p99);
    report.set("stall_seconds_max", stall_max);
    report.set("capture_call_seconds_max", on.capture_call_seconds.empty()
                                               ? 0.0
                                               : *std::max_element(on.capture_call_seconds.begin(),
                                                                   on.capture_call_seconds.end()));
    report.set("copy_on_write_rows", on.stats.copy_on_write_rows);

    report.say(
        "table: dim {} ({}), {} steps of {} keys, {} rows at the end, {} evicted, {} backend",
        o.dim, optimizer_, o.steps, o.batch, on.rows, on.evicted / repeat_, backend_name(backend_));
    if (admit_after_ > 1) {
      report.say(
          "admission after {} occurrences ({}): {} keys admitted, {} pending{}, {} gradient "
          "keys skipped",
          admit_after_,
          admit_bloom_mib_ ? fmt::format("Bloom filter of {} MiB", admit_bloom_mib_)
                           : std::string("exact"),
          on.admitted / repeat_, on.pending / repeat_,
          admit_bloom_mib_ ? " (estimate: distinct keys counted)" : "", on.skipped / repeat_);
    }
    for (size_t i = 0; i < on.checkpoints.size(); ++i) {
      const embstore_checkpoint_info_t& c = on.checkpoints[i];
      const double mb_s = c.write_seconds > 0 ? c.bytes_written / c.write_seconds : 0;
      report.say(
          "  checkpoint {:>7} {:<11} {:>9} rows {:>9}B in {:6.3f} s ({}B/s); stall {:6.2f} ms "
          "(capture call {:.2f}, waits {:.2f}), {} rows copied on write",
          c.version, c.kind == EMBSTORE_CKPT_FULL ? "full" : "incremental", c.rows_written,
          si(static_cast<double>(c.bytes_written)), c.write_seconds, si(mb_s), stalls[i] * 1e3,
          on.capture_call_seconds[i] * 1e3, c.stall_seconds * 1e3, c.copy_on_write_rows);
    }
    report.say(
        "steps/s: {:.2f} off, {:.2f} on ({} checkpoints: {} full, {} incremental, {} deferred): "
        "{:.1f}% fewer",
        sps_off, sps_on, on.checkpoints.size(), fulls, deltas, on.stats.deferred,
        100.0 * (1.0 - sps_on / sps_off));
    report.say(
        "pairs of runs (off and on back to back): cost median {:.1f}%, range {:.1f}% .. {:.1f}%",
        100.0 * median(paired_costs),
        100.0 * *std::min_element(paired_costs.begin(), paired_costs.end()),
        100.0 * *std::max_element(paired_costs.begin(), paired_costs.end()));
    report.say("training-thread stall per checkpoint: p99 {:.2f} ms, max {:.2f} ms",
               stall_p99 * 1e3, stall_max * 1e3);
    report.say("slowest step: off {:.2f} ms, on {:.2f} ms", percentile(off.step_seconds, 1.0) * 1e3,
               percentile(on.step_seconds, 1.0) * 1e3);
    for (const embstore_checkpoint_info_t& c : on.checkpoints) {
      if (c.status != EMBSTORE_OK) {
        report.say("MISMATCH: checkpoint {} failed: {}", c.version, embstore_status_name(c.status));
        return kExitMismatch;
      }
    }
    if (on.rows != off.rows || on.rows == UINT64_MAX) {
      report.say("MISMATCH: the runs ended with different row counts");
      return kExitMismatch;
    }
    return 0;
  }

 private:
  // One pass over the stream on a fresh store; checkpointing when dir is not empty.
  Run train(const CommonOptions& o, const std::vector<int64_t>& stream,
            const std::vector<float>& grads, const std::string& dir) {
    embstore_store_config_t config = Store::default_config();
    config.staging_bytes = size_t{staging_mib_} << 20;
    Store store(o, config);
    backend_ = store.backend();
    embstore_table_t* table =
        create_table(store, "perf_train", o.dim, optimizer_from_name(optimizer_),
                     [&](embstore_table_config_t& c) {
                       c.evict_idle_steps = evict_idle_steps_;
                       c.max_capacity = max_capacity_;
                       if (max_capacity_ != 0)
                         c.initial_capacity = std::min<uint64_t>(max_capacity_, 1 << 20);
                       c.evict_when_full = max_capacity_ != 0 ? 1 : 0;
                       c.admit_after = admit_after_;
                       c.admit_bloom_bytes = uint64_t{admit_bloom_mib_} << 20;
                     });
    if (!dir.empty()) {
      embstore_checkpoint_policy_t policy;
      embstore_checkpoint_policy_init(&policy);
      policy.dir = dir.c_str();
      policy.incremental_every_steps = incremental_every_;
      policy.full_every_steps = full_every_;
      check(embstore_checkpoint_set_policy(store.get(), &policy), "embstore_checkpoint_set_policy");
    }
    BackendBuffer<int64_t> d_keys(backend_, o.batch);
    BackendBuffer<float> d_grads(backend_, grads.size());
    BackendBuffer<float> d_out(backend_, o.batch * o.dim);
    d_grads.upload(grads.data(), grads.size());

    Run run;
    run.step_seconds.reserve(o.steps);
    const Stopwatch total;
    for (uint64_t s = 1; s <= o.steps; ++s) {
      const Stopwatch w;
      d_keys.upload(stream.data() + (s - 1) * o.batch, o.batch);
      const double uploaded = w.seconds();
      run.upload += uploaded;
      check(embstore_lookup(table, d_keys.data(), o.batch, d_out.data(), EMBSTORE_LOOKUP_INSERT,
                            nullptr),
            "embstore_lookup");
      check(embstore_apply_gradients(table, d_keys.data(), d_grads.data(), o.batch, nullptr),
            "embstore_apply_gradients");
      backend_sync(backend_);
      run.calls += w.seconds() - uploaded;
      const Stopwatch step_call;
      check(embstore_step(store.get(), s), "embstore_step");
      const double step_call_seconds = step_call.seconds();
      run.step_call += step_call_seconds;
      run.step_seconds.push_back(w.seconds());
      if (!dir.empty()) {
        // A policy checkpoint taken at this step is named by it.
        embstore_checkpoint_info_t info;
        info.struct_size = sizeof(info);
        const Stopwatch asked;
        const embstore_status_t found = embstore_checkpoint_info(store.get(), s, &info);
        run.info += asked.seconds();
        if (found == EMBSTORE_OK) {
          run.capture_call_seconds.push_back(step_call_seconds);
          run.checkpoints.push_back(info);
        }
      }
    }
    run.seconds = total.seconds();

    if (!run.checkpoints.empty()) {
      check(embstore_checkpoint_wait(store.get(), run.checkpoints.back().version),
            "embstore_checkpoint_wait");
      for (embstore_checkpoint_info_t& info : run.checkpoints) {
        check(embstore_checkpoint_info(store.get(), info.version, &info),
              "embstore_checkpoint_info");
      }
    }
    if (!dir.empty()) run.stats = checkpoint_stats(store.get());
    const embstore_table_stats_t ts = table_stats(table);
    run.rows = ts.rows;
    run.evicted = ts.evicted;
    run.admitted = ts.admitted;
    run.pending = ts.pending_admission;
    run.skipped = ts.skipped_keys;
    return run;
  }

  std::string dir_ = "/tmp";
  uint64_t incremental_every_ = 100;
  uint64_t full_every_ = 0;
  std::string optimizer_ = "adagrad";
  unsigned staging_mib_ = 256;
  unsigned repeat_ = 2;
  uint64_t evict_idle_steps_ = 0;
  uint64_t max_capacity_ = 0;
  uint32_t admit_after_ = 1;
  uint32_t admit_bloom_mib_ = 0;
  bool keep_ = false;
  embstore_backend_t backend_ = EMBSTORE_BACKEND_HOST;
};

}  // namespace

std::unique_ptr<Scenario> make_train_scenario() { return std::make_unique<TrainScenario>(); }

}  // namespace embstore::perf
