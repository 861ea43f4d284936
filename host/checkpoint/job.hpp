// One checkpoint, from capture to commit or rollback, as named stages that each read alone.
// The checkpointer (checkpointer.cpp) plans the job (version, kind, parent: it keeps the
// chain), runs prepare and capture on the calling thread, and the rest on its worker, in this
// order:
//
//   prepare       staging sinks, writer options, the version directory (calling thread:
//                 everything that can fail before anything is captured)
//   capture       every table's rows, without a copy (calling thread)
//   open_files    each table's tombstones and row file (worker: opening sets up io_uring),
//                 and the values-only file (serving_deltas, serving_dir)
//   drain         captured rows through the staging ring into the row files: this thread
//                 drains, a writer thread writes
//   finish_rows   tombstones written, files durable, every captured row written once (in
//                 the values-only file too)
//   finalize      admission counts, attachments (finalize_files), the manifest
//   check_parent  a delta's parent is still in place and is the version it names
//   commit        the rename that makes the version visible
//   end           every table's snapshot ended; a failed version rolled back
//
// Every stage but end throws Error with the status the checkpoint fails with (end never
// throws: it reports what failed in its return value).
//
// A collective checkpoint of a sharded store (collective.cpp) runs the same stages on every
// rank, each rank's files in rank 0's staging directory, up to finalize_files; rank 0 then
// writes the manifest of every rank's files, checks the parent and commits, and every rank ends.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "host/checkpoint/staging.hpp"
#include "host/table/table.hpp"
#include "io/format/commit.hpp"
#include "io/format/row_file.hpp"
#include "io/format/version_writer.hpp"

namespace embstore::checkpoint {

struct TableJob {
  Table* impl = nullptr;
  TableSpec spec;
  // Copy-on-write (training calls) and drain fill chunks apart: they may run at once.
  std::unique_ptr<StagingRing::Sink> sink, drain_sink;
  std::unique_ptr<io::RowFileWriter> writer;
  // With Job::serving: the values-only copy of the row file.
  std::unique_ptr<io::RowFileWriter> serving;
  uint64_t captured = 0;
  uint64_t live_rows = 0;  // the table's rows at capture
  // Deltas: keys evicted since the parent; the writer drops those it meets as rows.
  std::unordered_set<int64_t> tombstones;
  uint64_t remaining = 0;
  bool drained = false;
  bool capture_done = false;
};

struct Job {
  // The plan.
  uint64_t version = 0;
  bool full = true;
  std::optional<uint64_t> parent;  // deltas: the version they apply on
  io::VersionDir parent_dir;       // deltas: its directory in dir
  uint64_t parent_xxh3 = 0;        // deltas: its manifest's checksum
  uint64_t lineage = 0;
  bool from_policy = false;
  // Each table's rows also go to a values-only file in its serving codec: deltas with
  // serving_deltas, and every version of the policy's dir with a serving_dir (publish.hpp).
  bool serving = false;
  std::string dir;
  uint32_t rank = 0, world_size = 1;  // a collective checkpoint's, else 0 and 1
  std::map<std::string, std::vector<char>> attachments;

  // Where it stands.
  bool started = false;  // the worker has it
  std::unique_ptr<io::VersionWriter> out;
  io::WriterOptions writer_options;
  std::vector<TableJob> tables;
  // This rank's part of the manifest (its files, its attachments), once its files are
  // written: the whole manifest for a checkpoint of one process.
  io::Manifest part;
  // Collective checkpoints: the worker is done with this rank's stages (local_status says how).
  bool local_done = false;
  embstore_status_t local_status = EMBSTORE_OK;
  std::string local_message;
  uint64_t xxh3 = 0;           // this version's manifest checksum, once finalized
  uint64_t bytes = 0;          // in its files, once finalized (the worker's until the job ends)
  uint64_t serving_bytes = 0;  // of them, in values-only files (no restore reads them)
  uint64_t rows = 0;

  // For embstore_checkpoint_info: when capture ended, what it and the wait before it took,
  // and the staging ring's counters at capture (this job's share is the difference).
  std::chrono::steady_clock::time_point captured_at;
  double capture_seconds = 0, wait_seconds = 0;
  StallStats ring_at_capture;

  // "checkpoint 1000 into '/ckpt'": the start of its messages.
  std::string what() const;
};

// Begins the version directory unless job.out is set already (a collective checkpoint's).
void prepare(Job& job, const std::vector<Table*>& tables, StagingRing& ring, unsigned queue_depth);
void capture(Job& job, StagingRing& ring);
void open_files(Job& job);
void drain(Job& job, StagingRing& ring);
void finish_rows(Job& job);
void finalize_files(Job& job);
void finalize(Job& job);
void check_parent(const Job& job);
void commit(Job& job);
// failed: the job failed (the ring is aborted first, so that a training call waiting for
// staging lets go of its table). Returns the message of a snapshot that failed to end ("" when
// none did); the job has then failed too.
std::string end(Job& job, StagingRing& ring, bool failed);

}  // namespace embstore::checkpoint
