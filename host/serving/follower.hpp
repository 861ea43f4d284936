// A follower (embstore_follower_*): a read-only store that serves the values of a training
// run's checkpoint directory and moves to each newly committed version. Stages of a poll:
//   list      the directory's newest committed version and its chain (every link checked)
//   choose    the deltas after the version served, when it is a link of that chain; else (the
//             chain was rebased or pruned) the newest version whole
//   read      each delta's rows and tombstones of the served tables, every file checked, before
//             any of it is served (a corrupt delta is refused: the follower stays where it was);
//             a delta's values-only files (serving_deltas) where it has them, else, or when one
//             does not read, its whole files
//   apply     ServedRows::apply, one version at a time (served_rows.hpp); a whole version goes
//             into new ServedRows, swapped in for the old ones
//   lease     the lease file (io/format/lease.hpp) names the version now served, so that the
//             trainer's retention keeps its chain and everything newer
// A poll loads the newest version whole when the chain was rebased, when the version served was
// deleted (an expired lease, by hand: "chain lost" in the stats), and when the set of tables
// served changes (a table created or dropped since the load).
// With an interval, a background thread polls (host/serving/dir_watch.hpp: at once when a
// version is committed, where inotify reports it) and keeps the lease renewed.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "host/serving/dir_watch.hpp"
#include "host/serving/pacer.hpp"
#include "host/serving/served_rows.hpp"
#include "host/table/table.hpp"
#include "host/table/table_regex.hpp"

namespace embstore::io {
struct ChainLink;
struct Manifest;
class CheckpointDir;
}  // namespace embstore::io

namespace embstore::serving {

struct FollowerOptions {
  std::string dir;
  std::string tables_regex = ".*";      // RE2 syntax, whole names
  uint32_t rank = 0, world_size = 1;    // the serving layout: keys embstore_shard_of gives rank
  bool initial_values = false;          // keys without a row read as the initializer's values
  uint32_t poll_interval_ms = 0;        // 0: polls by poll() only; else a background thread polls
  bool watch_commits = true;            // the background thread also wakes at commits (inotify)
  uint32_t lease_seconds = 60;          // 0: no lease
  uint64_t apply_bytes_per_second = 0;  // a poll's reading of deltas (pacer.hpp); 0: no limit
  std::string who = "follower";         // the lease's "what"
};

struct FollowerStats {
  uint64_t version = 0;
  uint64_t versions_applied = 0;  // deltas applied by polls
  uint64_t full_loads = 0;        // whole versions loaded (the first, and after rebases)
  uint64_t lookups = 0;           // batches served
  double last_apply_seconds = 0;  // the last poll's read and apply of its versions
  uint64_t polls = 0;             // polls done, by callers and the background thread
  uint64_t chain_lost = 0;        // the version served was deleted: the newest loaded whole
  embstore_status_t last_poll_status = EMBSTORE_OK;
  std::string last_poll_error;  // its message ("" after a poll that succeeded)
  // From a version's commit (its directory's ctime: the commit's rename) to the moment lookups
  // read it; the last, and over the last kLagWindow versions that polls made visible (not the
  // version loaded at create, which may be old).
  double last_lag_seconds = 0, lag_p50_seconds = 0, lag_p99_seconds = 0;
  uint64_t delta_bytes_read = 0;    // bytes of the deltas' row files whose rows were applied
  uint64_t serving_files_read = 0;  // values-only files whose rows were applied
  uint64_t serving_fallbacks = 0;   // values-only files that did not read: whole files instead
};

class Follower {
 public:
  static constexpr size_t kLagWindow = 1024;

  // Loads the newest committed version of options.dir. Throws Error: NOT_FOUND (no directory,
  // no committed version, no table matching), INVALID_ARGUMENT (a bad regex), CORRUPT, IO_ERROR.
  explicit Follower(FollowerOptions options);
  // Stops the background thread and removes the lease. No lookup or poll may be running.
  ~Follower();
  Follower(const Follower&) = delete;
  Follower& operator=(const Follower&) = delete;

  // Any thread, any time (also during poll): the rows of keys in table at one version.
  // INVALID_ARGUMENT for a table not served or a key another rank of the layout serves. A
  // table's dim never changes for the life of a follower (a poll refuses a version that would).
  void lookup(const std::string& table, const int64_t* keys, size_t n, float* out);
  // Any thread (polls take turns): moves to the newest committed version; returns the version
  // served. On failure (CORRUPT, IO_ERROR, NOT_FOUND when the directory went) it throws and the
  // version served stays the last one applied.
  uint64_t poll();
  // Polls in flight give up at their next block of rows, pace check or version, and later ones
  // fail, with BUSY; lookups go on (embstore_follower_cancel).
  void cancel() { stopping_ = true; }
  uint64_t version() const;
  // The dim of a table served; NOT_FOUND for another.
  uint32_t table_dim(const std::string& table) const;
  FollowerStats stats() const;

 private:
  // What lookups read: the rows, and each table's configuration (for initial values).
  struct Serving {
    explicit Serving(const std::map<std::string, uint32_t>& dims) : rows(dims) {}
    ServedRows rows;
    std::map<std::string, TableSpec> specs;
  };
  // The stages of a poll (poll_mutex_ held).
  uint64_t poll_locked();
  // dims_of: where given, a table both serve must keep its dim (lookup buffers are sized by it).
  std::shared_ptr<Serving> load_whole(io::CheckpointDir& dir, size_t index,
                                      const Serving* dims_of = nullptr);
  std::map<std::string, TableChanges> read_changes(const io::ChainLink& link,
                                                   const Serving& serving, Pacer& pacer) const;
  bool serves_same_tables(const io::Manifest& m, const Serving& serving) const;
  void renew_lease(uint64_t version, bool force);
  void made_visible(const std::string& version_path);  // records the lag
  void background();
  bool serves_key(int64_t key) const;

  FollowerOptions options_;
  TableRegex tables_;
  SharedSlot<Serving> serving_;
  std::mutex poll_mutex_;  // poll, and what it keeps below
  uint64_t xxh3_ = 0;      // the manifest checksum of the version served
  bool reload_ = false;    // an apply failed: the next poll loads the newest version whole
  std::string lease_id_;   // "" without a lease
  uint64_t lease_version_ = 0;
  int64_t lease_renewed_ms_ = 0;
  std::atomic<uint64_t> versions_applied_{0}, full_loads_{0}, lookups_{0}, polls_{0},
      chain_lost_{0};
  std::atomic<double> last_apply_seconds_{0};
  // Counted by read_changes (const: it changes nothing that lookups read).
  mutable std::atomic<uint64_t> delta_bytes_read_{0}, serving_files_read_{0}, serving_fallbacks_{0};
  void throw_if_cancelled() const;     // Error(BUSY) once cancel() or the destructor ran
  std::atomic<bool> stopping_{false};  // set by cancel() and the destructor: polls give up
  mutable std::mutex stats_mutex_;     // what follows
  embstore_status_t last_poll_status_ = EMBSTORE_OK;
  std::string last_poll_error_;
  std::deque<double> lags_;  // the last kLagWindow, oldest first
  std::unique_ptr<DirWatch> watch_;
  std::thread background_;
};

}  // namespace embstore::serving
