#include "io/format/version_writer.hpp"

#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>

#include "io/engine/engine.hpp"
#include "io/format/commit.hpp"
#include "io/format/layout.hpp"
#include "io/format/xxh3.hpp"

namespace embstore::io {
namespace {

using detail::errno_text;

// The format this version writes.
constexpr uint32_t kFormat = kManifestFormatVersion;

int failed(std::string* detail, int err, std::string what) {
  if (detail != nullptr) *detail = fmt::format("{}: {}", what, errno_text(err));
  return err;
}

}  // namespace

int VersionWriter::begin(const std::string& dir, uint64_t version, bool full,
                         std::unique_ptr<VersionWriter>* out, std::string* detail, uint32_t rank,
                         uint32_t world_size) {
  std::unique_ptr<VersionWriter> w(new VersionWriter());
  w->dir_ = dir;
  w->final_path_ = dir + "/" + version_dir_name(version, full);
  w->rank_ = rank;
  w->world_size_ = world_size;
  if (int r = make_staging_dir(dir, version, &w->staging_); r < 0) {
    return failed(detail, r, fmt::format("cannot create a temporary directory in '{}'", dir));
  }
  *out = std::move(w);
  return 0;
}

int VersionWriter::join(const std::string& dir, const std::string& staging, uint64_t version,
                        bool full, uint32_t rank, uint32_t world_size,
                        std::unique_ptr<VersionWriter>* out, std::string* detail) {
  std::unique_ptr<VersionWriter> w(new VersionWriter());
  w->dir_ = dir;
  w->staging_ = staging;
  w->final_path_ = dir + "/" + version_dir_name(version, full);
  w->rank_ = rank;
  w->world_size_ = world_size;
  w->joined_ = true;
  struct stat st;
  const int err = ::stat(staging.c_str(), &st) != 0 ? -errno : (S_ISDIR(st.st_mode) ? 0 : -ENOTDIR);
  if (err < 0) {
    return failed(detail, err,
                  fmt::format("rank {} cannot find rank 0's temporary directory '{}' (is '{}' on a "
                              "file system every rank shares?)",
                              rank, staging, dir));
  }
  *out = std::move(w);
  return 0;
}

VersionWriter::~VersionWriter() {
  if (!committed_) roll_back();
}

uint64_t VersionWriter::row_file_size_hint(uint64_t rows, uint64_t tombstones, uint32_t dim,
                                           uint32_t state_dim, size_t buffer_bytes) {
  const uint64_t row_bytes = 8 + 4 * (uint64_t{dim} + state_dim);
  const uint64_t usable =
      buffer_bytes > kRowBlockHeaderBytes ? buffer_bytes - kRowBlockHeaderBytes : 1;
  const uint64_t upsert_blocks = (rows + std::max<uint64_t>(1, usable / row_bytes) - 1) /
                                 std::max<uint64_t>(1, usable / row_bytes);
  const uint64_t tombstone_blocks =
      (tombstones + std::max<uint64_t>(1, usable / 8) - 1) / std::max<uint64_t>(1, usable / 8);
  // Each block: its header, and up to one alignment unit of padding.
  return rows * row_bytes + tombstones * 8 +
         (upsert_blocks + tombstone_blocks) * (kRowBlockHeaderBytes + kAlignment);
}

int VersionWriter::open_rows(const std::string& table, uint32_t dim, uint32_t state_dim,
                             uint64_t rows, uint64_t tombstones, WriterOptions options,
                             std::unique_ptr<RowFileWriter>* out, std::string* detail,
                             RowCodecs codecs) {
  return open_row_file(table, row_file_path(kFormat, table, rank_, world_size_), dim, state_dim,
                       rows, tombstones, options, out, detail, codecs);
}

int VersionWriter::open_serving_rows(const std::string& table, uint32_t dim, uint64_t rows,
                                     uint64_t tombstones, WriterOptions options,
                                     std::unique_ptr<RowFileWriter>* out, std::string* detail,
                                     Codec serving) {
  return open_row_file(table, serving_file_path(kFormat, table, rank_, world_size_), dim, 0, rows,
                       tombstones, options, out, detail, serving_row_codecs(serving));
}

int VersionWriter::open_row_file(const std::string& table, const std::string& rel, uint32_t dim,
                                 uint32_t state_dim, uint64_t rows, uint64_t tombstones,
                                 WriterOptions options, std::unique_ptr<RowFileWriter>* out,
                                 std::string* detail, RowCodecs codecs) {
  const std::string dir = staging_ + "/" + table_dir(kFormat, table);
  // Not fsynced here: the commit fsyncs every directory of the version once.
  if (int r = create_directories(dir, /*durable=*/false); r < 0) {
    return failed(detail, r, fmt::format("cannot create '{}'", dir));
  }
  const std::string path = staging_ + "/" + rel;
  options.size_hint = row_file_size_hint(rows, tombstones, dim, state_dim, options.buffer_bytes);
  if (int r = RowFileWriter::open(path, dim, state_dim, options, out, codecs); r < 0) {
    return failed(detail, r, fmt::format("cannot open '{}'", path));
  }
  return 0;
}

FileEntry VersionWriter::rows_entry(const std::string& table, const RowFileWriter& rows) const {
  return {row_file_path(kFormat, table, rank_, world_size_),
          rows.bytes(),
          rows.rows(),
          rows.checksum(),
          rows.codecs().values,
          rows.codecs().state};
}

FileEntry VersionWriter::serving_entry(const std::string& table, const RowFileWriter& rows) const {
  FileEntry e = rows_entry(table, rows);
  e.path = serving_file_path(kFormat, table, rank_, world_size_);
  return e;
}

namespace {

// Writes data as staging/rel and returns its entry; fsyncs it when durable (a rank's own files
// in a version of several ranks: only the writing client's fsync makes them durable on NFS).
int write_whole(const std::string& staging, const std::string& rel, const void* data, size_t bytes,
                bool durable, FileEntry* entry, std::string* detail) {
  const std::string path = staging + "/" + rel;
  const size_t slash = path.rfind('/');
  if (int r = create_directories(path.substr(0, slash), /*durable=*/false); r < 0) {
    return failed(detail, r, fmt::format("cannot create '{}'", path.substr(0, slash)));
  }
  if (int r = write_whole_file(path, data, bytes); r < 0) {
    return failed(detail, r, fmt::format("writing {}", rel));
  }
  if (durable) {
    if (int r = fsync_path(path); r < 0) return failed(detail, r, fmt::format("fsync of {}", rel));
  }
  *entry = FileEntry{rel, bytes, 0, xxh3_64(data, bytes)};
  return 0;
}

}  // namespace

int VersionWriter::write_admission(const std::string& table, const AdmissionFile& counts,
                                   FileEntry* entry, std::string* detail) {
  const std::vector<char> bytes = format_admission_file(counts);
  return write_whole(staging_, admission_file_path(kFormat, table, rank_, world_size_),
                     bytes.data(), bytes.size(), world_size_ > 1, entry, detail);
}

int VersionWriter::write_attachment(const std::string& name, const void* data, size_t bytes,
                                    FileEntry* entry, std::string* detail) {
  return write_whole(staging_, attachment_path(name, rank_, world_size_), data, bytes,
                     world_size_ > 1, entry, detail);
}

int VersionWriter::write_manifest(Manifest* m, std::string* detail) {
  m->format_version = manifest_format_for(*m);
  if (int r = io::write_manifest(staging_, *m, &m->xxh3); r < 0) {
    return failed(detail, r,
                  r == -EFBIG ? fmt::format("writing {}: larger than the {} bytes readers take "
                                            "(EMBSTORE_MAX_MANIFEST_BYTES: fewer tables or ranks)",
                                            kManifestName, kMaxManifestBytes)
                              : fmt::format("writing {}", kManifestName));
  }
  return 0;
}

int VersionWriter::commit(std::string* detail) {
  if (joined_) return failed(detail, -EINVAL, "only rank 0 commits a version");
  if (int r = commit_staging_dir(staging_, final_path_, &renamed_); r < 0) {
    return failed(detail, r, "commit");
  }
  committed_ = true;
  return 0;
}

void VersionWriter::roll_back() {
  if (rolled_back_ || committed_) return;
  rolled_back_ = true;
  if (joined_) return;  // rank 0 removes the whole version, once every rank is done with it
  remove_tree(staging_);
  if (!renamed_) return;
  // Renamed, but the rename may not be durable: out of sight first, so that a crash half-way
  // never leaves the version for readers (the next writer removes .tmp-* leftovers).
  uint64_t nonce = 0;
  if (::getrandom(&nonce, sizeof nonce, 0) != static_cast<ssize_t>(sizeof nonce)) nonce = 0;
  const std::string hidden = fmt::format("{}/.tmp-rolled-back-{:016x}", dir_, nonce);
  if (std::rename(final_path_.c_str(), hidden.c_str()) != 0 || remove_tree(hidden) < 0) {
    std::fprintf(stderr, "embstore: could not roll back '%s'\n", final_path_.c_str());
  }
}

}  // namespace embstore::io
