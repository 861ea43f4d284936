// The checkpoint side of a store: capture at a step boundary, the background worker that
// drains captured rows through the staging ring into row files, the commit, retention, the
// policy, attachments, and restore. One checkpoint is in flight at a time.
#pragma once

#include <embstore/embstore.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/checkpoint/staging.hpp"
#include "io/dir_lock.hpp"

struct embstore_store;

namespace embstore::checkpoint {

struct Job;

struct Policy {
  std::string dir;
  uint64_t full_every_steps = 0, incremental_every_steps = 0;
  double full_every_seconds = 0, incremental_every_seconds = 0;
  uint32_t keep_full = 0;
  // Rebaseline: an incremental checkpoint is taken as a full one once the chain since the
  // last full has this many deltas, or its deltas' bytes exceed this fraction of the full's.
  uint32_t max_chain_length = 32;
  double rebaseline_fraction = 0.5;
};

class Checkpointer {
 public:
  explicit Checkpointer(embstore_store& store);
  // Waits for the checkpoint in flight, then stops the worker.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Captures every table and hands the checkpoint to the worker; returns its version. Throws
  // Error. Waits first for a checkpoint in flight.
  uint64_t checkpoint(const std::string& dir, bool full);
  // The outcome of a version this store took; *message gets the failure's text.
  embstore_status_t wait(uint64_t version, std::string* message);
  // Waits until no checkpoint is in flight; returns the outcome of the last one, if it failed
  // and nobody has been told (else OK).
  embstore_status_t wait_idle(std::string* message);

  void attach(const std::string& name, const void* data, size_t bytes);
  // Creates the policy's dir and takes its writer lock (throws Error BUSY or IO_ERROR), then
  // replaces the policy.
  void set_policy(Policy policy);
  // embstore_step: runs the policy at step. Returns a failure to report (see embstore.h).
  embstore_status_t on_step(uint64_t step, std::string* message);

  // Loads a version into the store (see embstore_restore); returns the version.
  uint64_t restore(const std::string& dir, uint64_t version);
  // The attachment of the last restore; false when there is none of that name.
  bool restored_attachment(const std::string& name, std::vector<char>* out) const;

  embstore_checkpoint_stats_t stats() const;
  // What this store knows of a version it took (embstore_checkpoint_info); false when none.
  bool info(uint64_t version, embstore_checkpoint_info_t* out) const;

 private:
  static constexpr size_t kMaxOutcomes = 4096;  // the oldest are forgotten
  struct Outcome {
    embstore_status_t status = EMBSTORE_OK;
    std::string message;
    bool reported = false;  // a policy failure returned by on_step already
    bool from_policy = false;
    embstore_checkpoint_info_t info{};
  };

  uint64_t start(const std::string& dir, bool full, bool from_policy);
  void worker_main();
  void run(Job& job);
  void finish(Job& job, embstore_status_t status, const std::string& message);
  // job's figures so far (ring_ must be the ring job drains through).
  embstore_checkpoint_info_t info_of(const Job& job) const;
  // Keeps the newest keep_full full checkpoints up to job's version in the policy's dir.
  void apply_retention(const Job& job);
  // Deletes a version directory: renamed out of sight, then removed.
  void retire(const std::string& dir, const std::string& path);
  // Takes dir's writer lock unless this store holds it already; kept until the store is
  // destroyed. Throws Error: BUSY (another writer holds it), IO_ERROR.
  void lock_dir(const std::string& dir);
  // Wait under lock for the job in flight to end; the wait counts as a stall when stall.
  void wait_for_job(std::unique_lock<std::mutex>& lock, bool stall);

  embstore_store& store_;
  std::mutex op_mutex_;  // one checkpoint() / restore() at a time

  std::mutex locks_mutex_;
  // The directories this store writes into, by canonical path: one writer per directory.
  std::map<std::string, std::unique_ptr<io::DirLock>> locks_;

  mutable std::mutex mutex_;  // everything below
  std::condition_variable changed_;
  std::unique_ptr<Job> job_;  // the checkpoint in flight, owned here until the worker ends it
  bool stopping_ = false;
  std::thread worker_;
  std::unique_ptr<StagingRing> ring_;
  std::map<uint64_t, Outcome> outcomes_;
  std::map<std::string, std::vector<char>> attachments_;           // for the next checkpoint
  std::map<std::string, std::vector<char>> restored_attachments_;  // of the last restore
  Policy policy_;
  // Where each schedule last fired (or set_policy / restore); due but deferred while another
  // checkpoint was in flight.
  uint64_t policy_full_step_ = 0, policy_incr_step_ = 0;
  std::chrono::steady_clock::time_point policy_full_time_, policy_incr_time_;
  bool policy_full_due_ = false, policy_incr_due_ = false;

  // The chain a delta can extend: the last committed (or restored) version and its directory,
  // what a delta on it must name (its kind, lineage and manifest checksum), and the sizes the
  // rebaseline rule looks at.
  struct Chain {
    bool valid = false;
    std::string dir;
    uint64_t version = 0;
    bool full = true;
    uint64_t lineage = 0, xxh3 = 0;
    uint64_t full_bytes = 0, delta_bytes = 0;
    uint32_t deltas = 0;
  };
  Chain chain_;

  // Statistics; ring_stats_base_: those of staging rings replaced by wider ones.
  StallStats ring_stats_base_;
  uint64_t committed_ = 0, failed_ = 0, rows_written_ = 0, bytes_written_ = 0;
  uint64_t deltas_committed_ = 0, deferred_ = 0;
  uint64_t last_version_ = EMBSTORE_LATEST;
  double wait_stall_total_ = 0, wait_stall_max_ = 0, capture_seconds_last_ = 0;
};

}  // namespace embstore::checkpoint
