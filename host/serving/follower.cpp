#include "host/serving/follower.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <filesystem>

#include "cuda/row/init.h"
#include "cuda/row/shard.h"
#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "io/format/chain.hpp"
#include "io/format/dir_lock.hpp"
#include "io/format/lease.hpp"
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

// How a poll reads a delta: 4 MiB in flight instead of restore's 64 MiB. A poll runs beside
// lookups on a serving machine: its buffers, allocated for each file, stay below the size that
// malloc maps and unmaps for each poll (page faults, zeroing, TLB shootdowns that interrupt the
// lookup threads), and a delta is small beside the lag a poll may take.
constexpr io::ReaderOptions kDeltaReads{4, size_t{1} << 20};

bool exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// Whether dir still lists a version of this number (of either kind).
bool listed(const io::CheckpointDir& dir, uint64_t version) {
  return std::any_of(dir.versions().begin(), dir.versions().end(),
                     [&](const io::VersionDir& v) { return v.version == version; });
}

}  // namespace

Follower::Follower(FollowerOptions options)
    : options_(std::move(options)),
      tables_(TableRegex::compile(options_.tables_regex, "follower")) {
  if (options_.lease_seconds > 0) lease_id_ = io::new_lease_id();
  // Made before the lease is written, so that nothing after it can fail and leave the lease.
  if (options_.poll_interval_ms > 0) {
    watch_ = std::make_unique<DirWatch>(options_.dir, options_.watch_commits);
  }
  // The lease names the version before it is read; retention may have deleted it between the
  // listing and the lease, so a version that went while it was read is chosen again.
  for (int attempt = 0;; ++attempt) {
    io::CheckpointDir dir;
    const size_t newest =
        checkpoint::choose_version(options_.dir, io::kLatestVersion, std::nullopt, &dir, nullptr);
    try {
      renew_lease(dir.versions()[newest].version, true);
      serving_.store(load_whole(dir, newest));
      break;
    } catch (const Error&) {
      if (attempt == 2 || exists(dir.version_path(newest))) {
        if (!lease_id_.empty()) io::remove_lease(options_.dir, lease_id_);
        throw;
      }
    }
  }
  if (watch_ != nullptr) background_ = std::thread([this] { background(); });
}

Follower::~Follower() {
  stopping_ = true;
  if (watch_ != nullptr) {
    watch_->stop();
    background_.join();
  }
  if (!lease_id_.empty()) io::remove_lease(options_.dir, lease_id_);
}

void Follower::background() {
  while (watch_->wait(std::chrono::milliseconds(options_.poll_interval_ms))) {
    try {
      poll();
    } catch (...) {  // poll() keeps it in the stats and logs it; the next interval tries again
    }
  }
}

void Follower::renew_lease(uint64_t version, bool force) {
  if (lease_id_.empty()) return;
  const int64_t now = io::wall_clock_ms();
  const int64_t length_ms = int64_t{options_.lease_seconds} * 1000;
  // Rewritten when the version changes and when half the lease has run, not at every poll.
  if (!force && version == lease_version_ && now - lease_renewed_ms_ < length_ms / 2) return;
  io::Lease lease;
  lease.id = lease_id_;
  lease.pid = ::getpid();
  lease.host = io::host_name();
  lease.version = version;
  lease.expires_ms = now + length_ms;
  lease.what = options_.who;
  std::string detail;
  if (int r = io::write_lease(options_.dir, lease, &detail); r < 0) {
    fail_io(r, "the follower's lease: " + detail +
                   " (a directory the follower may not write needs lease_seconds 0)");
  }
  lease_version_ = version;
  lease_renewed_ms_ = now;
}

void Follower::made_visible(const std::string& version_path) {
  struct stat st {};
  if (::stat(version_path.c_str(), &st) != 0) return;
  const double committed = static_cast<double>(st.st_ctim.tv_sec) + st.st_ctim.tv_nsec * 1e-9;
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::lock_guard lock(stats_mutex_);
  lags_.push_back(std::max(0.0, now - committed));
  if (lags_.size() > kLagWindow) lags_.pop_front();
}

bool Follower::serves_key(int64_t key) const {
  return options_.world_size <= 1 || row::shard_of(key, options_.world_size) == options_.rank;
}

std::shared_ptr<Follower::Serving> Follower::load_whole(io::CheckpointDir& dir, size_t index,
                                                        const Serving* dims_of) {
  const auto started = std::chrono::steady_clock::now();
  const checkpoint::RestorePlan plan = checkpoint::plan_version(dir, index);
  std::map<std::string, uint32_t> dims;
  for (const checkpoint::TablePlan& t : plan.tables) {
    if (!tables_.matches(t.entry->name)) continue;
    dims[t.entry->name] = t.spec.dim;
    const auto served = dims_of != nullptr ? dims_of->specs.find(t.entry->name)
                                           : std::map<std::string, TableSpec>::const_iterator();
    if (dims_of != nullptr && served != dims_of->specs.end() && served->second.dim != t.spec.dim) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "{}: table '{}' has dim {}, the follower serves it with dim {}: a follower keeps its "
           "tables' dims (its callers size their buffers by them); create a new follower",
           plan.path(), t.entry->name, t.spec.dim, served->second.dim);
    }
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
      throw_if_cancelled();
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
                                                           const Serving& serving,
                                                           Pacer& pacer) const {
  std::map<std::string, TableChanges> changes;
  for (const io::TableEntry& entry : link.manifest->tables) {
    const auto spec = serving.specs.find(entry.name);
    if (spec == serving.specs.end()) continue;  // not served (or created after the load)
    if (entry.config.dim != spec->second.dim) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}' changes dim from {} to {}", link.path, entry.name,
           spec->second.dim, entry.config.dim);
    }
    TableChanges& c = changes[entry.name];
    // Room for the rows at once (no copies as the vectors grow), as many as the manifest says
    // but no more than the regular files on disk can hold (the manifest is not trusted yet),
    // and this rank's share of them.
    uint64_t on_disk = 0;
    for (const io::FileEntry& f : entry.files) {
      std::error_code ec;
      const std::filesystem::path path = link.path + "/" + f.path;
      if (!std::filesystem::is_regular_file(std::filesystem::symlink_status(path, ec))) continue;
      const uintmax_t bytes = std::filesystem::file_size(path, ec);
      if (!ec) on_disk += std::min<uint64_t>(bytes, f.bytes);
    }
    const uint64_t rows =
        std::min<uint64_t>(entry.rows,
                           on_disk / (sizeof(int64_t) + sizeof(float) * entry.config.dim)) /
        std::max<uint32_t>(options_.world_size, 1);
    c.keys.reserve(rows);
    c.values.reserve(rows * entry.config.dim);
    const io::RowSink sink = [&](const io::RowBlock& b, std::string*) {
      throw_if_cancelled();
      const bool upserts = b.kind != io::RowBlockKind::kTombstones;
      pacer.add(uint64_t{b.rows} *
                (sizeof(int64_t) + (upserts ? sizeof(float) * (b.dim + b.state_dim) : 0)));
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
    // The values-only files when the delta has them (a quarter of the bytes or less), else, or
    // when one does not read, the whole files: the same rows either way.
    if (!entry.serving.empty()) {
      int r = 0;
      std::string detail;
      uint64_t bytes = 0;  // counted once all of them read: else their rows are dropped
      for (size_t k = 0; k < entry.serving.size() && r == 0; ++k) {
        const io::FileEntry& f = entry.serving[k];
        r = io::read_serving_file(link.path + "/" + f.path, f, entry, sink, &detail, kDeltaReads);
        bytes += f.bytes;
      }
      if (r == 0) {
        delta_bytes_read_ += bytes;
        serving_files_read_ += entry.serving.size();
        continue;
      }
      ++serving_fallbacks_;
      std::fprintf(stderr, "embstore: follower of %s: %s; reading the whole delta instead\n",
                   options_.dir.c_str(), detail.c_str());
      c.keys.clear();
      c.values.clear();
      c.tombstones.clear();
    }
    for (const io::FileEntry& f : entry.files) {
      std::string detail;
      const int r = io::read_row_file(link.path + "/" + f.path, f, entry, link.manifest->full, sink,
                                      &detail, false, kDeltaReads);
      if (r < 0) fail_io(r, detail);
      delta_bytes_read_ += f.bytes;
    }
  }
  return changes;
}

bool Follower::serves_same_tables(const io::Manifest& m, const Serving& serving) const {
  size_t matching = 0;
  for (const io::TableEntry& entry : m.tables) {
    if (!tables_.matches(entry.name)) continue;
    if (serving.specs.count(entry.name) == 0) return false;  // created since the load
    ++matching;
  }
  return matching == serving.specs.size();  // else one was dropped
}

void Follower::throw_if_cancelled() const {
  if (stopping_) fail(EMBSTORE_BUSY, "the follower is being closed: its polls are cancelled");
}

uint64_t Follower::poll() {
  throw_if_cancelled();
  std::lock_guard lock(poll_mutex_);
  throw_if_cancelled();  // it waited for the poll that was cancelled
  ++polls_;
  try {
    const uint64_t v = poll_locked();
    std::lock_guard stats(stats_mutex_);
    last_poll_status_ = EMBSTORE_OK;
    last_poll_error_.clear();
    return v;
  } catch (const Error& e) {
    std::lock_guard stats(stats_mutex_);
    // Logged when it changes, so that a lasting failure of background polls is one line.
    if (!stopping_ && (e.status() != last_poll_status_ || e.what() != last_poll_error_)) {
      std::fprintf(stderr, "embstore: follower of %s: %s\n", options_.dir.c_str(), e.what());
    }
    last_poll_status_ = e.status();
    last_poll_error_ = e.what();
    throw;
  }
}

uint64_t Follower::poll_locked() {
  std::shared_ptr<Serving> serving = serving_.load();
  const uint64_t served = serving->rows.version();
  renew_lease(served, false);
  io::CheckpointDir dir;
  size_t newest =
      checkpoint::choose_version(options_.dir, io::kLatestVersion, std::nullopt, &dir, nullptr);
  const io::Manifest* newest_manifest = nullptr;
  std::string detail;
  if (int r = dir.manifest(newest, &newest_manifest, &detail); r < 0) fail_io(r, detail);
  if (!reload_ && newest_manifest->version == served && newest_manifest->xxh3 == xxh3_) {
    return served;
  }

  // The chain of the newest version: where the version served is a link of it, the deltas
  // after it; else (rebased, pruned, or the version served deleted) the newest version whole.
  std::vector<io::ChainLink> chain;
  if (int r = dir.chain(newest, &chain, &detail); r < 0) fail_io(r, detail);
  size_t at = chain.size();
  for (size_t i = 0; i < chain.size(); ++i) {
    if (chain[i].manifest->version == served && chain[i].manifest->xxh3 == xxh3_) at = i;
  }
  for (size_t i = 0; i < at; ++i) {
    if (!serves_same_tables(*chain[i].manifest, *serving)) reload_ = true;
  }
  const auto load_newest = [&] {
    serving_.store(load_whole(dir, newest, serving.get()));
    reload_ = false;
    made_visible(dir.version_path(newest));
    const uint64_t v = serving_.load()->rows.version();
    renew_lease(v, true);
    return v;
  };
  if (at == chain.size() || reload_) {
    if (at == chain.size() && !listed(dir, served)) ++chain_lost_;
    return load_newest();
  }
  const auto started = std::chrono::steady_clock::now();
  // The reading is paced, the merge is not: while a version merges, lookups of the keys it
  // changed go through its overlay, and spreading the merge would keep them there for longer.
  Pacer pacer(options_.apply_bytes_per_second, &stopping_);
  for (size_t i = at; i-- > 0;) {  // oldest first
    throw_if_cancelled();          // the versions applied before stay
    const io::ChainLink& link = chain[i];
    renew_lease(serving->rows.version(), false);  // a paced poll of many deltas may take long
    // Read and checked whole before any of it is served.
    std::map<std::string, TableChanges> changes;
    try {
      changes = read_changes(link, *serving, pacer);
    } catch (const Error&) {
      if (exists(link.path)) throw;
      // Deleted while read (an expired lease, by hand): the newest version, whole.
      ++chain_lost_;
      dir = io::CheckpointDir();
      newest =
          checkpoint::choose_version(options_.dir, io::kLatestVersion, std::nullopt, &dir, nullptr);
      return load_newest();
    }
    try {
      serving->rows.apply(link.manifest->version, std::move(changes));
    } catch (...) {
      reload_ = true;  // the rows may not be applied to again: the next poll loads anew
      throw;
    }
    made_visible(link.path);
    xxh3_ = link.manifest->xxh3;
    ++versions_applied_;
  }
  last_apply_seconds_ = seconds_since(started);
  renew_lease(serving->rows.version(), false);
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

uint32_t Follower::table_dim(const std::string& table) const {
  const std::shared_ptr<Serving> serving = serving_.load();
  const auto spec = serving->specs.find(table);
  if (spec == serving->specs.end())
    fail(EMBSTORE_NOT_FOUND, "the follower serves no table '{}'", table);
  return spec->second.dim;
}

FollowerStats Follower::stats() const {
  FollowerStats s;
  s.version = version();
  s.versions_applied = versions_applied_.load();
  s.full_loads = full_loads_.load();
  s.lookups = lookups_.load();
  s.last_apply_seconds = last_apply_seconds_.load();
  s.polls = polls_.load();
  s.chain_lost = chain_lost_.load();
  s.delta_bytes_read = delta_bytes_read_.load();
  s.serving_files_read = serving_files_read_.load();
  s.serving_fallbacks = serving_fallbacks_.load();
  std::lock_guard lock(stats_mutex_);
  s.last_poll_status = last_poll_status_;
  s.last_poll_error = last_poll_error_;
  if (!lags_.empty()) {
    std::vector<double> sorted(lags_.begin(), lags_.end());
    std::sort(sorted.begin(), sorted.end());
    const auto at = [&](double q) {
      return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * sorted.size()))];
    };
    s.last_lag_seconds = lags_.back();
    s.lag_p50_seconds = at(0.5);
    s.lag_p99_seconds = at(0.99);
  }
  return s;
}

}  // namespace embstore::serving
