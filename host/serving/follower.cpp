#include "host/serving/follower.hpp"

#include <cerrno>
#include <chrono>
#include <cstdio>

#include "cuda/row/init.h"
#include "cuda/row/shard.h"
#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "host/table/table_regex.hpp"
#include "io/format/chain.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"

namespace embstore::serving {
namespace {

[[noreturn]] void fail_io(int r, const std::string& detail) {
  fail(r == -EBADMSG ? EMBSTORE_CORRUPT : EMBSTORE_IO_ERROR, "{}", detail);
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Follower::Follower(FollowerOptions options) : options_(std::move(options)) {
  tables_ = compile_table_regex(options_.tables_regex, "follower");
  io::CheckpointDir dir;
  const size_t newest =
      checkpoint::choose_version(options_.dir, io::kLatestVersion, std::nullopt, &dir, nullptr);
  serving_.store(load_whole(dir, newest));
}

bool Follower::serves_key(int64_t key) const {
  return options_.world_size <= 1 || row::shard_of(key, options_.world_size) == options_.rank;
}

std::shared_ptr<Follower::Serving> Follower::load_whole(io::CheckpointDir& dir, size_t index) {
  const auto started = std::chrono::steady_clock::now();
  const checkpoint::RestorePlan plan = checkpoint::plan_version(dir, index);
  std::map<std::string, uint32_t> dims;
  for (const checkpoint::TablePlan& t : plan.tables) {
    if (std::regex_match(t.entry->name, tables_)) dims[t.entry->name] = t.spec.dim;
  }
  if (dims.empty()) {
    fail(EMBSTORE_NOT_FOUND, "{}: no table matches tables_regex '{}'", plan.path(),
         options_.tables_regex);
  }
  auto serving = std::make_shared<Serving>(dims);
  for (const checkpoint::TablePlan& t : plan.tables) {
    if (dims.count(t.entry->name) == 0) continue;
    serving->specs[t.entry->name] = t.spec;
    // Each key once (the chain reader keeps the newest row), values only, the keys served.
    std::vector<int64_t> keys;
    std::vector<float> values;
    uint64_t rows = 0;
    const io::RowSink sink = [&](const io::RowBlock& b, std::string*) {
      keys.clear();
      values.clear();
      for (uint32_t i = 0; i < b.rows; ++i) {
        if (!serves_key(b.keys[i])) continue;
        keys.push_back(b.keys[i]);
        values.insert(values.end(), b.values + size_t{i} * b.dim, b.values + size_t{i + 1} * b.dim);
      }
      serving->rows.load(t.entry->name, keys.data(), values.data(), keys.size());
      rows += keys.size();
      return 0;
    };
    io::ChainReadOptions read_options;
    read_options.unique_keys = true;
    checkpoint::read_table(plan, t, read_options, sink,
                           options_.world_size <= 1
                               ? std::function<uint64_t()>([&] { return rows; })
                               : std::function<uint64_t()>());
  }
  serving->rows.finish_load(plan.manifest().version);
  xxh3_ = plan.manifest().xxh3;
  ++full_loads_;
  last_apply_seconds_ = seconds_since(started);
  return serving;
}

std::map<std::string, TableChanges> Follower::read_changes(const io::ChainLink& link,
                                                           const Serving& serving) const {
  std::map<std::string, TableChanges> changes;
  for (const io::TableEntry& entry : link.manifest->tables) {
    const auto spec = serving.specs.find(entry.name);
    if (spec == serving.specs.end()) continue;  // not served (or created after the load)
    if (entry.config.dim != spec->second.dim) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}' changes dim from {} to {}", link.path, entry.name,
           spec->second.dim, entry.config.dim);
    }
    TableChanges& c = changes[entry.name];
    const io::RowSink sink = [&](const io::RowBlock& b, std::string*) {
      for (uint32_t i = 0; i < b.rows; ++i) {
        if (!serves_key(b.keys[i])) continue;
        if (b.kind == io::RowBlockKind::kTombstones) {
          c.tombstones.push_back(b.keys[i]);
        } else {
          c.keys.push_back(b.keys[i]);
          c.values.insert(c.values.end(), b.values + size_t{i} * b.dim,
                          b.values + size_t{i + 1} * b.dim);
        }
      }
      return 0;
    };
    for (const io::FileEntry& f : entry.files) {
      std::string detail;
      const int r =
          io::read_row_file(link.path + "/" + f.path, f, entry, link.manifest->full, sink, &detail);
      if (r < 0) fail_io(r, detail);
    }
  }
  return changes;
}

uint64_t Follower::poll() {
  std::lock_guard lock(poll_mutex_);
  std::shared_ptr<Serving> serving = serving_.load();
  const uint64_t served = serving->rows.version();
  io::CheckpointDir dir;
  const size_t newest =
      checkpoint::choose_version(options_.dir, io::kLatestVersion, std::nullopt, &dir, nullptr);
  const io::Manifest* newest_manifest = nullptr;
  std::string detail;
  if (int r = dir.manifest(newest, &newest_manifest, &detail); r < 0) fail_io(r, detail);
  if (!reload_ && newest_manifest->version == served && newest_manifest->xxh3 == xxh3_) {
    return served;
  }

  // The chain of the newest version: where the version served is a link of it, the deltas
  // after it; else (rebased or pruned) the newest version whole.
  std::vector<io::ChainLink> chain;
  if (int r = dir.chain(newest, &chain, &detail); r < 0) fail_io(r, detail);
  size_t at = chain.size();
  for (size_t i = 0; i < chain.size(); ++i) {
    if (chain[i].manifest->version == served && chain[i].manifest->xxh3 == xxh3_) at = i;
  }
  if (at == chain.size() || reload_) {
    serving_.store(load_whole(dir, newest));
    reload_ = false;
    return serving_.load()->rows.version();
  }
  const auto started = std::chrono::steady_clock::now();
  for (size_t i = at; i-- > 0;) {  // oldest first
    const io::ChainLink& link = chain[i];
    // Read and checked whole before any of it is served.
    std::map<std::string, TableChanges> changes = read_changes(link, *serving);
    try {
      serving->rows.apply(link.manifest->version, std::move(changes));
    } catch (...) {
      reload_ = true;  // the rows may not be applied to again: the next poll loads anew
      throw;
    }
    xxh3_ = link.manifest->xxh3;
    ++versions_applied_;
  }
  last_apply_seconds_ = seconds_since(started);
  return serving->rows.version();
}

void Follower::lookup(const std::string& table, const int64_t* keys, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    if (!serves_key(keys[i])) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "key {} (position {}) belongs to rank {} of the serving layout, not to this follower "
           "(rank {})",
           keys[i], i, row::shard_of(keys[i], options_.world_size), options_.rank);
    }
  }
  const std::shared_ptr<Serving> serving = serving_.load();
  const auto spec = serving->specs.find(table);
  if (spec == serving->specs.end()) {
    fail(EMBSTORE_INVALID_ARGUMENT, "the follower serves no table '{}'", table);
  }
  const TableSpec& s = spec->second;
  std::function<void(int64_t, float*)> fill;
  if (options_.initial_values) {
    fill = [&s](int64_t key, float* row) { row::init_row(s.init, key, s.dim, row); };
  }
  serving->rows.lookup(table, keys, n, out, fill, nullptr);
  ++lookups_;
}

uint64_t Follower::version() const { return serving_.load()->rows.version(); }

FollowerStats Follower::stats() const {
  FollowerStats s;
  s.version = version();
  s.versions_applied = versions_applied_.load();
  s.full_loads = full_loads_.load();
  s.lookups = lookups_.load();
  s.last_apply_seconds = last_apply_seconds_.load();
  return s;
}

}  // namespace embstore::serving
