// Writes one version directory of a checkpoint in the current format (layout.hpp): its staging
// directory, its row files (sized by one rule), its whole files with their checksums
// (admission counts, attachments), its manifest, the commit (commit.hpp), and the one rule that
// rolls a version back. The checkpointer and embstore-ckpt compact write versions with it, and
// no one else does; every path it writes comes from the layout.
//
// liburing style: 0 or -errno, with what went wrong (naming the file) in *detail.
//
//   std::unique_ptr<VersionWriter> out;
//   if (int r = VersionWriter::begin(dir, version, full, &out, &detail); r < 0) return r;
//   std::unique_ptr<RowFileWriter> rows;
//   out->open_rows("users", dim, state_dim, n, 0, {}, &rows, &detail);  // add rows, finish
//   manifest.tables[0].files = {out->rows_entry("users", *rows)};
//   (with several ranks, rank 0 begins, the others join its staging directory)
//   out->write_attachment("rng", data, bytes, &manifest.attachments[0].file, &detail);
//   out->write_manifest(&manifest, &detail);
//   return out->commit(&detail);  // not committed: the destructor rolls back
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "io/engine/file_writer.hpp"
#include "io/format/admission_file.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"

namespace embstore::io {

class VersionWriter {
 public:
  // Creates dir's staging directory for the version (dir must exist, and its writer lock be
  // held: dir_lock.hpp).
  // rank and world_size: with world_size > 1, rank 0 begins (it alone commits, and rolls the
  // whole version back) and shares staging() with the other ranks, which join.
  static int begin(const std::string& dir, uint64_t version, bool full,
                   std::unique_ptr<VersionWriter>* out, std::string* detail, uint32_t rank = 0,
                   uint32_t world_size = 1);
  // Writes rank's files into a staging directory that rank 0 began (staging: its path). A
  // joined writer never commits, and its roll_back leaves everything to rank 0's. The files it
  // writes are made durable by itself (each rank's own, as NFS needs).
  static int join(const std::string& dir, const std::string& staging, uint64_t version, bool full,
                  uint32_t rank, uint32_t world_size, std::unique_ptr<VersionWriter>* out,
                  std::string* detail);
  // Rolls back unless committed: see roll_back().
  ~VersionWriter();
  VersionWriter(const VersionWriter&) = delete;
  VersionWriter& operator=(const VersionWriter&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& staging() const { return staging_; }
  // <dir>/<version directory name>: where commit() puts the version.
  const std::string& final_path() const { return final_path_; }

  // The file size to preallocate for a row file of rows upserts and tombstones tombstones, in
  // blocks of buffer_bytes: payload, one header per block, and the padding of each block.
  static uint64_t row_file_size_hint(uint64_t rows, uint64_t tombstones, uint32_t dim,
                                     uint32_t state_dim, size_t buffer_bytes);
  // Opens the row file of table (this writer's rank's shard), preallocated for rows and
  // tombstones, its blocks encoded with codecs.
  int open_rows(const std::string& table, uint32_t dim, uint32_t state_dim, uint64_t rows,
                uint64_t tombstones, WriterOptions options, std::unique_ptr<RowFileWriter>* out,
                std::string* detail, RowCodecs codecs = {});
  // Opens the values-only copy of table's row file (state_dim 0: serving_deltas, serving_dir),
  // its values stored as serving_row_codecs(serving) says (BF16's rounded by the writer).
  int open_serving_rows(const std::string& table, uint32_t dim, uint64_t rows, uint64_t tombstones,
                        WriterOptions options, std::unique_ptr<RowFileWriter>* out,
                        std::string* detail, Codec serving);
  // The manifest's entry of table's row file once rows->finish() returned 0.
  FileEntry rows_entry(const std::string& table, const RowFileWriter& rows) const;
  // The same for the values-only copy.
  FileEntry serving_entry(const std::string& table, const RowFileWriter& rows) const;
  uint32_t rank() const { return rank_; }
  uint32_t world_size() const { return world_size_; }
  // Writes table's admission counts (admission_file.hpp) and fills *entry.
  int write_admission(const std::string& table, const AdmissionFile& counts, FileEntry* entry,
                      std::string* detail);
  // Writes attachment name and fills *entry.
  int write_attachment(const std::string& name, const void* data, size_t bytes, FileEntry* entry,
                       std::string* detail);
  // Writes the manifest in the current format (3 with codecs, else 2: manifest_format_for):
  // sets m's format_version and xxh3. Rank 0's.
  int write_manifest(Manifest* m, std::string* detail);
  // Makes everything durable and renames the version into place (commit_staging_dir). On
  // failure the version is not there for readers once the writer rolls back.
  int commit(std::string* detail);
  bool committed() const { return committed_; }

  // Takes an uncommitted version back: the staging directory goes, and so does the version
  // directory when commit() renamed it but could not make the rename durable (it is first
  // renamed out of sight, so that a crash half-way never leaves it for readers). A version
  // that was in place before this writer is never touched. Idempotent.
  void roll_back();

 private:
  VersionWriter() = default;
  int open_row_file(const std::string& table, const std::string& rel, uint32_t dim,
                    uint32_t state_dim, uint64_t rows, uint64_t tombstones, WriterOptions options,
                    std::unique_ptr<RowFileWriter>* out, std::string* detail, RowCodecs codecs);
  std::string dir_, staging_, final_path_;
  uint32_t rank_ = 0, world_size_ = 1;
  bool joined_ = false;
  bool renamed_ = false, committed_ = false, rolled_back_ = false;
};

}  // namespace embstore::io
