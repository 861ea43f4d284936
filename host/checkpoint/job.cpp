#include "host/checkpoint/job.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>

#include "cuda/row/snapshot.h"
#include "host/error.hpp"
#include "io/engine/engine.hpp"
#include "io/format/chain.hpp"
#include "io/format/manifest.hpp"

namespace embstore::checkpoint {

namespace {

using io::detail::errno_text;

// Row file staging buffers of all tables together stay near this.
constexpr size_t kWriterBudget = size_t{64} << 20;

}  // namespace

std::string Job::what() const { return fmt::format("checkpoint {} into '{}'", version, dir); }

void prepare(Job& job, const std::vector<Table*>& tables, StagingRing& ring, unsigned queue_depth) {
  std::string detail;
  if (!job.out) {
    if (int r = io::VersionWriter::begin(job.dir, job.version, job.full, &job.out, &detail);
        r < 0) {
      fail(EMBSTORE_IO_ERROR, "{}", detail);
    }
  }
  uint64_t widest = 0;
  for (Table* t : tables) widest = std::max(widest, row::record_bytes(t->spec().stride()));
  // The row files are opened by the worker (opening sets up io_uring and its buffers, which
  // would stall the training thread); rows captured meanwhile wait in staging.
  io::WriterOptions& options = job.writer_options;
  options.queue_depth = queue_depth;
  size_t buffer = kWriterBudget / std::max<size_t>(1, tables.size() * options.queue_depth);
  buffer = std::clamp<size_t>(buffer, size_t{128} << 10, size_t{1} << 20);
  options.buffer_bytes = std::max<size_t>(buffer, io::kRowBlockHeaderBytes + widest);
  job.tables.resize(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    TableJob& t = job.tables[i];
    t.impl = tables[i];
    t.spec = t.impl->spec();
    for (auto* sink : {&t.sink, &t.drain_sink}) {
      *sink = std::make_unique<StagingRing::Sink>(ring, static_cast<uint32_t>(i),
                                                  row::record_bytes(t.spec.stride()));
    }
  }
}

void capture(Job& job, StagingRing& ring) {
  const auto start = std::chrono::steady_clock::now();
  try {
    for (TableJob& t : job.tables) {
      t.captured = t.impl->capture(job.full, t.sink.get(), &t.live_rows);
      t.remaining = t.captured;
      t.capture_done = true;
    }
  } catch (...) {
    // A training call may wait for staging on a captured table, holding it: free it first.
    ring.abort();
    for (TableJob& t : job.tables) {
      if (t.capture_done) t.impl->end_snapshot(true);
    }
    ring.reset();
    throw;
  }
  job.captured_at = std::chrono::steady_clock::now();
  job.capture_seconds = std::chrono::duration<double>(job.captured_at - start).count();
  job.ring_at_capture = ring.stats();
}

void open_files(Job& job) {
  for (TableJob& t : job.tables) {
    if (!job.full) {
      const std::vector<int64_t>& evicted = t.impl->evicted_at_capture();
      t.tombstones.insert(evicted.begin(), evicted.end());
    }
    std::string detail;
    const io::RowCodecs codecs{t.spec.value_codec, t.spec.state_codec};
    if (int r =
            job.out->open_rows(t.spec.name, t.spec.dim, t.spec.state_dim(), t.captured,
                               t.tombstones.size(), job.writer_options, &t.writer, &detail, codecs);
        r < 0) {
      fail(EMBSTORE_IO_ERROR, "{}", detail);
    }
    if (!job.serving) continue;
    if (int r = job.out->open_serving_rows(t.spec.name, t.spec.dim, t.captured, t.tombstones.size(),
                                           job.writer_options, &t.serving, &detail,
                                           t.spec.serving_codec);
        r < 0) {
      fail(EMBSTORE_IO_ERROR, "{}", detail);
    }
  }
}

namespace {

// The writer thread of drain(): writes full chunks to the row files and frees them. It never
// waits for a table, so a training call that waits for staging room (holding its table) always
// gets it.
class ChunkWriter {
 public:
  ChunkWriter(Job& job, StagingRing& ring) : job_(job), ring_(ring) {
    thread_ = std::thread([this] { run(); });
  }
  // Tells the writer that nothing new will arrive, and waits for it.
  void finish() {
    drained_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  ~ChunkWriter() { finish(); }
  bool failed() const { return failed_.load(); }
  // After finish(): why it failed.
  Error error() const { return Error(status_, message_); }

 private:
  void run() {
    try {
      write_chunks();
    } catch (...) {
      fail_with(EMBSTORE_INTERNAL, "the writer thread failed");
      // Keep freeing what is queued until the drain loop has stopped.
      StagingRing::Full chunk;
      for (;;) {
        const bool done = drained_.load();
        while (ring_.pop(&chunk)) ring_.release(chunk.chunk);
        if (done) return;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
  }

  void write_chunks() {
    for (;;) {
      StagingRing::Full chunk;
      if (!ring_.pop(&chunk)) {
        // Copy-on-write needs captured rows, so once all is drained nothing new arrives.
        if (drained_.load()) {
          if (!ring_.pop(&chunk)) return;
        } else {
          ring_.wait_for_change(std::chrono::milliseconds(2));
          continue;
        }
      }
      if (!failed_.load()) write(job_.tables[chunk.table], chunk);
      ring_.release(chunk.chunk);
    }
  }

  void write(TableJob& t, const StagingRing::Full& chunk) {
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
        fail_with(EMBSTORE_IO_ERROR,
                  fmt::format("writing {}: {}", job_.out->rows_entry(t.spec.name, *t.writer).path,
                              errno_text(r)));
        return;
      }
      if (t.serving) {
        if (int r = t.serving->add(key, value, nullptr); r < 0) {
          fail_with(
              EMBSTORE_IO_ERROR,
              fmt::format("writing {}: {}", job_.out->serving_entry(t.spec.name, *t.serving).path,
                          errno_text(r)));
          return;
        }
      }
    }
  }

  void fail_with(embstore_status_t status, std::string message) {
    {
      std::lock_guard lock(mutex_);
      if (!failed_.load()) {
        status_ = status;
        message_ = std::move(message);
      }
      failed_.store(true);
    }
    ring_.abort();  // training calls stop waiting for staging; drain stops
  }

  Job& job_;
  StagingRing& ring_;
  std::mutex mutex_;
  embstore_status_t status_ = EMBSTORE_OK;
  std::string message_;
  std::atomic<bool> failed_{false}, drained_{false};
  std::thread thread_;
};

}  // namespace

void drain(Job& job, StagingRing& ring) {
  ChunkWriter writer(job, ring);
  try {
    // Round robin over the tables, a chunk's worth each; drain may block on a table's lock
    // without stopping the writes.
    size_t next = 0;
    while (!writer.failed()) {
      bool all_drained = true, progress = false;
      for (size_t k = 0; k < job.tables.size(); ++k) {
        TableJob& t = job.tables[(next + k) % job.tables.size()];
        if (t.drained) continue;
        all_drained = false;
        const uint64_t before = t.remaining;
        const uint64_t rows =
            std::max<uint64_t>(1, ring.chunk_bytes() / row::record_bytes(t.spec.stride()));
        t.remaining = t.impl->drain(t.drain_sink.get(), rows);
        t.drained = t.remaining == 0;
        progress = t.drained || t.remaining < before;
        next = (next + k + 1) % job.tables.size();
        break;
      }
      if (all_drained) break;
      if (!progress) {
        // Staging is full, or training holds the table: let either move on.
        ring.wait_for_free(std::chrono::milliseconds(2));
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      }
    }
  } catch (...) {
    ring.abort();
    writer.finish();
    throw;
  }
  writer.finish();
  if (writer.failed()) throw writer.error();
}

void finish_rows(Job& job) {
  for (TableJob& t : job.tables) {
    std::vector<int64_t> tombstones(t.tombstones.begin(), t.tombstones.end());
    std::sort(tombstones.begin(), tombstones.end());  // the same file for the same state
    const uint64_t expected = t.captured + t.tombstones.size();
    for (io::RowFileWriter* w : {t.writer.get(), t.serving.get()}) {
      if (w == nullptr) continue;
      const std::string path = w == t.serving.get() ? job.out->serving_entry(t.spec.name, *w).path
                                                    : job.out->rows_entry(t.spec.name, *w).path;
      int r = 0;
      for (size_t k = 0; k < tombstones.size() && r == 0; ++k) r = w->add_tombstone(tombstones[k]);
      if (r == 0) r = w->finish();
      if (r < 0) fail(EMBSTORE_IO_ERROR, "writing {}: {}", path, errno_text(r));
      if (w->rows() != expected) {
        fail(EMBSTORE_INTERNAL, "table '{}' captured {} rows and {} tombstones but wrote {} to {}",
             t.spec.name, t.captured, t.tombstones.size(), w->rows(), path);
      }
    }
  }
}

void finalize_files(Job& job) {
  io::Manifest& m = job.part;
  m = io::Manifest{};
  m.full = job.full;
  m.parent = job.parent;
  if (!job.full) m.parent_xxh3 = job.parent_xxh3;
  m.lineage = job.lineage;
  m.version = job.version;
  m.world_size = job.world_size;
  m.embstore_version = EMBSTORE_VERSION_CODE;
  uint64_t rows = 0, bytes = 0, serving_bytes = 0;
  std::string detail;
  for (TableJob& t : job.tables) {
    io::TableEntry e;
    e.name = t.spec.name;
    e.config = to_config(t.spec);
    e.config.name = nullptr;
    e.state_dim = t.spec.state_dim();
    e.state_layout = io::state_layout(static_cast<int>(t.spec.opt.kind));
    e.rows = t.writer->rows();
    e.table_rows = t.live_rows;
    e.files.push_back(job.out->rows_entry(t.spec.name, *t.writer));
    rows += e.rows;
    bytes += e.files.back().bytes;
    if (t.serving) {
      e.serving.push_back(job.out->serving_entry(t.spec.name, *t.serving));
      serving_bytes += e.serving.back().bytes;
    }
    if (const std::optional<io::AdmissionFile> counts = t.impl->admission_at_capture()) {
      e.admission.emplace_back();
      if (int r = job.out->write_admission(t.spec.name, *counts, &e.admission.back(), &detail);
          r < 0) {
        fail(EMBSTORE_IO_ERROR, "{}", detail);
      }
      bytes += e.admission.back().bytes;
    }
    m.tables.push_back(std::move(e));
  }
  for (const auto& [name, data] : job.attachments) {
    io::AttachmentEntry a{name, {}, job.rank};
    if (int r = job.out->write_attachment(name, data.data(), data.size(), &a.file, &detail);
        r < 0) {
      fail(EMBSTORE_IO_ERROR, "{}", detail);
    }
    bytes += a.file.bytes;
    m.attachments.push_back(std::move(a));
  }
  job.rows = rows;
  job.bytes = bytes + serving_bytes;
  job.serving_bytes = serving_bytes;
}

void finalize(Job& job) {
  finalize_files(job);
  std::string detail;
  if (int r = job.out->write_manifest(&job.part, &detail); r < 0) {
    fail(EMBSTORE_IO_ERROR, "{}", detail);
  }
  job.xxh3 = job.part.xxh3;
}

void check_parent(const Job& job) {
  if (job.full) return;
  // What restore will check: "committed" means "restorable".
  io::Manifest m, parent;
  std::string why;
  int r = io::read_version_manifest(job.dir, job.parent_dir, &parent, &why);
  if (r == 0) {
    m.version = job.version;
    m.full = false;
    m.parent = job.parent;
    m.parent_xxh3 = job.parent_xxh3;
    m.lineage = job.lineage;
    r = io::check_link(m, parent, &why);
  }
  if (r < 0) {
    fail(EMBSTORE_IO_ERROR, "its parent {} {}: the delta would not restore", job.parent_dir.name,
         r == -ENOENT ? std::string("is gone") : (why.empty() ? errno_text(r) : why));
  }
}

void commit(Job& job) {
  std::string detail;
  if (int r = job.out->commit(&detail); r < 0) fail(EMBSTORE_IO_ERROR, "{}", detail);
}

std::string end(Job& job, StagingRing& ring, bool failed) {
  if (failed) ring.abort();
  std::string trouble;
  for (TableJob& t : job.tables) {
    try {
      t.impl->end_snapshot(failed);
    } catch (const std::exception& e) {
      if (trouble.empty()) {
        trouble = fmt::format("ending the snapshot of '{}': {}", t.spec.name, e.what());
      }
    }
    t.writer.reset();  // without finish(): waits for writes in flight, no fsync
    t.serving.reset();
  }
  ring.reset();
  if ((failed || !trouble.empty()) && job.out) job.out->roll_back();
  return trouble;
}

}  // namespace embstore::checkpoint
