// embstore-ckpt compact DIR --version V --out OUT: merges the full checkpoint and the deltas of
// V's chain into one full checkpoint of version V in OUT, without a store: per table, each
// key's newest row (value and optimizer state), tombstoned keys left out. The files and the
// manifest are laid out as the checkpointer lays out a full checkpoint
// (host/checkpoint/checkpointer.cpp), in the current format, so embstore_restore(OUT) restores
// it, and committed with io/commit's protocol, so an interrupted or failed compact leaves no
// version in OUT. OUT's writer lock is held throughout (io/dir_lock.hpp): a trainer writing
// there makes compact fail, and the other way round. Every output path comes from io/layout,
// never from the input's manifests.
#include <fmt/core.h>
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "io/admission_file.hpp"
#include "io/chain.hpp"
#include "io/commit.hpp"
#include "io/dir_lock.hpp"
#include "io/layout.hpp"
#include "io/manifest.hpp"
#include "io/row_file.hpp"
#include "io/tool/ckpt.hpp"

namespace embstore::ckpt {
namespace {

constexpr uint32_t kFormat = io::kManifestFormatVersion;

// The staging directory of the new version: removed unless committed.
struct Staging {
  std::string path;
  bool committed = false;
  ~Staging() {
    if (!committed && !path.empty()) io::remove_tree(path);
  }
};

// Writes table's merged rows into <staging>/<table>/<kShardFile> and returns its entry.
io::TableEntry write_table(const std::vector<io::ChainLink>& chain, const io::TableEntry& t,
                           const std::string& staging) {
  const std::string rel = io::row_file_path(kFormat, t.name, 0, 1);
  const std::string path = staging + "/" + rel;
  const std::string dir = staging + "/" + io::table_dir(kFormat, t.name);
  if (int r = io::create_directories(dir); r < 0) {
    throw Problem(fmt::format("{}: cannot create: {}", dir, errno_text(r)));
  }
  // Preallocated for the rows the table had at that version, as the checkpointer does.
  io::WriterOptions options;
  const uint64_t row_bytes = 8 + 4 * (uint64_t{t.config.dim} + t.state_dim);
  const uint64_t block_rows =
      std::max<uint64_t>(1, (options.buffer_bytes - io::kRowBlockHeaderBytes) / row_bytes);
  options.size_hint = t.table_rows * row_bytes +
                      (t.table_rows / block_rows + 1) * (io::kRowBlockHeaderBytes + io::kAlignment);
  std::unique_ptr<io::RowFileWriter> writer;
  if (int r = io::RowFileWriter::open(path, t.config.dim, t.state_dim, options, &writer); r < 0) {
    throw Problem(fmt::format("{}: cannot create: {}", path, errno_text(r)));
  }
  int write_error = 0;
  const io::RowSink sink = [&](const io::RowBlock& b, std::string* why) {
    for (uint32_t i = 0; i < b.rows; ++i) {
      const float* state = b.state_dim > 0 ? b.state + size_t{i} * b.state_dim : nullptr;
      if (int r = writer->add(b.keys[i], b.values + size_t{i} * b.dim, state); r < 0) {
        write_error = r;  // reported as the output's error, not the input block's
        *why = errno_text(r);
        return r;
      }
    }
    return 0;
  };
  io::ChainReadOptions read;
  read.unique_keys = true;  // a full checkpoint alone too
  std::string detail;
  const int r = io::read_chain_rows(chain, t, read, sink, &detail);
  if (write_error == 0 && r < 0) throw Problem(detail);
  if (int e = write_error != 0 ? write_error : writer->finish(); e < 0) {
    throw Problem(fmt::format("{}: cannot write: {}", path, errno_text(e)));
  }
  if (writer->rows() != t.table_rows) {
    throw Problem(
        fmt::format("{}: table '{}' has {} rows after merging its chain, the manifest says {}",
                    chain.front().path, t.name, writer->rows(), t.table_rows));
  }
  io::TableEntry e = t;
  e.rows = writer->rows();
  e.files = {{rel, writer->bytes(), writer->rows(), writer->checksum()}};
  // The admission counts of the chain's files, merged into the counts at this version.
  e.admission.reset();
  std::vector<std::string> counts;  // oldest first
  for (auto link = chain.rbegin(); link != chain.rend(); ++link) {
    for (const io::TableEntry& f : link->manifest->tables) {
      if (f.name != t.name || !f.admission) continue;
      std::string data;
      if (io::read_checked_file(link->path, *f.admission, &data, &detail) < 0) {
        throw Problem(detail);
      }
      counts.push_back(std::move(data));
    }
  }
  if (!counts.empty()) {
    io::AdmissionFile merged_counts;
    if (io::merge_admission_files(counts, &merged_counts, &detail) < 0) {
      throw Problem(
          fmt::format("{}: table '{}': admission counts: {}", chain.front().path, t.name, detail));
    }
    const std::vector<char> merged = io::format_admission_file(merged_counts);
    const std::string counts_path = io::admission_file_path(kFormat, t.name);
    const std::string out = staging + "/" + counts_path;
    if (int w = io::write_whole_file(out, merged.data(), merged.size()); w < 0) {
      throw Problem(fmt::format("{}: cannot write: {}", out, errno_text(w)));
    }
    e.admission =
        io::FileEntry{counts_path, merged.size(), 0, XXH3_64bits(merged.data(), merged.size())};
  }
  return e;
}

}  // namespace

int cmd_compact(const std::string& dir, const std::string& version_text, const std::string& out) {
  const VersionSpec spec = parse_version_spec(version_text);
  io::CheckpointDir checkpoints(dir, versions_of(dir));
  std::string detail;
  size_t index = 0;
  std::vector<io::ChainLink> chain;
  if (checkpoints.choose(spec.latest ? io::kLatestVersion : spec.version, spec.full, &index,
                         &detail, nullptr) < 0 ||
      checkpoints.chain(index, &chain, &detail) < 0) {
    throw Problem(detail);
  }
  const io::Manifest& source = *chain.front().manifest;
  for (const io::ChainLink& c : chain) {
    if (c.manifest->world_size != 1) {
      throw Problem(fmt::format("{} was written by {} ranks: compacting shards is not supported",
                                c.path, c.manifest->world_size));
    }
  }

  if (int r = io::create_directories(out); r < 0) {
    throw Problem(fmt::format("{}: cannot create: {}", out, errno_text(r)));
  }
  std::unique_ptr<io::DirLock> lock;
  if (io::DirLock::acquire(out, "embstore-ckpt compact", &lock, &detail) < 0) throw Problem(detail);
  // What an interrupted writer of OUT left (a compact or a checkpoint killed half-way).
  if (int r = io::remove_leftovers(out, nullptr); r < 0) {
    std::fprintf(stderr, "embstore-ckpt compact: could not remove every leftover in %s: %s\n",
                 out.c_str(), errno_text(r).c_str());
  }
  // Either kind of V in OUT would stand beside the new one; restore could pick it instead.
  for (const io::VersionDir& v : versions_of(out)) {
    if (v.version == source.version) {
      throw Problem(fmt::format("{} already holds version {} ({}): nothing written", out,
                                source.version, v.name));
    }
  }
  Staging staging;
  if (int r = io::make_staging_dir(out, source.version, &staging.path); r < 0) {
    throw Problem(fmt::format("{}: cannot create a temporary directory: {}", out, errno_text(r)));
  }

  io::Manifest m;
  m.full = true;
  m.lineage = io::new_lineage();  // a new base: deltas written on it start a new chain
  m.version = source.version;
  m.world_size = 1;
  m.embstore_version = EMBSTORE_VERSION_CODE;
  uint64_t rows = 0, bytes = 0;
  for (const io::TableEntry& t : source.tables) {
    m.tables.push_back(write_table(chain, t, staging.path));
    rows += m.tables.back().rows;
    bytes += m.tables.back().files.front().bytes;
    if (m.tables.back().admission) bytes += m.tables.back().admission->bytes;
  }
  if (!source.attachments.empty()) {
    const std::string adir = staging.path + "/" + io::kAttachmentsDir;
    if (int r = io::create_directories(adir); r < 0) {
      throw Problem(fmt::format("{}: cannot create: {}", adir, errno_text(r)));
    }
  }
  for (const io::AttachmentEntry& a : source.attachments) {
    std::string data;
    if (io::read_checked_file(chain.front().path, a.file, &data, &detail) < 0)
      throw Problem(detail);
    const std::string rel = io::attachment_path(a.name);
    const std::string path = staging.path + "/" + rel;
    if (int r = io::write_whole_file(path, data.data(), data.size()); r < 0) {
      throw Problem(fmt::format("{}: cannot write: {}", path, errno_text(r)));
    }
    m.attachments.push_back({a.name, {rel, a.file.bytes, 0, a.file.xxh3}});
    bytes += a.file.bytes;
  }
  if (int r = io::write_manifest(staging.path, m); r < 0) {
    throw Problem(
        fmt::format("{}/{}: cannot write: {}", staging.path, io::kManifestName, errno_text(r)));
  }
  const std::string final_path = out + "/" + io::version_dir_name(m.version, true);
  bool renamed = false;
  if (int r = io::commit_staging_dir(staging.path, final_path, &renamed); r < 0) {
    // When only the last fsync failed, the version is in place but may not survive a crash:
    // take it back out of sight (to the staging name, gone since the rename) and remove it.
    if (renamed) std::rename(final_path.c_str(), staging.path.c_str());
    throw Problem(fmt::format("{}: commit failed: {}", final_path, errno_text(r)));
  }
  staging.committed = true;

  const size_t deltas = chain.size() - 1;
  fmt::print("compacted {} (1 full, {}) into {} ({}, {} rows, {})\n", chain.front().path,
             plural(deltas, "delta", "deltas"), final_path,
             plural(m.tables.size(), "table", "tables"), rows, human(bytes));
  return kExitOk;
}

}  // namespace embstore::ckpt
