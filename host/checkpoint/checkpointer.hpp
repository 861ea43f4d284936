// The checkpoint side of a store: plans each checkpoint and runs its job (job.hpp: capture on
// the calling thread, the rest on a worker), keeps the chain a delta can extend, holds the
// writer locks of the directories it writes (io/format/dir_lock.hpp), runs the policy's schedule at
// each step (schedule.hpp) with retention, keeps the outcomes (outcomes.hpp), the attachments,
// and restores (restore.cpp over restore_plan.hpp). One checkpoint is in flight at a time. It
// sees its store through StoreView only.
#pragma once

#include <embstore/embstore.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "host/checkpoint/job.hpp"
#include "host/checkpoint/outcomes.hpp"
#include "host/checkpoint/restore_plan.hpp"
#include "host/checkpoint/schedule.hpp"
#include "host/checkpoint/staging.hpp"
#include "host/checkpoint/store_view.hpp"
#include "io/format/dir_lock.hpp"

namespace embstore::checkpoint {

class LoadStages;  // restore.cpp

class Checkpointer {
 public:
  explicit Checkpointer(StoreView& store);
  // Waits for the checkpoint in flight, then stops the worker and lets go of the locks.
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
  // replaces the policy. A policy with a schedule also has the staging ring allocated (and
  // pinned, on CUDA) in the background now, so that no checkpoint's call pays for it.
  void set_policy(Policy policy);
  // Whether the staging ring exists (tests).
  bool staging_ready() const;
  // embstore_step: runs the policy at step. Returns a failure to report (see embstore.h).
  embstore_status_t on_step(uint64_t step, std::string* message);

  // Loads a version into the store (see embstore_restore); returns the version.
  uint64_t restore(const std::string& dir, uint64_t version);
  // Warm start (see embstore_warm_start): each source's tables that match its regex (a later
  // source overriding an earlier one, table by table) loaded into the store; the store's step
  // stays, and its next checkpoint is full.
  struct WarmSource {
    std::string dir;
    uint64_t version = 0;
    std::string tables_regex;  // RE2 syntax (host/table/table_regex.hpp), matching whole names
    bool values_only = false;
  };
  void warm_start(const std::vector<WarmSource>& sources);
  // The attachment of the last restore or warm start; false when there is none of that name.
  bool restored_attachment(const std::string& name, std::vector<char>* out) const;

  embstore_checkpoint_stats_t stats() const;
  // What this store knows of a version it took (embstore_checkpoint_info); false when none.
  bool info(uint64_t version, embstore_checkpoint_info_t* out) const;

 private:
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

  uint64_t start(const std::string& dir, bool full, bool from_policy);
  // The calling thread's stages of a planned job: prepare, the pending attachments taken into
  // it, capture (on failure the attachments are pending again).
  void prepare_and_capture(Job& job);
  // Ends the checkpoint in flight (settled on every rank of a sharded store) before a restore.
  void end_job_in_flight();
  // Restore's and warm start's stages after their plan (restore.cpp): each table loaded aside,
  // then `also` (what else the caller reads), then on a sharded store the ranks' agreement, then
  // the swap. A failure leaves the store as it was (parked tables read back).
  void replace_tables(LoadStages& stages, const Replacement& r, const std::function<void()>& also);
  // The loop of replace_tables: each table loaded aside into *loaded; with a spill file, the
  // store's table it replaces parked there first and added to *spilled.
  void load_tables(const Replacement& r, SpillFile* spill_file, std::vector<Table*>* spilled,
                   std::vector<std::unique_ptr<Table>>* loaded);
  // The plan of a checkpoint of version into dir: its kind and parent.
  std::unique_ptr<Job> plan(const std::string& dir, uint64_t version, bool full);
  // A staging ring whose chunks hold a record of every table (waiting for one being prepared).
  StagingRing& ring_for(const std::vector<Table*>& tables);
  // Starts allocating the staging ring on a thread of its own, unless it exists or is under way.
  void prepare_staging();
  void worker_main();
  // The worker's stages of job; returns its status and message.
  embstore_status_t run(Job& job, std::string* message);
  // Records job's outcome, moves the chain on, and lets the next job start.
  void finish(Job& job, embstore_status_t status, const std::string& message);
  // After job committed into the policy's dir: retention there, then the publication to the
  // policy's serving_dir (publish.hpp) and retention there. Nothing for another directory.
  void after_commit(const Job& job);
  // Throws Error(INVALID_ARGUMENT) when serving_dir holds a version that is not serving-only
  // (a checkpoint directory given as a policy's serving_dir).
  void refuse_checkpoints_in(const std::string& serving_dir);
  // Keeps the newest keep full checkpoints up to version newest in dir (0: all), and the
  // chains of followers' leases.
  void apply_retention(const std::string& dir, uint64_t newest, uint32_t keep);
  // Which values-only files a checkpoint into dir gets, by the policy (under mutex_): bits
  // kServingDeltas (deltas get copies) and kServingPublish (every version gets them, for the
  // serving_dir: dir is the policy's). A collective checkpoint carries rank 0's.
  static constexpr uint32_t kServingDeltas = 1, kServingPublish = 2;
  uint32_t serving_mode(const std::string& dir) const;
  static bool serving_copies(bool full, uint32_t mode);
  // Deletes dir's version directory name (io::retire_version); a failure is logged.
  void retire(const std::string& dir, const std::string& name);
  // Takes dir's writer lock unless this store holds it already; kept until the store is
  // destroyed. Throws Error: BUSY (another writer holds it), IO_ERROR.
  void lock_dir(const std::string& dir);
  // Wait under lock for the job in flight to end; the wait counts as a stall when stall.
  void wait_for_job(std::unique_lock<std::mutex>& lock, bool stall);

  // ---- sharded stores: collective checkpoints (collective.cpp) ----------------------------
  // Every call below is collective: every rank makes it, at the same point of its calls.
  bool sharded() const { return store_.world_size() > 1; }
  // embstore_checkpoint: every rank agrees on the version, the kind (a delta only where every
  // rank can write one on the same parent) and rank 0's staging directory, captures, and
  // hands its part to its worker. Any rank's failure before the hand-over fails every rank.
  uint64_t start_collective(const std::string& dir, bool full, bool from_policy);
  // The worker's stages of a collective job on this rank: its files, up to finalize_files.
  void run_local(Job& job) noexcept;
  // Ends the collective checkpoint in flight once every rank's worker is done: rank 0 gathers
  // every rank's part, writes the manifest and commits (when none failed), every rank learns
  // the outcome and ends its job. block: waits for this rank's worker first; else returns at
  // once while any rank's is not done. Nothing when no checkpoint is in flight.
  void settle(bool block);
  // Rank 0's part of settle: the manifest of every rank's part, the parent check, the commit.
  void commit_collective(Job& job, std::vector<io::Manifest> parts);
  // embstore_step of a sharded store: settle, then rank 0's decision of the policy.
  embstore_status_t on_step_collective(uint64_t step, std::string* message);

  StoreView& store_;
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
  std::thread staging_thread_;  // prepare_staging()'s; joined before ring_ is used or replaced
  StallStats ring_stats_base_;  // those of staging rings replaced by wider ones
  Outcomes outcomes_;
  Schedule schedule_;
  Chain chain_;
  uint64_t serving_published_ = 0, serving_skipped_ = 0;           // publications to serving_dir
  std::map<std::string, std::vector<char>> attachments_;           // for the next checkpoint
  std::map<std::string, std::vector<char>> restored_attachments_;  // of the last restore
};

}  // namespace embstore::checkpoint
