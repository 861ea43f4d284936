// Warm start (embstore_warm_start): plan every source's version, give each table to the last
// source whose regex matches its name, then load and swap as a restore does (replace_tables in
// restore.cpp): nothing changes unless every chosen table loaded and checked.
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "host/checkpoint/checkpointer.hpp"
#include "host/checkpoint/load_stages.hpp"
#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "host/table/table_regex.hpp"
#include "io/format/chain.hpp"
#include "io/format/manifest.hpp"

namespace embstore::checkpoint {
namespace {

// The table names of a plan, for a message (the first few).
std::string names_of(const RestorePlan& plan) {
  std::string names;
  size_t shown = 0;
  for (const TablePlan& t : plan.tables) {
    if (shown++ == 8) return names + ", ...";
    names += (names.empty() ? "'" : ", '") + t.entry->name + "'";
  }
  return names.empty() ? "none" : names;
}

}  // namespace

void Checkpointer::warm_start(const std::vector<WarmSource>& sources) {
  std::lock_guard op(op_mutex_);
  end_job_in_flight();
  LoadStages stages(sharded());

  // Stage 1: every source's version and its plan, as a restore's; each table the store gets
  // from the last source that matches its name. A source that matches nothing is an error:
  // a regex that selects no table is a mistake, not a choice.
  std::vector<std::unique_ptr<io::CheckpointDir>> dirs;
  std::vector<std::unique_ptr<RestorePlan>> plans;
  Replacement r;
  r.op = "warm start";
  r.new_run = false;  // warm start loads tables, not a training position: the step stays
  stages.run([&] {
    std::vector<TableRegex> regexes;
    for (size_t i = 0; i < sources.size(); ++i) {
      regexes.push_back(
          TableRegex::compile(sources[i].tables_regex, fmt::format("warm start source {}", i)));
    }
    std::map<std::string, TableLoad> chosen;  // by name
    for (size_t i = 0; i < sources.size(); ++i) {
      const WarmSource& source = sources[i];
      dirs.push_back(std::make_unique<io::CheckpointDir>());
      std::vector<std::string> skipped;
      const size_t index =
          choose_version(source.dir, source.version, std::nullopt, dirs.back().get(), &skipped);
      for (const std::string& path : skipped) {
        std::fprintf(stderr, "embstore: warm start skips '%s': it has no %s\n", path.c_str(),
                     io::kManifestName);
      }
      plans.push_back(std::make_unique<RestorePlan>(plan_version(*dirs.back(), index)));
      const RestorePlan& plan = *plans.back();
      if (!source.values_only) refuse_serving_only(plan, "a warm start with optimizer state");
      bool matched = false;
      for (const TablePlan& t : plan.tables) {
        if (!regexes[i].matches(t.entry->name)) continue;
        chosen[t.entry->name] = TableLoad{&plan, &t, source.values_only};
        matched = true;
      }
      if (!matched) {
        fail(EMBSTORE_NOT_FOUND,
             "warm start source {}: no table of {} matches tables_regex '{}' (its tables: {})", i,
             plan.path(), source.tables_regex, names_of(plan));
      }
    }
    for (const std::unique_ptr<RestorePlan>& plan : plans) r.plans.push_back(plan.get());
    for (auto& [name, load] : chosen) r.loads.push_back(load);
    r.step = store_.step();
  });

  // Stages 2 to 4, with every source's attachments of this rank (a later source's replacing an
  // earlier one's of the same name).
  std::map<std::string, std::vector<char>> attachments;
  replace_tables(stages, r, [&] {
    for (const std::unique_ptr<RestorePlan>& plan : plans) {
      for (auto& [name, bytes] : read_attachments(*plan, store_.rank())) {
        attachments[name] = std::move(bytes);
      }
    }
  });
  std::lock_guard lock(mutex_);
  restored_attachments_ = std::move(attachments);
  // The loaded rows are not dirty, so no delta on the store's last checkpoint could hold them:
  // the next checkpoint is full.
  chain_ = Chain{};
}

}  // namespace embstore::checkpoint
