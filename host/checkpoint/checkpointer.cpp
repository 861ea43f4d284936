#include "host/checkpoint/checkpointer.hpp"

#include <errno.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <unordered_set>

#include "cuda/row/snapshot.h"
#include "host/checkpoint/staging.hpp"
#include "host/error.hpp"
#include "host/store.hpp"
#include "io/chain.hpp"
#include "io/commit.hpp"
#include "io/engine.hpp"
#include "io/layout.hpp"
#include "io/manifest.hpp"
#include "io/row_file.hpp"

namespace embstore::checkpoint {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

using io::detail::errno_text;

// The format this version writes.
constexpr uint32_t kFormat = io::kManifestFormatVersion;
// Row file staging buffers of all tables together stay near this.
constexpr size_t kWriterBudget = size_t{64} << 20;

// Whether two spellings name the same directory ("ckpt", "ckpt/", "./ckpt").
bool same_dir(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  std::error_code ea, eb;
  const auto ca = std::filesystem::weakly_canonical(a, ea);
  const auto cb = std::filesystem::weakly_canonical(b, eb);
  if (ea || eb)
    return std::filesystem::path(a).lexically_normal() ==
           std::filesystem::path(b).lexically_normal();
  return ca == cb;
}

void log_line(const std::string& line) { std::fprintf(stderr, "embstore: %s\n", line.c_str()); }

}  // namespace

struct TableJob {
  embstore_table* handle = nullptr;
  Table* impl = nullptr;
  TableSpec spec;
  std::string file;  // relative to the version directory
  // Copy-on-write (training calls) and drain fill chunks apart: they may run at once.
  std::unique_ptr<StagingRing::Sink> sink, drain_sink;
  std::unique_ptr<io::RowFileWriter> writer;
  uint64_t captured = 0;
  uint64_t live_rows = 0;  // the table's rows at capture
  // Deltas: keys evicted since the parent; the writer drops those it meets as rows.
  std::unordered_set<int64_t> tombstones;
  uint64_t remaining = 0;
  bool drained = false;
  bool capture_done = false;
};

struct Job {
  uint64_t version = 0;
  bool full = true;
  std::optional<uint64_t> parent;  // deltas: the version they apply on
  io::VersionDir parent_dir;       // deltas: its directory in dir
  uint64_t parent_xxh3 = 0;        // deltas: its manifest's checksum
  uint64_t lineage = 0;
  uint64_t xxh3 = 0;     // this version's manifest checksum, once written
  bool renamed = false;  // the commit renamed the staging directory into place
  bool from_policy = false;
  bool started = false;
  std::string dir, staging, final_path;
  io::WriterOptions writer_options;
  uint64_t bytes = 0;  // written, once committed
  uint64_t rows = 0;
  // For embstore_checkpoint_info: when capture ended, what it and the wait before it took,
  // and the staging ring's counters at capture (this job's share is the difference).
  std::chrono::steady_clock::time_point captured_at;
  double capture_seconds = 0, wait_seconds = 0;
  StallStats ring_at_capture;
  std::vector<TableJob> tables;
  std::map<std::string, std::vector<char>> attachments;
};

Checkpointer::Checkpointer(embstore_store& store) : store_(store) {}

Checkpointer::~Checkpointer() {
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
  if (stall) {
    const double s = seconds_since(start);
    wait_stall_total_ += s;
    wait_stall_max_ = std::max(wait_stall_max_, s);
  }
}

uint64_t Checkpointer::checkpoint(const std::string& dir, bool full) {
  std::lock_guard op(op_mutex_);
  return start(dir, full, false);
}

uint64_t Checkpointer::start(const std::string& dir, bool full, bool from_policy) {
  const auto call_start = Clock::now();
  {
    std::unique_lock lock(mutex_);
    wait_for_job(lock, true);
  }
  const double wait_seconds = seconds_since(call_start);
  const uint64_t version = store_.step.load(std::memory_order_relaxed);
  if (int r = io::create_directories(dir); r < 0) {
    fail(EMBSTORE_IO_ERROR, "cannot create checkpoint directory '{}': {}", dir, errno_text(r));
  }
  lock_dir(dir);  // before anything in dir is looked at, removed or written
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
  // A delta holds the rows dirty since the last capture, so it can only follow the version
  // that capture committed, in this directory, unchanged there, older than this one (steps may
  // go backwards), and only while the chain is short enough. Anything else is taken as a full
  // checkpoint: a delta that restore could not apply is never written.
  std::optional<uint64_t> parent;
  io::VersionDir parent_dir;
  Chain chain;
  if (!full) {
    std::lock_guard lock(mutex_);
    chain = chain_;
    const bool rebaseline =
        (policy_.max_chain_length > 0 && chain_.deltas >= policy_.max_chain_length) ||
        (policy_.rebaseline_fraction > 0 &&
         static_cast<double>(chain_.delta_bytes) >
             policy_.rebaseline_fraction * static_cast<double>(chain_.full_bytes));
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
      parent = chain.version;
      parent_dir = *it;
    } else if (it != versions.end()) {
      log_line(
          fmt::format("version {} in '{}' is not the one this store committed ({}): the "
                      "incremental checkpoint {} is taken as a full one",
                      chain.version, dir, why.empty() ? "its manifest changed" : why, version));
    }
  }
  full = !parent.has_value();

  std::vector<std::string> removed;
  if (int r = io::remove_leftovers(dir, &removed); r < 0) {
    log_line(fmt::format("could not remove every leftover in '{}': {}", dir, errno_text(r)));
  }

  {
    // Before anything is captured: once a table is, only the worker can end its snapshot.
    std::lock_guard lock(mutex_);
    if (!worker_.joinable()) worker_ = std::thread([this] { worker_main(); });
  }
  auto job = std::make_unique<Job>();
  job->version = version;
  job->full = full;
  job->parent = parent;
  job->parent_dir = parent_dir;
  job->parent_xxh3 = full ? 0 : chain.xxh3;
  job->lineage = full ? io::new_lineage() : chain.lineage;
  job->from_policy = from_policy;
  job->wait_seconds = wait_seconds;
  job->dir = dir;
  job->final_path = dir + "/" + io::version_dir_name(version, full);
  if (int r = io::make_staging_dir(dir, version, &job->staging); r < 0) {
    fail(EMBSTORE_IO_ERROR, "cannot create a temporary directory in '{}': {}", dir, errno_text(r));
  }

  // Everything that can fail on the way comes before capture, so a failure changes nothing.
  try {
    const std::vector<embstore_table*> tables = store_.tables();
    uint64_t widest = 0;
    for (embstore_table* t : tables) {
      widest = std::max(widest, row::record_bytes(t->impl->spec().stride()));
    }
    if (!ring_ || ring_->chunk_bytes() < widest) {
      std::lock_guard lock(mutex_);  // stats() reads ring_
      if (ring_) {
        const StallStats r = ring_->stats();
        ring_stats_base_.seconds_total += r.seconds_total;
        ring_stats_base_.seconds_max = std::max(ring_stats_base_.seconds_max, r.seconds_max);
        ring_stats_base_.waits += r.waits;
        ring_stats_base_.copy_on_write_rows += r.copy_on_write_rows;
      }
      ring_.reset();
      ring_ = std::make_unique<StagingRing>(
          store_.staging_bytes, widest,
          store_.backend == EMBSTORE_BACKEND_CUDA ? store_.device : -1);
    }
    // The row files are opened by the worker (opening sets up io_uring and its buffers, which
    // would stall the training thread); rows captured meanwhile wait in staging.
    io::WriterOptions& options = job->writer_options;
    options.queue_depth = store_.io_queue_depth;
    size_t buffer = kWriterBudget / std::max<size_t>(1, tables.size() * options.queue_depth);
    buffer = std::clamp<size_t>(buffer, size_t{128} << 10, size_t{1} << 20);
    options.buffer_bytes = std::max<size_t>(buffer, io::kRowBlockHeaderBytes + widest);
    job->tables.resize(tables.size());
    for (size_t i = 0; i < tables.size(); ++i) {
      TableJob& t = job->tables[i];
      t.handle = tables[i];
      t.impl = tables[i]->impl.get();
      t.spec = t.impl->spec();
      t.file = io::row_file_path(kFormat, t.spec.name, 0, 1);
      for (auto* sink : {&t.sink, &t.drain_sink}) {
        *sink = std::make_unique<StagingRing::Sink>(*ring_, static_cast<uint32_t>(i),
                                                    row::record_bytes(t.spec.stride()));
      }
    }
    {
      std::lock_guard lock(mutex_);
      job->attachments = std::move(attachments_);
      attachments_.clear();
    }

    const auto capture_start = Clock::now();
    try {
      for (TableJob& t : job->tables) {
        t.captured = t.impl->capture(full, t.sink.get(), &t.live_rows);
        t.remaining = t.captured;
        t.capture_done = true;
      }
    } catch (...) {
      // A training call may wait for staging on a captured table, holding it: free it first.
      ring_->abort();
      for (TableJob& t : job->tables) {
        if (t.capture_done) t.impl->end_snapshot(true);
      }
      ring_->reset();
      std::lock_guard lock(mutex_);
      attachments_ = std::move(job->attachments);
      throw;
    }
    job->captured_at = Clock::now();
    job->capture_seconds = std::chrono::duration<double>(job->captured_at - capture_start).count();
    job->ring_at_capture = ring_->stats();
    std::lock_guard lock(mutex_);
    capture_seconds_last_ = job->capture_seconds;
  } catch (...) {
    io::remove_tree(job->staging);
    throw;
  }

  std::lock_guard lock(mutex_);
  job_ = std::move(job);
  outcomes_.erase(version);
  changed_.notify_all();
  return version;
}

void Checkpointer::worker_main() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || (job_ != nullptr && !job_->started); });
    if (job_ == nullptr || job_->started) return;  // stopping with nothing to do
    job_->started = true;
    Job& job = *job_;
    lock.unlock();
    try {
      run(job);
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
        ++failed_;
        job_.reset();
      }
      changed_.notify_all();
      continue;
    }
    lock.lock();
  }
}

namespace {

// Opens t's row file in job's staging directory, sized for the rows it captured.
void open_writer(const Job& job, TableJob& t) {
  const std::string table_dir = job.staging + "/" + io::table_dir(kFormat, t.spec.name);
  if (int r = io::create_directories(table_dir); r < 0) {
    fail(EMBSTORE_IO_ERROR, "cannot create '{}': {}", table_dir, errno_text(r));
  }
  const std::string path = job.staging + "/" + t.file;
  io::WriterOptions options = job.writer_options;
  const uint64_t row_bytes = 8 + 4 * uint64_t{t.spec.stride()};
  const uint64_t rows_per_block =
      std::max<uint64_t>(1, (options.buffer_bytes - io::kRowBlockHeaderBytes) / row_bytes);
  options.size_hint = t.captured * row_bytes + t.tombstones.size() * sizeof(int64_t) +
                      (t.captured / rows_per_block + 2) * (io::kRowBlockHeaderBytes + 4096);
  if (int r = io::RowFileWriter::open(path, t.spec.dim, t.spec.state_dim(), options, &t.writer);
      r < 0) {
    fail(EMBSTORE_IO_ERROR, "cannot open '{}': {}", path, errno_text(r));
  }
}

}  // namespace

void Checkpointer::run(Job& job) {
  embstore_status_t status = EMBSTORE_OK;
  std::string message;
  auto failed = [&](embstore_status_t s, std::string m) {
    if (status == EMBSTORE_OK) {
      status = s;
      message = std::move(m);
    }
  };
  const std::string what = fmt::format("checkpoint {} into '{}'", job.version, job.dir);
  try {
    for (TableJob& t : job.tables) {
      if (!job.full) {
        const std::vector<int64_t>& evicted = t.impl->evicted_at_capture();
        t.tombstones.insert(evicted.begin(), evicted.end());
      }
      open_writer(job, t);
    }
    // Two threads: this one drains captured rows into staging, a writer writes full chunks to
    // the row files and frees them. The writer never waits for a table, so a training call
    // that waits for staging room (holding its table) always gets it; and drain may block on a
    // table's lock without stopping the writes.
    std::mutex write_mutex;
    embstore_status_t write_status = EMBSTORE_OK;
    std::string write_message;
    std::atomic<bool> write_failed{false}, drained{false};
    auto write_chunks = [&] {
      for (;;) {
        StagingRing::Full chunk;
        if (!ring_->pop(&chunk)) {
          // Copy-on-write needs captured rows, so once all is drained nothing new arrives.
          if (drained.load()) {
            if (!ring_->pop(&chunk)) return;
          } else {
            ring_->wait_for_change(std::chrono::milliseconds(2));
            continue;
          }
        }
        if (!write_failed.load()) {
          TableJob& t = job.tables[chunk.table];
          const uint32_t dim = t.spec.dim;
          const uint64_t record = row::record_bytes(t.spec.stride());
          for (uint64_t k = 0; k < chunk.rows; ++k) {
            const char* rec = chunk.data + k * record;
            int64_t key;
            std::memcpy(&key, rec, sizeof(key));
            // Evicted, then inserted again before the capture: the row stands, no tombstone.
            if (!t.tombstones.empty()) t.tombstones.erase(key);
            const float* value = reinterpret_cast<const float*>(rec + 8);
            if (int r = t.writer->add(key, value, value + dim); r < 0) {
              std::lock_guard lock(write_mutex);
              write_status = EMBSTORE_IO_ERROR;
              write_message = fmt::format("{}: writing {}: {}", what, t.file, errno_text(r));
              write_failed.store(true);
              ring_->abort();  // training calls stop waiting for staging; drain stops
              break;
            }
          }
        }
        ring_->release(chunk.chunk);
      }
    };
    std::thread writer([&] {
      try {
        write_chunks();
      } catch (...) {
        {
          std::lock_guard lock(write_mutex);
          write_status = EMBSTORE_INTERNAL;
          write_message = what + ": the writer thread failed";
          write_failed.store(true);
        }
        ring_->abort();
        // Keep freeing what is queued until the drain loop has stopped.
        StagingRing::Full chunk;
        for (;;) {
          const bool done = drained.load();
          while (ring_->pop(&chunk)) ring_->release(chunk.chunk);
          if (done) return;
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
      }
    });
    try {
      size_t next = 0;
      while (!write_failed.load()) {
        bool all_drained = true, progress = false;
        for (size_t k = 0; k < job.tables.size(); ++k) {
          TableJob& t = job.tables[(next + k) % job.tables.size()];
          if (t.drained) continue;
          all_drained = false;
          const uint64_t before = t.remaining;
          const uint64_t rows =
              std::max<uint64_t>(1, ring_->chunk_bytes() / row::record_bytes(t.spec.stride()));
          t.remaining = t.impl->drain(t.drain_sink.get(), rows);
          t.drained = t.remaining == 0;
          progress = t.drained || t.remaining < before;
          next = (next + k + 1) % job.tables.size();
          break;
        }
        if (all_drained) break;
        if (!progress) {
          // Staging is full, or training holds the table: let either move on.
          ring_->wait_for_free(std::chrono::milliseconds(2));
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
    } catch (...) {
      ring_->abort();
      drained.store(true);
      writer.join();
      throw;
    }
    drained.store(true);
    writer.join();
    if (write_failed.load()) failed(write_status, write_message);

    // The tombstones after the rows, then make the row files durable and check that every
    // captured row was written once.
    for (TableJob& t : job.tables) {
      if (status != EMBSTORE_OK) break;
      std::vector<int64_t> tombstones(t.tombstones.begin(), t.tombstones.end());
      std::sort(tombstones.begin(), tombstones.end());  // the same file for the same state
      int r = 0;
      for (size_t k = 0; k < tombstones.size() && r == 0; ++k) {
        r = t.writer->add_tombstone(tombstones[k]);
      }
      if (r == 0) r = t.writer->finish();
      const uint64_t expected = t.captured + t.tombstones.size();
      if (r < 0) {
        failed(EMBSTORE_IO_ERROR, fmt::format("{}: writing {}: {}", what, t.file, errno_text(r)));
      } else if (t.writer->rows() != expected) {
        failed(EMBSTORE_INTERNAL,
               fmt::format("{}: table '{}' captured {} rows and {} tombstones but wrote {}", what,
                           t.spec.name, t.captured, t.tombstones.size(), t.writer->rows()));
      }
    }

    io::Manifest m;
    m.full = job.full;
    m.parent = job.parent;
    if (!job.full) m.parent_xxh3 = job.parent_xxh3;
    m.lineage = job.lineage;
    m.version = job.version;
    m.world_size = 1;
    m.embstore_version = EMBSTORE_VERSION_CODE;
    uint64_t rows_total = 0, bytes_total = 0;
    if (status == EMBSTORE_OK) {
      for (TableJob& t : job.tables) {
        io::TableEntry e;
        e.name = t.spec.name;
        e.config = to_config(t.spec);
        e.config.name = nullptr;
        e.state_dim = t.spec.state_dim();
        e.state_layout = io::state_layout(static_cast<int>(t.spec.opt.kind));
        e.rows = t.writer->rows();
        e.table_rows = t.live_rows;
        e.files.push_back({t.file, t.writer->bytes(), t.writer->rows(), t.writer->checksum()});
        rows_total += e.rows;
        bytes_total += t.writer->bytes();
        if (const std::optional<io::AdmissionFile> at_capture = t.impl->admission_at_capture()) {
          const std::vector<char> counts = io::format_admission_file(*at_capture);
          const std::string rel = io::admission_file_path(kFormat, t.spec.name);
          if (int r = io::write_whole_file(job.staging + "/" + rel, counts.data(), counts.size());
              r < 0) {
            failed(EMBSTORE_IO_ERROR, fmt::format("{}: writing {}: {}", what, rel, errno_text(r)));
          }
          e.admission =
              io::FileEntry{rel, counts.size(), 0, XXH3_64bits(counts.data(), counts.size())};
          bytes_total += counts.size();
        }
        m.tables.push_back(std::move(e));
      }
      if (!job.attachments.empty()) {
        const std::string adir = job.staging + "/" + io::kAttachmentsDir;
        if (int r = io::create_directories(adir); r < 0) {
          failed(EMBSTORE_IO_ERROR, fmt::format("{}: {}: {}", what, adir, errno_text(r)));
        }
        for (const auto& [name, data] : job.attachments) {
          if (status != EMBSTORE_OK) break;
          const std::string rel = io::attachment_path(name);
          if (int r = io::write_whole_file(job.staging + "/" + rel, data.data(), data.size());
              r < 0) {
            failed(EMBSTORE_IO_ERROR, fmt::format("{}: writing {}: {}", what, rel, errno_text(r)));
          }
          m.attachments.push_back(
              {name, {rel, data.size(), 0, XXH3_64bits(data.data(), data.size())}});
          bytes_total += data.size();
        }
      }
    }
    if (status == EMBSTORE_OK) {
      if (int r = io::write_manifest(job.staging, m, &job.xxh3); r < 0) {
        failed(EMBSTORE_IO_ERROR,
               fmt::format("{}: writing {}: {}", what, io::kManifestName, errno_text(r)));
      }
      m.xxh3 = job.xxh3;
    }
    // A delta commits only while its parent is still in place and is the version it names, as
    // restore will check: "committed" means "restorable".
    if (status == EMBSTORE_OK && !job.full) {
      io::Manifest parent;
      std::string why;
      int r = io::read_version_manifest(job.dir, job.parent_dir, &parent, &why);
      if (r == 0) r = io::check_link(m, parent, &why);
      if (r < 0) {
        failed(EMBSTORE_IO_ERROR,
               fmt::format(
                   "{}: its parent {} {}: the delta would not restore", what, job.parent_dir.name,
                   r == -ENOENT ? std::string("is gone") : (why.empty() ? errno_text(r) : why)));
      }
    }
    if (status == EMBSTORE_OK) {
      if (int r = io::commit_staging_dir(job.staging, job.final_path, &job.renamed); r < 0) {
        failed(EMBSTORE_IO_ERROR, fmt::format("{}: commit: {}", what, errno_text(r)));
      }
    }
    if (status == EMBSTORE_OK) {
      std::lock_guard lock(mutex_);  // info() reads the job
      job.bytes = bytes_total;
      job.rows = rows_total;
      rows_written_ += rows_total;
      bytes_written_ += bytes_total;
    }
  } catch (const Error& e) {
    failed(e.status(), fmt::format("{}: {}", what, e.what()));
  } catch (const std::bad_alloc&) {
    failed(EMBSTORE_OUT_OF_MEMORY, what + ": host memory allocation failed");
  } catch (const std::exception& e) {
    failed(EMBSTORE_INTERNAL, fmt::format("{}: {}", what, e.what()));
  } catch (...) {
    failed(EMBSTORE_INTERNAL, what + ": unknown exception");
  }

  // End the snapshot on every table. After a failure the ring is aborted first, so that a
  // training call waiting for staging (under its table's lock) lets go of the table.
  const bool ok = status == EMBSTORE_OK;
  if (!ok) ring_->abort();
  for (TableJob& t : job.tables) {
    try {
      t.impl->end_snapshot(!ok);
    } catch (const std::exception& e) {
      failed(EMBSTORE_INTERNAL,
             fmt::format("{}: ending the snapshot of '{}': {}", what, t.spec.name, e.what()));
    }
    t.writer.reset();  // without finish(): waits for writes in flight, no fsync
  }
  ring_->reset();
  if (!ok) {
    io::remove_tree(job.staging);
    // A commit whose last fsync failed has renamed the version into place: take it back out,
    // so that a failed checkpoint never exists for readers. Only what this job renamed: a
    // version that was there before is never touched.
    if (job.renamed) retire(job.dir, job.final_path);
    // The attachments go with the next checkpoint instead, unless attached again since.
    std::lock_guard lock(mutex_);
    for (auto& [name, data] : job.attachments) attachments_.emplace(name, std::move(data));
  } else {
    apply_retention(job);
  }
  finish(job, status, message);
}

void Checkpointer::retire(const std::string& dir, const std::string& path) {
  // Renamed out of sight first (the next checkpoint removes what is left of a crash), so a
  // crash half-way never leaves a damaged version for readers.
  const std::string name = std::filesystem::path(path).filename().string();
  const std::string hidden = dir + "/.tmp-retired-" + name;
  if (std::rename(path.c_str(), hidden.c_str()) != 0 || io::remove_tree(hidden) < 0) {
    log_line(fmt::format("could not delete '{}'", path));
  }
}

void Checkpointer::apply_retention(const Job& job) {
  uint32_t keep = 0;
  {
    std::lock_guard lock(mutex_);
    if (!same_dir(policy_.dir, job.dir)) return;
    keep = policy_.keep_full;
  }
  if (keep == 0) return;
  std::vector<io::VersionDir> versions;
  if (io::list_versions(job.dir, &versions) < 0) return;
  // Only versions up to the one just written count: after a restore of an older version,
  // newer ones belong to an abandoned run and are neither counted nor deleted here. Only
  // committed checkpoints (a valid manifest) count towards keep_full.
  std::vector<uint64_t> fulls;
  for (const io::VersionDir& v : versions) {
    io::Manifest m;
    if (v.full && v.version <= job.version &&
        io::read_manifest(job.dir + "/" + v.name, &m, nullptr) == 0) {
      fulls.push_back(v.version);
    }
  }
  if (fulls.size() <= keep) return;
  const uint64_t oldest_kept = fulls[fulls.size() - keep];
  // Newest first: a delta goes before the versions it applies on, so that a crash half-way
  // leaves the older part of a chain, never a delta without its parent (the crash campaign
  // found that).
  for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
    if (v->version < oldest_kept) retire(job.dir, job.dir + "/" + v->name);
  }
}

void Checkpointer::finish(Job& job, embstore_status_t status, const std::string& message) {
  if (status != EMBSTORE_OK) log_line(message);
  std::lock_guard lock(mutex_);
  if (outcomes_.size() >= kMaxOutcomes) outcomes_.erase(outcomes_.begin());
  Outcome& o = outcomes_[job.version];
  o.status = status;
  o.message = message;
  o.from_policy = job.from_policy;
  o.reported = false;
  o.info = info_of(job);
  o.info.status = status;
  o.info.in_flight = 0;
  if (status == EMBSTORE_OK) {
    ++committed_;
    if (!job.full) ++deltas_committed_;
    last_version_ = job.version;
    const uint64_t bytes = job.bytes;
    if (job.full) {
      chain_ = Chain{true, job.dir, job.version, true, job.lineage, job.xxh3, bytes, 0, 0};
    } else {
      chain_.version = job.version;
      chain_.full = false;
      chain_.xxh3 = job.xxh3;
      chain_.delta_bytes += bytes;
      ++chain_.deltas;
    }
  } else {
    ++failed_;
  }
  job_.reset();
  changed_.notify_all();
}

embstore_checkpoint_info_t Checkpointer::info_of(const Job& job) const {
  embstore_checkpoint_info_t info{};
  info.struct_size = sizeof(info);
  info.status = EMBSTORE_OK;
  info.in_flight = 1;
  info.kind = job.full ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
  info.version = job.version;
  info.parent = job.parent.value_or(EMBSTORE_LATEST);
  info.from_policy = job.from_policy ? 1 : 0;
  for (const TableJob& t : job.tables) info.rows_captured += t.captured;
  info.rows_written = job.rows;
  info.bytes_written = job.bytes;
  info.capture_seconds = job.capture_seconds;
  info.write_seconds = seconds_since(job.captured_at);
  const StallStats now = ring_ ? ring_->stats() : job.ring_at_capture;
  info.stall_seconds = job.wait_seconds + (now.seconds_total - job.ring_at_capture.seconds_total);
  info.copy_on_write_rows = now.copy_on_write_rows - job.ring_at_capture.copy_on_write_rows;
  return info;
}

bool Checkpointer::info(uint64_t version, embstore_checkpoint_info_t* out) const {
  std::lock_guard lock(mutex_);
  if (job_ != nullptr && job_->version == version) {
    *out = info_of(*job_);
    return true;
  }
  auto it = outcomes_.find(version);
  if (it == outcomes_.end()) return false;
  *out = it->second.info;
  return true;
}

embstore_status_t Checkpointer::wait(uint64_t version, std::string* message) {
  std::unique_lock lock(mutex_);
  if (job_ != nullptr && job_->version == version) wait_for_job(lock, false);
  auto it = outcomes_.find(version);
  if (it == outcomes_.end()) {
    *message = fmt::format("this store took no checkpoint of version {}", version);
    return EMBSTORE_NOT_FOUND;
  }
  it->second.reported = true;
  *message = it->second.message;
  return it->second.status;
}

embstore_status_t Checkpointer::wait_idle(std::string* message) {
  std::unique_lock lock(mutex_);
  wait_for_job(lock, false);
  for (auto& [version, o] : outcomes_) {
    if (o.status != EMBSTORE_OK && !o.reported) {
      o.reported = true;
      *message = o.message;
      return o.status;
    }
  }
  return EMBSTORE_OK;
}

void Checkpointer::attach(const std::string& name, const void* data, size_t bytes) {
  std::vector<char> copy(static_cast<const char*>(data), static_cast<const char*>(data) + bytes);
  std::lock_guard lock(mutex_);
  attachments_[name] = std::move(copy);
}

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

void Checkpointer::set_policy(Policy policy) {
  if (!policy.dir.empty()) {
    if (int r = io::create_directories(policy.dir); r < 0) {
      fail(EMBSTORE_IO_ERROR, "cannot create checkpoint directory '{}': {}", policy.dir,
           errno_text(r));
    }
    lock_dir(policy.dir);
  }
  std::lock_guard lock(mutex_);
  policy_ = std::move(policy);
  policy_full_step_ = policy_incr_step_ = store_.step.load(std::memory_order_relaxed);
  policy_full_time_ = policy_incr_time_ = Clock::now();
  policy_full_due_ = policy_incr_due_ = false;
}

embstore_status_t Checkpointer::on_step(uint64_t step, std::string* message) {
  std::unique_lock op(op_mutex_, std::try_to_lock);
  if (!op.owns_lock()) return EMBSTORE_OK;  // a checkpoint() or restore() runs: later
  std::string dir;
  bool full = true;
  {
    std::lock_guard lock(mutex_);
    for (auto& [version, o] : outcomes_) {
      if (o.from_policy && o.status != EMBSTORE_OK && !o.reported) {
        o.reported = true;
        *message = o.message;
        return o.status;
      }
    }
    if (policy_.dir.empty()) return EMBSTORE_OK;
    auto crossed = [&](uint64_t every, uint64_t mark) {
      return every > 0 && step / every > mark / every;
    };
    auto elapsed = [&](double every, Clock::time_point mark) {
      return every > 0 && seconds_since(mark) >= every;
    };
    const bool due_full = policy_full_due_ ||
                          crossed(policy_.full_every_steps, policy_full_step_) ||
                          elapsed(policy_.full_every_seconds, policy_full_time_);
    const bool due_incr = policy_incr_due_ ||
                          crossed(policy_.incremental_every_steps, policy_incr_step_) ||
                          elapsed(policy_.incremental_every_seconds, policy_incr_time_);
    if (!due_full && !due_incr) return EMBSTORE_OK;
    if (job_ != nullptr) {
      // Deferred, never skipped: the rows stay dirty and go with a later one.
      policy_full_due_ = due_full;
      policy_incr_due_ = due_incr;
      ++deferred_;
      return EMBSTORE_OK;
    }
    full = due_full;
    policy_full_due_ = policy_incr_due_ = false;
    // A full checkpoint also holds every change an incremental one would.
    policy_incr_step_ = step;
    policy_incr_time_ = Clock::now();
    if (full) {
      policy_full_step_ = step;
      policy_full_time_ = Clock::now();
    }
    dir = policy_.dir;
  }
  try {
    start(dir, full, true);
  } catch (...) {
    std::lock_guard lock(mutex_);
    (full ? policy_full_due_ : policy_incr_due_) = true;  // tried again at the next step
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
  embstore_checkpoint_stats_t s{};
  s.struct_size = sizeof(s);
  std::lock_guard lock(mutex_);
  s.committed = committed_;
  s.failed = failed_;
  s.last_version = last_version_;
  s.in_flight = job_ != nullptr ? 1 : 0;
  s.rows_written = rows_written_;
  s.bytes_written = bytes_written_;
  s.stall_seconds_total = wait_stall_total_;
  s.stall_seconds_max = wait_stall_max_;
  StallStats r = ring_stats_base_;
  if (ring_) {
    const StallStats now = ring_->stats();
    r.copy_on_write_rows += now.copy_on_write_rows;
    r.seconds_total += now.seconds_total;
    r.seconds_max = std::max(r.seconds_max, now.seconds_max);
  }
  s.copy_on_write_rows = r.copy_on_write_rows;
  s.stall_seconds_total += r.seconds_total;
  s.stall_seconds_max = std::max(s.stall_seconds_max, r.seconds_max);
  s.capture_seconds_last = capture_seconds_last_;
  s.deltas_committed = deltas_committed_;
  s.deferred = deferred_;
  return s;
}

}  // namespace embstore::checkpoint
