#include "host/checkpoint/checkpointer.hpp"

#include <errno.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "cuda/row/snapshot.h"
#include "host/checkpoint/publish.hpp"
#include "host/error.hpp"
#include "io/engine/engine.hpp"
#include "io/format/chain.hpp"
#include "io/format/commit.hpp"
#include "io/format/lease.hpp"
#include "io/format/manifest.hpp"

namespace embstore::checkpoint {

namespace {

using Clock = std::chrono::steady_clock;
using io::detail::errno_text;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Whether two spellings name the same directory ("ckpt", "ckpt/", "./ckpt").
bool same_dir(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea);
  const auto cb = std::filesystem::weakly_canonical(b, eb);
  if (ea || eb) {
    return std::filesystem::path(a).lexically_normal() ==
           std::filesystem::path(b).lexically_normal();
  }
  return ca == cb;
}

void log_line(const std::string& line) { std::fprintf(stderr, "embstore: %s\n", line.c_str()); }

}  // namespace

Checkpointer::Checkpointer(StoreView& store) : store_(store) {}

Checkpointer::~Checkpointer() {
  if (staging_thread_.joinable()) staging_thread_.join();
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return job_ == nullptr; });
  stopping_ = true;
  lock.unlock();
  changed_.notify_all();
  if (worker_.joinable()) worker_.join();
}

void Checkpointer::wait_for_job(std::unique_lock<std::mutex>& lock, bool stall) {
  if (job_ == nullptr) return;
  const auto start = Clock::now();
  changed_.wait(lock, [&] { return job_ == nullptr; });
  if (stall) outcomes_.waited(seconds_since(start));
}

uint64_t Checkpointer::checkpoint(const std::string& dir, bool full) {
  std::lock_guard op(op_mutex_);
  return sharded() ? start_collective(dir, full, false) : start(dir, full, false);
}

// ------------------------------------------------------------------------- on the caller --

uint64_t Checkpointer::start(const std::string& dir, bool full, bool from_policy) {
  const auto call_start = Clock::now();
  {
    std::unique_lock lock(mutex_);
    wait_for_job(lock, true);
  }
  const double wait_seconds = seconds_since(call_start);
  const uint64_t version = store_.step();
  if (int r = io::create_directories(dir); r < 0) {
    fail(EMBSTORE_IO_ERROR, "cannot create checkpoint directory '{}': {}", dir, errno_text(r));
  }
  lock_dir(dir);  // before anything in dir is looked at, removed or written
  std::unique_ptr<Job> job = plan(dir, version, full);
  job->from_policy = from_policy;
  job->wait_seconds = wait_seconds;
  if (int r = io::remove_leftovers(dir, nullptr); r < 0) {
    log_line(fmt::format("could not remove every leftover in '{}': {}", dir, errno_text(r)));
  }
  {
    // Before anything is captured: once a table is, only the worker can end its snapshot.
    std::lock_guard lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_main(); });
  }

  // Everything that can fail on the way comes before capture, so a failure changes nothing
  // (a job dropped before it starts rolls its version directory back).
  prepare_and_capture(*job);

  std::lock_guard lock(mutex_);
  outcomes_.captured(job->capture_seconds);
  outcomes_.starting(version);
  job_ = std::move(job);
  changed_.notify_all();
  return version;
}

void Checkpointer::prepare_and_capture(Job& job) {
  const std::vector<Table*> tables = store_.tables();
  StagingRing& ring = ring_for(tables);
  prepare(job, tables, ring, store_.pipeline().io_queue_depth);
  {
    std::lock_guard lock(mutex_);
    job.attachments = std::move(attachments_);
    attachments_.clear();
  }
  try {
    capture(job, ring);
  } catch (...) {
    std::lock_guard lock(mutex_);
    attachments_ = std::move(job.attachments);
    throw;
  }
}

std::unique_ptr<Job> Checkpointer::plan(const std::string& dir, uint64_t version, bool full) {
  std::vector<io::VersionDir> versions;
  if (int r = io::list_versions(dir, &versions); r < 0) {
    fail(EMBSTORE_IO_ERROR, "cannot list checkpoint directory '{}': {}", dir, errno_text(r));
  }
  for (const io::VersionDir& v : versions) {
    if (v.version == version) {
      fail(EMBSTORE_ALREADY_EXISTS, "'{}' holds version {} already ({}): call embstore_step first",
           dir, version, v.name);
    }
  }
  auto job = std::make_unique<Job>();
  job->version = version;
  job->dir = dir;
  // A delta holds the rows dirty since the last capture, so it can only follow the version
  // that capture committed, in this directory, unchanged there, older than this one (steps may
  // go backwards), and only while the chain is short enough. Anything else is taken as a full
  // checkpoint: a delta that restore could not apply is never written.
  Chain chain;
  if (!full) {
    std::lock_guard lock(mutex_);
    chain = chain_;
    const Policy& p = schedule_.policy();
    const bool rebaseline = (p.max_chain_length > 0 && chain.deltas >= p.max_chain_length) ||
                            (p.rebaseline_fraction > 0 &&
                             static_cast<double>(chain.delta_bytes) >
                                 p.rebaseline_fraction * static_cast<double>(chain.full_bytes));
    if (rebaseline) chain.valid = false;
  }
  if (chain.valid && chain.version < version && same_dir(chain.dir, dir)) {
    auto it = std::find_if(versions.begin(), versions.end(), [&](const io::VersionDir& v) {
      return v.version == chain.version && v.full == chain.full;
    });
    io::Manifest pm;
    std::string why;
    if (it != versions.end() && io::read_version_manifest(dir, *it, &pm, &why) == 0 &&
        pm.xxh3 == chain.xxh3) {
      job->parent = chain.version;
      job->parent_dir = *it;
      job->parent_xxh3 = chain.xxh3;
      job->lineage = chain.lineage;
    } else if (it != versions.end()) {
      log_line(
          fmt::format("version {} in '{}' is not the one this store committed ({}): the "
                      "incremental checkpoint {} is taken as a full one",
                      chain.version, dir, why.empty() ? "its manifest changed" : why, version));
    }
  }
  job->full = !job->parent.has_value();
  if (job->full) job->lineage = io::new_lineage();
  {
    std::lock_guard lock(mutex_);
    job->serving = serving_copies(job->full, serving_mode(dir));
  }
  return job;
}

void Checkpointer::prepare_staging() {
  if (staging_thread_.joinable()) return;  // under way, or done and not joined yet
  {
    std::lock_guard lock(mutex_);
    if (ring_) return;
  }
  const PipelineSettings settings = store_.pipeline();
  auto build = [this, settings] {
    // A chunk of at least 128 KiB (staging_bytes >= 1 MiB) holds the widest record (48 KiB):
    // the ring serves every table. A failure here only leaves it to the first checkpoint.
    try {
      auto ring = std::make_unique<StagingRing>(settings.staging_bytes, 0, settings.staging_device);
      std::lock_guard lock(mutex_);
      if (!ring_) ring_ = std::move(ring);
    } catch (...) {
    }
  };
  // Pinned for a CUDA device, here, by the call that set the policy: the driver serializes
  // page-locking with the other CUDA calls of the process, so pinned on a thread beside training
  // it would stall the steps instead, for as long as it takes. On an H200 (2026-11-28) a policy
  // set before a 0.2 s run with no checkpoint due cost 36% of its steps/s while the p99 step
  // moved from 0.91 to 0.96 ms: one long stall, the size of pinning 256 MiB. On the host
  // nothing is pinned: the pages are touched on a thread and set_policy returns at once.
  if (settings.staging_device >= 0) {
    build();
  } else {
    staging_thread_ = std::thread(std::move(build));
  }
}

bool Checkpointer::staging_ready() const {
  std::lock_guard lock(mutex_);
  return ring_ != nullptr;
}

StagingRing& Checkpointer::ring_for(const std::vector<Table*>& tables) {
  if (staging_thread_.joinable()) staging_thread_.join();
  uint64_t widest = 0;
  for (Table* t : tables) widest = std::max(widest, row::record_bytes(t->spec().stride()));
  if (!ring_ || ring_->chunk_bytes() < widest) {
    const PipelineSettings settings = store_.pipeline();
    auto wider =
        std::make_unique<StagingRing>(settings.staging_bytes, widest, settings.staging_device);
    std::lock_guard lock(mutex_);  // stats() reads ring_
    if (ring_) {
      const StallStats r = ring_->stats();
      ring_stats_base_.seconds_total += r.seconds_total;
      ring_stats_base_.seconds_max = std::max(ring_stats_base_.seconds_max, r.seconds_max);
      ring_stats_base_.waits += r.waits;
      ring_stats_base_.copy_on_write_rows += r.copy_on_write_rows;
    }
    ring_ = std::move(wider);
  }
  return *ring_;
}

// ------------------------------------------------------------------------- on the worker --

void Checkpointer::worker_main() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || (job_ != nullptr && !job_->started); });
    if (job_ == nullptr || job_->started) return;  // stopping with nothing to do
    job_->started = true;
    Job& job = *job_;
    lock.unlock();
    if (job.world_size > 1) {
      run_local(job);  // never throws; the ranks end it together (settle)
      lock.lock();
      continue;
    }
    try {
      {
        std::string message;
        const embstore_status_t status = run(job, &message);
        finish(job, status, message);
      }
    } catch (...) {
      // run() ends every job itself; this is its own bookkeeping failing (no memory). End the
      // job anyway, so that nobody waits for it forever.
      ring_->abort();
      for (TableJob& t : job.tables) {
        try {
          t.impl->end_snapshot(true);
        } catch (...) {
        }
      }
      ring_->reset();
      lock.lock();
      if (job_ != nullptr) {
        outcomes_.lost();
        job_.reset();
      }
      changed_.notify_all();
      continue;
    }
    lock.lock();
  }
}

embstore_status_t Checkpointer::run(Job& job, std::string* message) {
  embstore_status_t status = EMBSTORE_OK;
  try {
    open_files(job);
    drain(job, *ring_);
    finish_rows(job);
    finalize(job);
    check_parent(job);
    commit(job);
  } catch (const Error& e) {
    status = e.status();
    *message = fmt::format("{}: {}", job.what(), e.what());
  } catch (const std::bad_alloc&) {
    status = EMBSTORE_OUT_OF_MEMORY;
    *message = job.what() + ": host memory allocation failed";
  } catch (const std::exception& e) {
    status = EMBSTORE_INTERNAL;
    *message = fmt::format("{}: {}", job.what(), e.what());
  } catch (...) {
    status = EMBSTORE_INTERNAL;
    *message = job.what() + ": unknown exception";
  }
  const bool committed = status == EMBSTORE_OK;
  if (const std::string trouble = end(job, *ring_, !committed);
      !trouble.empty() && status == EMBSTORE_OK) {
    status = EMBSTORE_INTERNAL;
    *message = fmt::format("{}: {}", job.what(), trouble);
  }
  if (status != EMBSTORE_OK) {
    // The attachments go with the next checkpoint instead, unless attached again since.
    std::lock_guard lock(mutex_);
    for (auto& [name, data] : job.attachments) attachments_.emplace(name, std::move(data));
  } else {
    after_commit(job);
  }
  return status;
}

void Checkpointer::finish(Job& job, embstore_status_t status, const std::string& message) {
  if (status != EMBSTORE_OK) log_line(message);
  std::lock_guard lock(mutex_);
  outcomes_.ended(job, status, message, Outcomes::info_of(job, ring_.get(), status == EMBSTORE_OK));
  if (status == EMBSTORE_OK) {
    if (job.full) {
      chain_ = Chain{
          true, job.dir, job.version, true, job.lineage, job.xxh3, job.bytes - job.serving_bytes,
          0,    0};
    } else {
      chain_.version = job.version;
      chain_.full = false;
      chain_.xxh3 = job.xxh3;
      chain_.delta_bytes += job.bytes - job.serving_bytes;  // what a restore reads
      ++chain_.deltas;
    }
  }
  job_.reset();
  changed_.notify_all();
}

void Checkpointer::retire(const std::string& dir, const std::string& name) {
  if (io::retire_version(dir, name) < 0)
    log_line(fmt::format("could not delete '{}/{}'", dir, name));
}

void Checkpointer::after_commit(const Job& job) {
  uint32_t keep = 0;
  std::string serving_dir;
  {
    std::lock_guard lock(mutex_);
    if (!same_dir(schedule_.policy().dir, job.dir)) return;
    keep = schedule_.policy().keep_full;
    serving_dir = schedule_.policy().serving_dir;
  }
  // The version is committed: nothing here may fail it (or escape into the job's end).
  const auto logged = [&](const char* what, auto&& f) {
    try {
      f();
    } catch (const std::exception& e) {
      log_line(fmt::format("{}: {}: {}", job.what(), what, e.what()));
    }
  };
  logged("retention after its commit", [&] { apply_retention(job.dir, job.version, keep); });
  if (serving_dir.empty()) return;
  int r = -ENOMEM;
  std::string detail;
  logged("publishing", [&] {
    r = publish_serving(job.dir + "/" + io::version_dir_name(job.version, job.full), serving_dir,
                        &detail);
  });
  {
    std::lock_guard lock(mutex_);
    ++(r == 0 ? serving_published_ : serving_skipped_);
  }
  if (r < 0) {
    log_line(fmt::format("{} is committed, but not published to serving_dir '{}': {}{}", job.what(),
                         serving_dir, detail.empty() ? errno_text(r) : detail,
                         job.full ? "" : "; the next full checkpoint publishes again"));
    return;
  }
  logged("retention in serving_dir", [&] { apply_retention(serving_dir, job.version, keep); });
}

void Checkpointer::refuse_checkpoints_in(const std::string& serving_dir) {
  std::vector<io::VersionDir> versions;
  if (io::list_versions(serving_dir, &versions) < 0) return;  // created above: empty or listable
  for (const io::VersionDir& v : versions) {
    io::Manifest m;
    if (io::read_manifest(serving_dir + "/" + v.name, &m, nullptr) == 0 && !m.serving_only) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "serving_dir '{}' holds checkpoint version {}, which is not serving-only: a "
           "serving_dir holds only what a policy published there (is it a checkpoint directory?)",
           serving_dir, v.name);
    }
  }
}

void Checkpointer::apply_retention(const std::string& dir, uint64_t newest, uint32_t keep) {
  if (keep == 0) return;
  std::vector<io::VersionDir> versions;
  if (io::list_versions(dir, &versions) < 0) return;
  // Only versions up to the one just written count: after a restore of an older version,
  // newer ones belong to an abandoned run and are neither counted nor deleted here. Only
  // committed checkpoints (a valid manifest) count towards keep_full.
  std::vector<uint64_t> fulls;
  for (const io::VersionDir& v : versions) {
    io::Manifest m;
    if (v.full && v.version <= newest && io::read_manifest(dir + "/" + v.name, &m, nullptr) == 0) {
      fulls.push_back(v.version);
    }
  }
  if (fulls.size() <= keep) return;
  // Followers' leases (io/format/lease.hpp): the chain of each live lease's version stays.
  std::vector<std::string> bad_leases;
  const uint64_t oldest_kept =
      std::min(fulls[fulls.size() - keep],
               io::oldest_leased_version(dir, versions, io::wall_clock_ms(), &bad_leases));
  for (const std::string& bad : bad_leases) log_line(fmt::format("ignored a lease: {}", bad));
  // Newest first: a delta goes before the versions it applies on, so that a crash half-way
  // leaves the older part of a chain, never a delta without its parent (the crash campaign
  // found that).
  for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
    if (v->version < oldest_kept) retire(dir, v->name);
  }
}

uint32_t Checkpointer::serving_mode(const std::string& dir) const {
  const Policy& p = schedule_.policy();
  return (p.serving_deltas ? kServingDeltas : 0u) |
         (!p.serving_dir.empty() && same_dir(p.dir, dir) ? kServingPublish : 0u);
}

bool Checkpointer::serving_copies(bool full, uint32_t mode) {
  return (mode & kServingPublish) != 0 || (!full && (mode & kServingDeltas) != 0);
}

// ---------------------------------------------------------------------- the store's calls --

void Checkpointer::lock_dir(const std::string& dir) {
  std::error_code ec;
  const std::filesystem::path canonical = std::filesystem::canonical(dir, ec);
  const std::string key = ec ? dir : canonical.string();
  std::lock_guard lock(locks_mutex_);
  if (locks_.count(key) != 0) return;
  std::unique_ptr<io::DirLock> taken;
  std::string detail;
  const int r = io::DirLock::acquire(
      key, fmt::format("a store of {}", program_invocation_short_name), &taken, &detail);
  if (r == -EBUSY) fail(EMBSTORE_BUSY, "{}", detail);
  if (r < 0) fail(EMBSTORE_IO_ERROR, "{}", detail);
  locks_.emplace(key, std::move(taken));
}

embstore_status_t Checkpointer::wait(uint64_t version, std::string* message) {
  if (sharded()) {
    std::lock_guard op(op_mutex_);
    settle(true);
  }
  std::unique_lock lock(mutex_);
  if (job_ != nullptr && job_->version == version) wait_for_job(lock, false);
  embstore_status_t status = EMBSTORE_OK;
  if (!outcomes_.take(version, &status, message)) {
    *message = fmt::format("this store took no checkpoint of version {}", version);
    return EMBSTORE_NOT_FOUND;
  }
  return status;
}

embstore_status_t Checkpointer::wait_idle(std::string* message) {
  if (sharded()) {
    std::lock_guard op(op_mutex_);
    settle(true);
  }
  std::unique_lock lock(mutex_);
  wait_for_job(lock, false);
  embstore_status_t status = EMBSTORE_OK;
  return outcomes_.take_untold(false, &status, message) ? status : EMBSTORE_OK;
}

void Checkpointer::attach(const std::string& name, const void* data, size_t bytes) {
  std::vector<char> copy(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  std::lock_guard lock(mutex_);
  attachments_[name] = std::move(copy);
}

void Checkpointer::set_policy(Policy policy) {
  if (!policy.dir.empty()) {
    if (int r = io::create_directories(policy.dir); r < 0) {
      fail(EMBSTORE_IO_ERROR, "cannot create checkpoint directory '{}': {}", policy.dir,
           errno_text(r));
    }
    // A sharded store's checkpoints are rank 0's to commit: it alone is the directory's writer.
    if (store_.rank() == 0) lock_dir(policy.dir);
  }
  if (!policy.serving_dir.empty()) {
    if (same_dir(policy.serving_dir, policy.dir)) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "policy serving_dir '{}' is its dir: a serving-only directory is a directory of its own",
           policy.serving_dir);
    }
    if (int r = io::create_directories(policy.serving_dir); r < 0) {
      fail(EMBSTORE_IO_ERROR, "cannot create serving_dir '{}': {}", policy.serving_dir,
           errno_text(r));
    }
    if (store_.rank() == 0) {
      lock_dir(policy.serving_dir);
      refuse_checkpoints_in(policy.serving_dir);
    }
  }
  const bool scheduled = !policy.dir.empty() &&
                         (policy.full_every_steps != 0 || policy.incremental_every_steps != 0 ||
                          policy.full_every_seconds != 0 || policy.incremental_every_seconds != 0);
  {
    std::lock_guard lock(mutex_);
    schedule_.set(std::move(policy), store_.step());
  }
  if (scheduled) {
    std::lock_guard op(op_mutex_);  // staging_thread_ is the checkpoint calls' too
    prepare_staging();
  }
}

embstore_status_t Checkpointer::on_step(uint64_t step, std::string* message) {
  if (sharded()) return on_step_collective(step, message);
  std::unique_lock op(op_mutex_, std::try_to_lock);
  if (!op.owns_lock()) return EMBSTORE_OK;  // a checkpoint() or restore() runs: later
  std::optional<bool> due;
  std::string dir;
  {
    std::lock_guard lock(mutex_);
    embstore_status_t failed = EMBSTORE_OK;
    if (outcomes_.take_untold(true, &failed, message)) return failed;
    due = schedule_.take(step, job_ != nullptr);
    if (!due) return EMBSTORE_OK;
    dir = schedule_.policy().dir;
  }
  try {
    start(dir, *due, true);
  } catch (...) {
    std::lock_guard lock(mutex_);
    schedule_.retry(*due);  // tried again at the next step
    throw;
  }
  return EMBSTORE_OK;
}

bool Checkpointer::restored_attachment(const std::string& name, std::vector<char>* out) const {
  std::lock_guard lock(mutex_);
  auto it = restored_attachments_.find(name);
  if (it == restored_attachments_.end()) return false;
  *out = it->second;
  return true;
}

embstore_checkpoint_stats_t Checkpointer::stats() const {
  std::lock_guard lock(mutex_);
  StallStats rings = ring_stats_base_;
  if (ring_) {
    const StallStats now = ring_->stats();
    rings.copy_on_write_rows += now.copy_on_write_rows;
    rings.seconds_total += now.seconds_total;
    rings.seconds_max = std::max(rings.seconds_max, now.seconds_max);
  }
  embstore_checkpoint_stats_t stats = outcomes_.stats(rings, job_ != nullptr, schedule_.deferred());
  stats.serving_published = serving_published_;
  stats.serving_skipped = serving_skipped_;
  return stats;
}

bool Checkpointer::info(uint64_t version, embstore_checkpoint_info_t* out) const {
  std::lock_guard lock(mutex_);
  if (job_ != nullptr && job_->version == version) {
    *out = Outcomes::info_of(*job_, ring_.get(), false);
    return true;
  }
  return outcomes_.info(version, out);
}

}  // namespace embstore::checkpoint
