// Collective checkpoints of a sharded store (checkpointer.hpp, "sharded stores"). Every rank
// runs the single-process stages (job.hpp) on its own tables and writes only its own files, into
// one staging directory that rank 0 begins; rank 0 alone writes the manifest (every rank's files
// with their sizes and checksums, gathered through the communicator) and renames, once every
// rank's files are durable: no file is written by two ranks, so a shared file system without
// locks (NFS) is enough. The ranks meet only on the caller's thread (embstore_checkpoint,
// embstore_step, embstore_checkpoint_wait, embstore_restore, embstore_store_destroy), never on
// embstore's own threads, so the communicator needs no thread level beyond the trainer's.
//
//   start_collective   plan (every rank) -> agree on version, kind and lineage -> rank 0
//                      begins the version -> every rank joins, prepares, captures -> agree
//   run_local          (worker) open_files, drain, finish_rows, finalize_files
//   settle             every rank done? -> parts to rank 0 -> rank 0: manifest, parent check,
//                      commit -> every rank learns the outcome -> end
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "host/checkpoint/checkpointer.hpp"
#include "host/error.hpp"
#include "host/shard/agreement.hpp"
#include "io/engine/engine.hpp"
#include "io/format/commit.hpp"
#include "io/format/manifest.hpp"

namespace embstore::checkpoint {

namespace {

using io::detail::errno_text;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// What each rank plans for the checkpoint (all_gathered: plain data of one size everywhere).
struct Proposal {
  int32_t status = EMBSTORE_OK;
  uint32_t can_delta = 0;
  uint32_t serving = 0;  // rank 0's policy decides which versions get values-only files
  uint64_t version = 0;
  uint64_t parent = 0, parent_xxh3 = 0;
  uint64_t lineage = 0;      // of the chain a delta continues
  uint64_t new_lineage = 0;  // rank 0's: the lineage of a full checkpoint
};

// Rank 0's staging directory, by name inside the checkpoint directory.
struct Staging {
  int32_t status = EMBSTORE_OK;
  char name[124] = {};
};

// Where a rank's worker stands.
struct Progress {
  uint32_t done = 0;
  int32_t status = EMBSTORE_OK;
};

// Rank 0's outcome of the commit.
struct Outcome {
  int32_t status = EMBSTORE_OK;
  uint32_t reserved = 0;
  uint64_t xxh3 = 0;
  char message[496] = {};
};

template <typename T>
std::vector<T> all_gather(shard::Communicator& comm, const T& mine) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<T> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, sizeof mine, all.data());
  return all;
}

template <typename T>
std::vector<int32_t> statuses_of(const std::vector<T>& all) {
  std::vector<int32_t> out;
  for (const T& a : all) out.push_back(a.status);
  return out;
}

void log_line(const std::string& line) { std::fprintf(stderr, "embstore: %s\n", line.c_str()); }

// The tables of two ranks' parts can share a manifest entry.
void check_same_table(const io::TableEntry& a, const io::TableEntry& b, size_t rank) {
  if (a.name != b.name) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "rank {} has table '{}' where rank 0 has '{}': every rank must create the same tables",
         rank, b.name, a.name);
  }
  if (a.config.dim != b.config.dim || a.config.optimizer != b.config.optimizer ||
      a.state_dim != b.state_dim || a.config.admit_after != b.config.admit_after ||
      a.config.admit_bloom_bytes != b.config.admit_bloom_bytes ||
      a.config.value_codec != b.config.value_codec ||
      a.config.state_codec != b.config.state_codec ||
      a.config.serving_codec != b.config.serving_codec) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "table '{}' of rank {} differs from rank 0's (dim, optimizer, admission or codecs): every "
         "rank "
         "must create its tables with the same configuration",
         a.name, rank);
  }
}

}  // namespace

uint64_t Checkpointer::start_collective(const std::string& dir, bool full, bool from_policy) {
  shard::Communicator& comm = *store_.comm();
  const uint32_t rank = store_.rank(), world = store_.world_size();
  const auto call_start = Clock::now();
  settle(true);  // the previous checkpoint ends on every rank first
  const double wait_seconds = seconds_since(call_start);
  const uint64_t version = store_.step();

  // Stage: each rank's plan, then the agreed one.
  std::unique_ptr<Job> job;
  Proposal mine;
  mine.version = version;
  const shard::LocalCheck planned = shard::run_stage([&] {
    if (dir.empty()) {  // a policy checkpoint that rank 0's policy decided and this rank lacks
      fail(EMBSTORE_INVALID_ARGUMENT,
           "rank {} has no checkpoint policy dir: every rank must set the same policy", rank);
    }
    if (int r = io::create_directories(dir); r < 0) {
      fail(EMBSTORE_IO_ERROR, "cannot create checkpoint directory '{}': {}", dir, errno_text(r));
    }
    if (rank == 0) lock_dir(dir);  // the committer is the directory's writer
    job = plan(dir, version, full);
    if (rank == 0) {
      if (int r = io::remove_leftovers(dir, nullptr); r < 0) {
        log_line(fmt::format("could not remove every leftover in '{}': {}", dir, errno_text(r)));
      }
      mine.new_lineage = io::new_lineage();
    }
    mine.can_delta = job->parent.has_value();
    {
      std::lock_guard lock(mutex_);
      mine.serving = serving_mode(dir);
    }
    if (job->parent) {
      mine.parent = *job->parent;
      mine.parent_xxh3 = job->parent_xxh3;
    }
    mine.lineage = job->lineage;
  });
  mine.status = planned.status;
  const std::vector<Proposal> plans = all_gather(comm, mine);
  shard::raise_first_failure(statuses_of(plans), static_cast<int>(rank), planned,
                             "to plan the checkpoint");
  for (size_t q = 0; q < plans.size(); ++q) {
    if (plans[q].version != version) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "rank {} checkpoints at step {}, this rank at step {}: every rank must call "
           "embstore_step and embstore_checkpoint together",
           q, plans[q].version, version);
    }
  }
  // A delta only where every rank can write one on the same parent.
  bool delta = true;
  for (const Proposal& p : plans) {
    delta = delta && p.can_delta && p.parent == plans[0].parent &&
            p.parent_xxh3 == plans[0].parent_xxh3 && p.lineage == plans[0].lineage;
  }
  if (!delta) {
    if (job->parent) {
      log_line(
          fmt::format("{}: another rank cannot write a delta on version {}: taken as a full "
                      "checkpoint",
                      job->what(), *job->parent));
    }
    job->parent.reset();
    job->full = true;
    job->lineage = plans[0].new_lineage;
  }
  job->serving = serving_copies(job->full, plans[0].serving);
  job->rank = rank;
  job->world_size = world;
  job->from_policy = from_policy;
  job->wait_seconds = wait_seconds;
  {
    std::lock_guard lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_main(); });
  }

  // Stage: rank 0 begins the version directory; every rank learns where.
  Staging staging;
  shard::LocalCheck begun;
  if (rank == 0) {
    begun = shard::run_stage([&] {
      std::string detail;
      if (int r = io::VersionWriter::begin(dir, version, job->full, &job->out, &detail, 0, world);
          r < 0) {
        fail(EMBSTORE_IO_ERROR, "{}", detail);
      }
      const std::string name = std::filesystem::path(job->out->staging()).filename().string();
      if (name.size() >= sizeof staging.name) {
        fail(EMBSTORE_INTERNAL, "staging directory name '{}' is too long", name);
      }
      std::memcpy(staging.name, name.data(), name.size());
    });
    staging.status = begun.status;
  }
  const std::vector<Staging> stagings = all_gather(comm, staging);
  // Only rank 0's status counts here (the others had nothing to do).
  std::vector<int32_t> began(stagings.size(), EMBSTORE_OK);
  began[0] = stagings[0].status;
  shard::raise_first_failure(began, static_cast<int>(rank), begun,
                             "to begin the version directory");

  // Stage: every rank joins it, prepares and captures; any failure ends the job everywhere.
  bool captured = false;
  const shard::LocalCheck ready = shard::run_stage([&] {
    if (rank != 0) {
      std::string detail;
      const std::string path = dir + "/" + std::string(stagings[0].name);
      if (int r = io::VersionWriter::join(dir, path, version, job->full, rank, world, &job->out,
                                          &detail);
          r < 0) {
        fail(EMBSTORE_IO_ERROR, "{}", detail);
      }
    }
    prepare_and_capture(*job);
    captured = true;
  });
  try {
    shard::agree(comm, ready, "to capture the checkpoint");
  } catch (...) {
    if (captured) {
      end(*job, *ring_, /*failed=*/true);  // rows dirty again; rank 0 removes the directory
      std::lock_guard lock(mutex_);
      for (auto& [name, data] : job->attachments) attachments_.emplace(name, std::move(data));
    }
    throw;
  }

  std::lock_guard lock(mutex_);
  outcomes_.captured(job->capture_seconds);
  outcomes_.starting(version);
  job_ = std::move(job);
  changed_.notify_all();
  return version;
}

void Checkpointer::run_local(Job& job) noexcept {
  shard::LocalCheck local = shard::run_stage([&] {
    open_files(job);
    drain(job, *ring_);
    finish_rows(job);
    finalize_files(job);
  });
  if (local.status != EMBSTORE_OK) {
    ring_->abort();  // a training call waiting for staging lets go of its table
    // No write of this rank is still in flight when rank 0 removes the version's directory.
    for (TableJob& t : job.tables) t.writer.reset();
    try {
      local.message = fmt::format("{}: {}", job.what(), local.message);
    } catch (...) {
    }
  }
  std::lock_guard lock(mutex_);
  job.local_done = true;
  job.local_status = local.status;
  job.local_message = std::move(local.message);
  changed_.notify_all();
}

void Checkpointer::settle(bool block) {
  if (!sharded()) return;
  Job* job = nullptr;
  Progress mine;
  {
    std::unique_lock lock(mutex_);
    if (job_ == nullptr) return;  // the same on every rank: jobs start and end together
    if (block) changed_.wait(lock, [&] { return job_->local_done; });
    job = job_.get();
    mine.done = job->local_done;
    mine.status = job->local_status;
  }
  shard::Communicator& comm = *store_.comm();
  const uint32_t rank = store_.rank();
  embstore_status_t status = EMBSTORE_OK;
  std::string message;
  try {
    const std::vector<Progress> progress = all_gather(comm, mine);
    for (const Progress& p : progress) {
      if (!p.done) return;  // a rank is still writing: a later call settles
    }
    for (size_t q = 0; q < progress.size() && status == EMBSTORE_OK; ++q) {
      if (progress[q].status == EMBSTORE_OK) continue;
      status = static_cast<embstore_status_t>(progress[q].status);
      message = q == rank ? job->local_message
                          : fmt::format(
                                "{}: rank {} failed to write its files ({}); see that "
                                "rank's error",
                                job->what(), q, embstore_status_name(status));
    }
    if (status == EMBSTORE_OK) {
      // Every rank's part of the manifest to rank 0.
      const std::string text = io::format_manifest(job->part);
      const std::vector<uint64_t> sizes = all_gather(comm, uint64_t{text.size()});
      std::vector<size_t> send_bytes(sizes.size(), 0), recv_bytes(sizes.size(), 0);
      send_bytes[0] = text.size();
      size_t total = 0;
      if (rank == 0) {
        for (size_t q = 0; q < sizes.size(); ++q) total += recv_bytes[q] = sizes[q];
      }
      std::string all(total, '\0');
      comm.all_to_all(text.data(), send_bytes.data(), all.data(), recv_bytes.data());
      Outcome outcome;
      shard::LocalCheck committed;
      if (rank == 0) {
        committed = shard::run_stage([&] {
          std::vector<io::Manifest> parts(sizes.size());
          size_t at = 0;
          for (size_t q = 0; q < sizes.size(); ++q) {
            std::string why;
            if (io::parse_manifest(all.substr(at, sizes[q]), &parts[q], &why) < 0) {
              fail(EMBSTORE_INTERNAL, "rank {}'s part of the manifest does not parse: {}", q, why);
            }
            at += sizes[q];
          }
          commit_collective(*job, std::move(parts));
        });
        if (committed.status != EMBSTORE_OK) {
          committed.message = fmt::format("{}: {}", job->what(), committed.message);
        }
        outcome.status = committed.status;
        outcome.xxh3 = job->xxh3;
        std::snprintf(outcome.message, sizeof outcome.message, "%s", committed.message.c_str());
      }
      const std::vector<Outcome> outcomes = all_gather(comm, outcome);
      status = static_cast<embstore_status_t>(outcomes[0].status);
      message = rank == 0 ? committed.message : std::string(outcomes[0].message);
      job->xxh3 = outcomes[0].xxh3;
    }
  } catch (...) {  // the communicator failed, or memory: this rank's version fails
    const shard::LocalCheck why = shard::run_stage([] { throw; });
    status = why.status;
    message = job->what() + ": " + why.message;
  }
  {
    // The job ends below: its writer must be done with it. It is when every rank reported done;
    // after a failed exchange this rank's writer may still be at work (a settle that does not
    // block), and the job once ended under it.
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return job->local_done; });
  }
  const bool failed = status != EMBSTORE_OK;
  const std::string trouble = end(*job, *ring_, failed);
  if (!failed) {
    // A snapshot that failed to end on one rank fails the version's outcome on every rank (it
    // is committed all the same), so that the ranks' outcomes, and chains, stay alike.
    try {
      const shard::LocalCheck ended{trouble.empty() ? EMBSTORE_OK : EMBSTORE_INTERNAL,
                                    job->what() + ": " + trouble};
      shard::agree(comm, ended, "to end its snapshot");
    } catch (const Error& e) {
      status = e.status();
      message = e.what();
    }
  }
  if (status != EMBSTORE_OK) {
    std::lock_guard lock(mutex_);
    for (auto& [name, data] : job->attachments) attachments_.emplace(name, std::move(data));
  } else if (rank == 0) {
    after_commit(*job);
  }
  finish(*job, status, message);
}

void Checkpointer::commit_collective(Job& job, std::vector<io::Manifest> parts) {
  io::Manifest m = std::move(parts[0]);
  for (size_t q = 1; q < parts.size(); ++q) {
    io::Manifest& p = parts[q];
    if (p.tables.size() != m.tables.size()) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "rank {} has {} tables, rank 0 has {}: every rank must create the same tables", q,
           p.tables.size(), m.tables.size());
    }
    for (size_t i = 0; i < m.tables.size(); ++i) {
      io::TableEntry& t = m.tables[i];
      io::TableEntry& o = p.tables[i];
      check_same_table(t, o, q);
      t.files.insert(t.files.end(), o.files.begin(), o.files.end());
      t.serving.insert(t.serving.end(), o.serving.begin(), o.serving.end());
      t.admission.insert(t.admission.end(), o.admission.begin(), o.admission.end());
      t.rows += o.rows;
      t.table_rows += o.table_rows;
    }
    m.attachments.insert(m.attachments.end(), p.attachments.begin(), p.attachments.end());
  }
  std::string detail;
  if (int r = job.out->write_manifest(&m, &detail); r < 0) fail(EMBSTORE_IO_ERROR, "{}", detail);
  job.xxh3 = m.xxh3;
  check_parent(job);
  commit(job);
}

embstore_status_t Checkpointer::on_step_collective(uint64_t step, std::string* message) {
  std::lock_guard op(op_mutex_);
  settle(false);
  // Every rank takes part in the decision at every step, whatever its own policy and outcomes,
  // so that no rank waits in a collective that another one skipped. Rank 0's policy decides
  // (a schedule by seconds would differ across ranks); a failure that some rank has yet to
  // report defers it.
  struct Decision {
    int32_t due = -1;  // -1: none; 0: incremental; 1: full
    int32_t untold = 0;
  } mine;
  embstore_status_t failed = EMBSTORE_OK;
  std::optional<bool> due;
  std::string dir;
  {
    std::lock_guard lock(mutex_);
    mine.untold = outcomes_.take_untold(true, &failed, message) ? 1 : 0;
    const Policy& p = schedule_.policy();
    const bool scheduled =
        !p.dir.empty() && (p.full_every_steps != 0 || p.incremental_every_steps != 0 ||
                           p.full_every_seconds != 0 || p.incremental_every_seconds != 0);
    if (scheduled && !mine.untold) due = schedule_.take(step, job_ != nullptr);
    if (due) mine.due = *due ? 1 : 0;
    dir = p.dir;
  }
  const std::vector<Decision> all = all_gather(*store_.comm(), mine);
  bool anyone_untold = false;
  for (const Decision& d : all) anyone_untold = anyone_untold || d.untold != 0;
  const int32_t decided = anyone_untold ? -1 : all[0].due;
  if (due && decided != mine.due) {
    std::lock_guard lock(mutex_);
    schedule_.retry(*due);  // this rank's schedule did not get its way: due again later
  }
  if (mine.untold) return failed;
  if (decided < 0) return EMBSTORE_OK;
  try {
    start_collective(dir, decided == 1, true);
  } catch (...) {
    std::lock_guard lock(mutex_);
    if (due) schedule_.retry(*due);  // tried again at the next step
    throw;
  }
  return EMBSTORE_OK;
}

}  // namespace embstore::checkpoint
