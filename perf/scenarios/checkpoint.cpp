// Scenario `checkpoint`: a full checkpoint of a live store. A table of --rows rows is filled,
// then training runs --steps Zipf batches (lookup, apply_gradients, step) twice: without a
// checkpoint (the baseline), and with a full checkpoint captured at the first step, written in
// the background while training goes on. Reported: how long the checkpoint took to commit
// (full_seconds) and its bytes, what training paid (capture time, the longest wait for the
// pipeline, step times against the baseline), and the rows written against the rows captured.
//
// With --dirty-fraction F, then, with training stopped: a full checkpoint, F of the rows
// updated (spread over the table), and an incremental checkpoint, each timed from the call to
// the commit; the JSON adds delta_seconds and delta_bytes against full_idle_seconds and
// full_idle_bytes.
//
// --codecs V[/S],...: the whole scenario once per codec pair (values' codec V, the optimizer
// state's S, default none), each on a fresh store and table that see the same fill and the same
// batches, so every pair writes the same rows. With more than one pair, every JSON key gets the
// pair's name as a prefix ("int8/bf16.full_bytes") and the ratios of each pair's bytes and
// seconds to the first pair's are reported (the first is the baseline: list none first).
//
// --serving-codec C (issue 35): each pair runs a second time with the table's serving codec C
// and a policy whose serving_dir publishes every version (values only) for followers; keys of
// that run start with "<pair>+serving." and the ratios of its seconds and bytes to the run
// without are reported, with the serving directory's bytes.
//
// The checkpoints are written into a fresh directory under --dir, removed afterwards unless
// --keep.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/codec/block_codec.hpp"
#include "io/format/commit.hpp"
#include "perf/harness.hpp"
#include "perf/report.hpp"
#include "perf/zipf.hpp"

namespace embstore::perf {
namespace {

class CheckpointScenario final : public Scenario {
 public:
  const char* name() const override { return "checkpoint"; }
  const char* description() const override {
    return "full checkpoint of a live store: commit time, bytes, training stall";
  }

  void set_defaults(CommonOptions& o) const override {
    o.batch = 16384;
    o.steps = 50;
  }

  void add_options(CLI::App& app) override {
    app.add_option("--dir", dir_, "directory the checkpoint is written under")->required();
    app.add_option("--rows", rows_, "rows in the table (the key space of the stream)")
        ->check(CLI::Range(uint64_t{1}, uint64_t{1} << 31))
        ->capture_default_str();
    app.add_option("--optimizer", optimizer_, "optimizer of the table")
        ->check(CLI::IsMember(optimizer_names()))
        ->capture_default_str();
    app.add_option("--staging-mib", staging_mib_, "staging_bytes of the store, in MiB")
        ->check(CLI::Range(1, 1 << 20))
        ->capture_default_str();
    app.add_option("--dirty-fraction", dirty_fraction_,
                   "then, idle: a full checkpoint, this fraction of the rows updated, and an "
                   "incremental checkpoint (0: skip)")
        ->check(CLI::Range(0.0, 1.0))
        ->capture_default_str();
    app.add_option("--codecs", codecs_,
                   "codec pairs VALUES[/STATE] (none, lossless, bf16, int8; state default none), "
                   "each run in turn; ratios against the first")
        ->delimiter(',')
        ->capture_default_str();
    app.add_option("--serving-codec", serving_codec_,
                   "also run each pair publishing to a serving_dir, values in this codec "
                   "(none, lossless, bf16, int8; off: not)")
        ->capture_default_str();
    app.add_flag("--keep", keep_, "keep the checkpoint directory");
  }

  int run(const CommonOptions& o, Report& report) override {
    const std::vector<CodecPair> pairs = parse_codecs_option(codecs_);
    if (serving_codec_ != "off") serving_codec_of(serving_codec_);  // a bad name fails first
    const bool several = pairs.size() > 1;
    std::vector<std::map<std::string, double>> results;
    int status = 0;
    for (const CodecPair& pair : pairs) {
      if (several) report.say("codecs {}:", pair.name);
      results.emplace_back();
      status = std::max(status,
                        run_one(o, report, pair, several ? pair.name + "." : "", &results.back()));
      if (serving_codec_ != "off") {
        const std::string name = pair.name + "+serving";
        report.say("codecs {}, publishing to a serving_dir ({} values):", pair.name,
                   serving_codec_);
        std::map<std::string, double> published;
        status = std::max(status, run_one(o, report, pair, name + ".", &published,
                                          serving_codec_of(serving_codec_)));
        report_publishing(report, name, results.back(), published);
      }
    }
    if (several) {
      const std::map<std::string, double>& base = results.front();
      for (size_t i = 1; i < pairs.size(); ++i) {
        const std::map<std::string, double>& r = results[i];
        const std::string prefix = pairs[i].name + ".";
        for (const char* k : {"full_bytes", "full_seconds", "full_idle_bytes", "full_idle_seconds",
                              "delta_bytes", "delta_seconds"}) {
          if (r.count(k) != 0 && base.count(k) != 0 && base.at(k) > 0) {
            report.set(prefix + k + "_ratio", r.at(k) / base.at(k));
          }
        }
        if (r.count("delta_bytes") != 0) {
          report.set(prefix + "delta_to_baseline_full_bytes",
                     r.at("delta_bytes") / base.at("full_idle_bytes"));
        }
        report.say(
            "{} against {}: full {:.3f} of the bytes in {:.2f}x the time while training{}",
            pairs[i].name, pairs[0].name, r.at("full_bytes") / base.at("full_bytes"),
            r.at("full_seconds") / base.at("full_seconds"),
            r.count("delta_bytes") == 0
                ? std::string()
                : fmt::format("; idle full {:.3f} of the bytes in {:.2f}x the time; delta {:.3f} "
                              "of the bytes in {:.2f}x the time, {:.3f}% of {}'s full",
                              r.at("full_idle_bytes") / base.at("full_idle_bytes"),
                              r.at("full_idle_seconds") / base.at("full_idle_seconds"),
                              r.at("delta_bytes") / base.at("delta_bytes"),
                              r.at("delta_seconds") / base.at("delta_seconds"),
                              100.0 * r.at("delta_bytes") / base.at("full_idle_bytes"),
                              pairs[0].name));
      }
    }
    return status;
  }

 private:
  // --serving-codec's codec; std::invalid_argument for an unknown name.
  static embstore_codec_t serving_codec_of(const std::string& name) {
    io::Codec codec = io::Codec::kNone;
    if (!io::codec_from_name(name, &codec)) {
      throw std::invalid_argument(fmt::format("--serving-codec: unknown codec '{}'", name));
    }
    return static_cast<embstore_codec_t>(codec);
  }

  // The publishing run against the one without: seconds and bytes as ratios, and the serving
  // directory's bytes against the checkpoint's.
  static void report_publishing(Report& report, const std::string& name,
                                const std::map<std::string, double>& base,
                                const std::map<std::string, double>& r) {
    std::string line = name + " against without:";
    for (const char* k : {"full_seconds", "full_bytes", "full_idle_seconds", "delta_seconds"}) {
      if (r.count(k) == 0 || base.count(k) == 0 || base.at(k) <= 0) continue;
      report.set(name + "." + k + "_ratio", r.at(k) / base.at(k));
      line += fmt::format(" {} x{:.2f}", k, r.at(k) / base.at(k));
    }
    for (const char* k : {"serving_full_bytes", "serving_delta_bytes"}) {
      if (r.count(k) == 0) continue;
      const char* of = k == std::string("serving_full_bytes") ? "full_idle_bytes" : "delta_bytes";
      if (base.count(of) == 0 || base.at(of) <= 0) continue;
      report.set(name + "." + k + "_to_checkpoint", r.at(k) / base.at(of));
      line += fmt::format("; {} {:.3f} of the checkpoint's", k, r.at(k) / base.at(of));
    }
    report.say("{}", line);
  }

  // The bytes of a version's files in serving_dir, whichever kind it was written as (0 when it
  // is not there).
  static uint64_t version_bytes(const std::string& serving_dir, uint64_t version) {
    uint64_t bytes = 0;
    for (const bool full : {true, false}) {
      std::error_code ec;
      const std::string path = serving_dir + "/" + io::version_dir_name(version, full);
      for (std::filesystem::recursive_directory_iterator it(path, ec), end; !ec && it != end;
           it.increment(ec)) {
        if (it->is_regular_file(ec)) bytes += it->file_size(ec);
      }
    }
    return bytes;
  }

  // Whether the checkpoints between stats b and a were each published (a line when not).
  static bool all_published(Report& report, const embstore_checkpoint_stats_t& b,
                            const embstore_checkpoint_stats_t& a) {
    if (a.serving_published - b.serving_published == a.committed - b.committed) return true;
    report.say("MISMATCH: {} of {} checkpoints published to the serving_dir",
               a.serving_published - b.serving_published, a.committed - b.committed);
    return false;
  }

  // serving: publish every version to a serving_dir, the table's values in that codec.
  int run_one(const CommonOptions& o, Report& report, const CodecPair& pair,
              const std::string& prefix, std::map<std::string, double>* out,
              std::optional<embstore_codec_t> serving = std::nullopt) {
    const auto key = [&](const char* k) { return prefix + k; };
    const ScenarioDir scenario_dir(dir_, "checkpoint", keep_);
    const std::string& dir = scenario_dir.path();
    const std::string serving_dir = dir + "/serving";

    embstore_store_config_t config = Store::default_config();
    config.staging_bytes = size_t{staging_mib_} << 20;
    Store store(o, config);
    const embstore_backend_t backend = store.backend();
    embstore_table_t* table =
        create_table(store, "perf_checkpoint", o.dim, optimizer_from_name(optimizer_),
                     [&](embstore_table_config_t& c) {
                       c.value_codec = pair.values;
                       c.state_codec = pair.state;
                       c.serving_codec = serving.value_or(EMBSTORE_CODEC_NONE);
                     });
    if (serving) {
      embstore_checkpoint_policy_t policy;
      embstore_checkpoint_policy_init(&policy);
      policy.dir = dir.c_str();
      policy.serving_dir = serving_dir.c_str();
      check(embstore_checkpoint_set_policy(store.get(), &policy), "embstore_checkpoint_set_policy");
    }

    // Fill: every rank of the stream gets its row.
    const Stopwatch fill_watch;
    fill_table(table, backend, rows_, o.dim);
    const double fill_seconds = fill_watch.seconds();
    const uint64_t rows = table_stats(table).rows;

    const std::vector<int64_t> stream = zipf_key_stream(o.steps * o.batch, rows_, o.zipf, o.seed);
    std::vector<float> grads(o.batch * o.dim);
    SplitMix64 rng(o.seed ^ 0x636b7074ull);
    for (float& g : grads) g = static_cast<float>(rng.next_unit() * 0.02 - 0.01);
    BackendBuffer<int64_t> d_keys(backend, o.batch);
    BackendBuffer<float> d_grads(backend, grads.size());
    BackendBuffer<float> d_out(backend, o.batch * o.dim);
    d_grads.upload(grads.data(), grads.size());

    uint64_t step = 0;
    auto train = [&](size_t b) {
      d_keys.upload(stream.data() + b * o.batch, o.batch);
      check(embstore_lookup(table, d_keys.data(), o.batch, d_out.data(), EMBSTORE_LOOKUP_INSERT,
                            nullptr),
            "embstore_lookup");
      check(embstore_apply_gradients(table, d_keys.data(), d_grads.data(), o.batch, nullptr),
            "embstore_apply_gradients");
      check(embstore_step(store.get(), ++step), "embstore_step");
      backend_sync(backend);
    };

    // Baseline: the same batches without a checkpoint.
    std::vector<double> base_steps;
    for (size_t b = 0; b < o.steps; ++b) {
      const Stopwatch w;
      train(b);
      base_steps.push_back(w.seconds());
    }

    // With a full checkpoint captured before the first batch.
    const embstore_checkpoint_stats_t before = checkpoint_stats(store.get());
    const Stopwatch total;
    uint64_t version = 0;
    const Stopwatch capture_watch;
    check(embstore_checkpoint(store.get(), dir.c_str(), EMBSTORE_CKPT_FULL, &version),
          "embstore_checkpoint");
    const double checkpoint_call_seconds = capture_watch.seconds();
    double full_seconds = -1;
    std::vector<double> ckpt_steps;
    size_t steps_during = 0;
    for (size_t b = 0; b < o.steps; ++b) {
      const Stopwatch w;
      train(b);
      ckpt_steps.push_back(w.seconds());
      if (full_seconds < 0) {
        ++steps_during;
        if (checkpoint_stats(store.get()).in_flight == 0) full_seconds = total.seconds();
      }
    }
    check(embstore_checkpoint_wait(store.get(), version), "embstore_checkpoint_wait");
    if (full_seconds < 0) full_seconds = total.seconds();
    const embstore_checkpoint_stats_t after = checkpoint_stats(store.get());
    bool unpublished = serving && !all_published(report, before, after);

    const uint64_t full_bytes = after.bytes_written - before.bytes_written;
    const uint64_t rows_written = after.rows_written - before.rows_written;
    const double base_median = median(base_steps);
    const double ckpt_median = median(ckpt_steps);
    const double ckpt_max = *std::max_element(ckpt_steps.begin(), ckpt_steps.end());
    const double base_max = *std::max_element(base_steps.begin(), base_steps.end());

    report_common(report, o, backend);
    report.set(key("optimizer"), optimizer_);
    report.set(key("rows"), rows);
    report.set(key("staging_bytes"), config.staging_bytes);
    report.set(key("fill_seconds"), fill_seconds);
    report.set(key("version"), version);
    report.set(key("full_seconds"), full_seconds);
    report.set(key("codecs"), pair.name);
    (*out)["full_seconds"] = full_seconds;
    (*out)["full_bytes"] = static_cast<double>(full_bytes);
    report.set(key("full_bytes"), full_bytes);
    report.set(key("full_bytes_per_second"), full_bytes / full_seconds);
    report.set(key("rows_written"), rows_written);
    report.set(key("checkpoint_call_seconds"), checkpoint_call_seconds);
    report.set(key("capture_seconds"), after.capture_seconds_last);
    report.set(key("stall_seconds_max"), after.stall_seconds_max);
    report.set(key("stall_seconds_total"), after.stall_seconds_total - before.stall_seconds_total);
    report.set(key("copy_on_write_rows"), after.copy_on_write_rows - before.copy_on_write_rows);
    report.set(key("steps_while_writing"), steps_during);
    report.set(key("step_seconds_median_baseline"), base_median);
    report.set(key("step_seconds_median_checkpointing"), ckpt_median);
    report.set(key("step_seconds_max_baseline"), base_max);
    report.set(key("step_seconds_max_checkpointing"), ckpt_max);
    report.set(key("step_time_ratio_median"), ckpt_median / base_median);

    report.say("table: {} rows x dim {} ({}), {} steps of {} keys, {} backend", rows, o.dim,
               optimizer_, o.steps, o.batch, backend_name(backend));
    report.say("full checkpoint: {:.3f} s to commit, {}B, {}B/s; {} rows", full_seconds,
               si(static_cast<double>(full_bytes)), si(full_bytes / full_seconds), rows_written);
    report.say(
        "training: capture {:.2f} ms (call {:.2f} ms), longest pipeline wait {:.2f} ms, "
        "{} rows copied on write",
        after.capture_seconds_last * 1e3, checkpoint_call_seconds * 1e3,
        after.stall_seconds_max * 1e3, after.copy_on_write_rows - before.copy_on_write_rows);
    report.say(
        "step time median {:.2f} ms while writing ({} steps overlapped) vs {:.2f} ms "
        "baseline: x{:.2f}; max {:.2f} vs {:.2f} ms",
        ckpt_median * 1e3, steps_during, base_median * 1e3, ckpt_median / base_median,
        ckpt_max * 1e3, base_max * 1e3);
    if (dirty_fraction_ > 0) {
      // Full against incremental on the same table, both idle (nothing trains meanwhile).
      auto timed_checkpoint = [&](embstore_ckpt_kind_t kind, uint64_t* bytes, uint64_t* rows_out) {
        check(embstore_step(store.get(), ++step), "embstore_step");
        const embstore_checkpoint_stats_t b = checkpoint_stats(store.get());
        const Stopwatch w;
        uint64_t v = 0;
        check(embstore_checkpoint(store.get(), dir.c_str(), kind, &v), "embstore_checkpoint");
        check(embstore_checkpoint_wait(store.get(), v), "embstore_checkpoint_wait");
        const double seconds = w.seconds();
        const embstore_checkpoint_stats_t a = checkpoint_stats(store.get());
        *bytes = a.bytes_written - b.bytes_written;
        *rows_out = a.rows_written - b.rows_written;
        if (serving) {
          const bool full = kind == EMBSTORE_CKPT_FULL;
          const uint64_t published = version_bytes(serving_dir, v);
          (*out)[full ? "serving_full_bytes" : "serving_delta_bytes"] =
              static_cast<double>(published);
          report.set(prefix + (full ? "serving_full_bytes" : "serving_delta_bytes"), published);
          if (!all_published(report, b, a)) unpublished = true;
        }
        return seconds;
      };
      uint64_t idle_full_bytes = 0, idle_full_rows = 0, delta_bytes = 0, delta_rows = 0;
      const double idle_full_seconds =
          timed_checkpoint(EMBSTORE_CKPT_FULL, &idle_full_bytes, &idle_full_rows);
      // Update a spread-out set of distinct rows: ranks 1, 1 + stride, ...
      const uint64_t dirty = std::max<uint64_t>(1, static_cast<uint64_t>(dirty_fraction_ * rows_));
      const uint64_t stride = std::max<uint64_t>(1, rows_ / dirty);
      std::vector<int64_t> keys;
      for (uint64_t r = 0; r < dirty; ++r) keys.push_back(key_of_rank(1 + (r * stride) % rows_));
      for (size_t first = 0; first < keys.size(); first += o.batch) {
        const size_t n = std::min(o.batch, keys.size() - first);
        d_keys.upload(keys.data() + first, n);
        check(embstore_apply_gradients(table, d_keys.data(), d_grads.data(), n, nullptr),
              "embstore_apply_gradients");
      }
      backend_sync(backend);
      const uint64_t dirty_rows = table_stats(table).dirty_rows;
      const double delta_seconds =
          timed_checkpoint(EMBSTORE_CKPT_INCREMENTAL, &delta_bytes, &delta_rows);
      report.set(key("dirty_fraction"), dirty_fraction_);
      report.set(key("dirty_rows"), dirty_rows);
      report.set(key("full_idle_seconds"), idle_full_seconds);
      report.set(key("full_idle_bytes"), idle_full_bytes);
      report.set(key("delta_seconds"), delta_seconds);
      (*out)["full_idle_seconds"] = idle_full_seconds;
      (*out)["full_idle_bytes"] = static_cast<double>(idle_full_bytes);
      (*out)["delta_seconds"] = delta_seconds;
      (*out)["delta_bytes"] = static_cast<double>(delta_bytes);
      report.set(key("delta_bytes"), delta_bytes);
      report.set(key("delta_rows"), delta_rows);
      report.set(key("delta_to_full_bytes"), static_cast<double>(delta_bytes) / idle_full_bytes);
      report.set(key("delta_to_full_seconds"), delta_seconds / idle_full_seconds);
      report.say(
          "idle: full {:.3f} s, {}B; incremental with {} dirty rows ({:.2f}%): {:.3f} s, "
          "{}B: {:.2f}% of the bytes, 1/{:.1f} of the time",
          idle_full_seconds, si(static_cast<double>(idle_full_bytes)), dirty_rows,
          100.0 * dirty_rows / rows, delta_seconds, si(static_cast<double>(delta_bytes)),
          100.0 * delta_bytes / idle_full_bytes, idle_full_seconds / delta_seconds);
      if (delta_rows != dirty_rows || idle_full_rows != rows) {
        report.say("MISMATCH: the delta holds {} rows for {} dirty; the full {} of {}", delta_rows,
                   dirty_rows, idle_full_rows, rows);
        return kExitMismatch;
      }
    }
    if (rows_written != rows) {
      report.say("MISMATCH: the checkpoint holds {} rows, the table had {} at capture",
                 rows_written, rows);
      return kExitMismatch;
    }
    return unpublished ? kExitMismatch : 0;
  }

  std::string dir_;
  std::vector<std::string> codecs_ = {"none"};
  uint64_t rows_ = 1'000'000;
  std::string optimizer_ = "adagrad";
  unsigned staging_mib_ = 256;
  double dirty_fraction_ = 0;
  bool keep_ = false;
  std::string serving_codec_ = "off";
};

}  // namespace

std::unique_ptr<Scenario> make_checkpoint_scenario() {
  return std::make_unique<CheckpointScenario>();
}

}  // namespace embstore::perf
