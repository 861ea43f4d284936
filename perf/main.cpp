// embstore-perf: the benchmark harness. One subcommand per scenario (perf/scenarios/), each
// with the common options below plus its own.
//   embstore-perf <scenario> [options] [--json FILE]
// Exit codes: 0 ok, 1 error, 2 a scenario's results failed their check.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <memory>
#include <vector>

#include "perf/harness.hpp"
#include "perf/report.hpp"

namespace embstore::perf {

// perf/scenarios/io.cpp (declared here rather than in harness.hpp: it needs none of the store
// helpers there).
std::unique_ptr<Scenario> make_io_scenario();

std::vector<CodecPair> parse_codecs_option(const std::vector<std::string>& names) {
  std::vector<CodecPair> pairs;
  for (const std::string& name : names) {
    try {
      pairs.push_back(parse_codec_pair(name));
    } catch (const std::invalid_argument& e) {
      throw CLI::ValidationError("--codecs", e.what());
    }
  }
  return pairs;
}

namespace {

struct Entry {
  std::unique_ptr<Scenario> scenario;
  CommonOptions options;
  CLI::App* command = nullptr;
};

// CLI::PositiveNumber prints its range with DBL_MAX in full: say it plainly instead.
const CLI::Validator kPositive(
    [](std::string& input) -> std::string {
      char* end = nullptr;
      const double value = std::strtod(input.c_str(), &end);
      if (end == input.c_str() || *end != '\0' || !(value > 0)) {
        return "must be a number > 0, is '" + input + "'";
      }
      return {};
    },
    "> 0", "POSITIVE");

void add_common_options(CLI::App& app, CommonOptions& o) {
  app.add_option("--backend", o.backend, "store backend (auto: cuda where a device is usable)")
      ->check(CLI::IsMember({"host", "cuda", "auto"}))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "host backend worker threads (0: one per core)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--dim", o.dim, "row width in floats")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--batch", o.batch, "keys per call")->check(kPositive)->capture_default_str();
  app.add_option("--key-space", o.key_space, "Zipf ranks are drawn from [1, key-space]")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--zipf", o.zipf, "Zipf exponent s: P(rank k) ~ k^-s")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--steps", o.steps, "batches in the timed stream")
      ->check(kPositive)
      ->capture_default_str();
  app.add_option("--seed", o.seed, "seed of the key stream and gradients")->capture_default_str();
  app.add_option("--json", o.json_path, "also write the figures as one flat JSON object here");
}

int run(int argc, char** argv) {
  std::vector<Entry> entries(11);
  entries[0].scenario = make_lookup_scenario();
  entries[1].scenario = make_optimizer_scenario();
  entries[2].scenario = make_io_scenario();
  entries[3].scenario = make_checkpoint_scenario();
  entries[4].scenario = make_train_scenario();
  entries[5].scenario = make_restore_scenario();
  entries[6].scenario = make_sharded_scenario();
  entries[7].scenario = make_follow_scenario();
  entries[8].scenario = make_step_scenario();
  entries[9].scenario = make_tiers_scenario();
  entries[10].scenario = make_codecs_scenario();

  CLI::App app{"embstore-perf: benchmark scenarios for embstore", "embstore-perf"};
  app.require_subcommand(1);
  for (Entry& e : entries) {
    e.scenario->set_defaults(e.options);
    e.command = app.add_subcommand(e.scenario->name(), e.scenario->description());
    add_common_options(*e.command, e.options);
    e.scenario->add_options(*e.command);
  }
  CLI11_PARSE(app, argc, argv);

  for (Entry& e : entries) {
    if (!e.command->parsed()) continue;
    try {
      // Fail before a long run, not after it (append mode: an old result stays until then).
      if (!e.options.json_path.empty() && !std::ofstream(e.options.json_path, std::ios::app)) {
        throw std::runtime_error("cannot write " + e.options.json_path);
      }
      Report report(e.scenario->name());
      const int code = e.scenario->run(e.options, report);
      if (!e.options.json_path.empty()) report.write_json(e.options.json_path);
      return code;
    } catch (const std::exception& ex) {
      std::fprintf(stderr, "embstore-perf %s: error: %s\n", e.scenario->name(), ex.what());
      return kExitError;
    }
  }
  return kExitError;
}

}  // namespace
}  // namespace embstore::perf

int main(int argc, char** argv) { return embstore::perf::run(argc, argv); }
