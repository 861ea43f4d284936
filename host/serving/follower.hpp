// A follower (embstore_follower_*): a read-only store that serves the values of a training
// run's checkpoint directory and moves to each newly committed version. Stages of a poll:
//   list      the directory's newest committed version and its chain (every link checked)
//   choose    the deltas after the version served, when it is a link of that chain; else (the
//             chain was rebased or pruned) the newest version whole
//   read      each delta's rows and tombstones of the served tables, every file checked, before
//             any of it is served (a corrupt delta is refused: the follower stays where it was)
//   apply     ServedRows::apply, one version at a time (served_rows.hpp); a whole version goes
//             into new ServedRows, swapped in for the old ones
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <string>

#include "host/serving/served_rows.hpp"
#include "host/table/table.hpp"

namespace embstore::io {
struct ChainLink;
class CheckpointDir;
}  // namespace embstore::io

namespace embstore::serving {

struct FollowerOptions {
  std::string dir;
  std::string tables_regex = ".*";    // ECMAScript, whole names
  uint32_t rank = 0, world_size = 1;  // the serving layout: keys embstore_shard_of gives rank
  bool initial_values = false;        // keys without a row read as the initializer's values
};

struct FollowerStats {
  uint64_t version = 0;
  uint64_t versions_applied = 0;  // deltas applied by polls
  uint64_t full_loads = 0;        // whole versions loaded (the first, and after rebases)
  uint64_t lookups = 0;           // batches served
  double last_apply_seconds = 0;  // the last poll's read and apply of its versions
};

class Follower {
 public:
  // Loads the newest committed version of options.dir. Throws Error: NOT_FOUND (no directory,
  // no committed version, no table matching), INVALID_ARGUMENT (a bad regex), CORRUPT, IO_ERROR.
  explicit Follower(FollowerOptions options);

  // Any thread, any time (also during poll): the rows of keys in table at one version.
  // INVALID_ARGUMENT for a table not served or a key another rank of the layout serves.
  void lookup(const std::string& table, const int64_t* keys, size_t n, float* out);
  // One thread at a time: moves to the newest committed version; returns the version served.
  // On failure (CORRUPT, IO_ERROR, NOT_FOUND when the directory went) it throws and the version
  // served stays the last one applied.
  uint64_t poll();
  uint64_t version() const;
  FollowerStats stats() const;

 private:
  // What lookups read: the rows, and each table's configuration (for initial values).
  struct Serving {
    explicit Serving(const std::map<std::string, uint32_t>& dims) : rows(dims) {}
    ServedRows rows;
    std::map<std::string, TableSpec> specs;
  };
  std::shared_ptr<Serving> load_whole(io::CheckpointDir& dir, size_t index);
  std::map<std::string, TableChanges> read_changes(const io::ChainLink& link,
                                                   const Serving& serving) const;
  bool serves_key(int64_t key) const;

  FollowerOptions options_;
  std::regex tables_;
  SharedSlot<Serving> serving_;
  std::mutex poll_mutex_;  // poll, and what it keeps below
  uint64_t xxh3_ = 0;      // the manifest checksum of the version served
  bool reload_ = false;    // an apply failed: the next poll loads the newest version whole
  std::atomic<uint64_t> versions_applied_{0}, full_loads_{0}, lookups_{0};
  std::atomic<double> last_apply_seconds_{0};
};

}  // namespace embstore::serving
