// Checkpoint chains (docs/DESIGN.md, "On-disk layout and commit"): choosing a version in
// a checkpoint directory, following a delta's parents back to a full checkpoint, and reading
// one table's rows of a chain newest first, so that a key's newest row wins and a tombstone
// hides the key's older rows. Restore (host/checkpoint/restore.cpp) and embstore-ckpt share it.
//
// liburing style: 0 or -errno, and nothing throws (what a caller's sink throws passes through).
// -ENOENT: the directory or the version asked for is not there. -EBADMSG: something inside a
// version is corrupt or missing. After an error *detail is a message for users that names the
// file (and the block's offset), e.g. ".../users/shard-00000-of-00001.rows: block at offset
// 1048576: payload checksum mismatch".
//
//   CheckpointDir d;
//   std::string detail;
//   size_t v;
//   std::vector<ChainLink> chain;
//   if (int r = d.open(dir, &detail); r < 0) return r;
//   if (int r = d.choose(kLatestVersion, std::nullopt, &v, &detail, nullptr); r < 0) return r;
//   if (int r = d.chain(v, &chain, &detail); r < 0) return r;
//   for (const TableEntry& t : chain.front().manifest->tables)
//     if (int r = read_chain_rows(chain, t, {}, sink, &detail); r < 0) return r;
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "io/format/commit.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"

namespace embstore::io {

// choose(): the newest version with a manifest instead of an exact one (EMBSTORE_LATEST).
inline constexpr uint64_t kLatestVersion = UINT64_MAX;

// Reads <parent>/<v.name>/MANIFEST.json and checks that it describes v (version and kind).
// read_manifest's results; -EBADMSG also for a manifest of another version, the reason (without
// the path) in *detail.
int read_version_manifest(const std::string& parent, const VersionDir& v, Manifest* out,
                          std::string* detail);

// Whether parent is the version that the delta child applies on: child names parent's version,
// which is older, and (format 2) parent's lineage and manifest checksum, so that a delta never
// applies on another version of the same number, nor on a version of another run. 0, or
// -EBADMSG with the reason (without paths) in *why. The checkpointer checks each delta with it
// before its commit, restore and embstore-ckpt along every chain they follow.
int check_link(const Manifest& child, const Manifest& parent, std::string* why);

// One version of a chain. The pointers stay valid while the CheckpointDir lives.
struct ChainLink {
  const VersionDir* dir = nullptr;
  const Manifest* manifest = nullptr;
  std::string path;  // the version directory
};

// The committed versions of one checkpoint directory, each manifest read at most once.
// Movable, not copyable (ChainLinks point into it).
class CheckpointDir {
 public:
  CheckpointDir() = default;
  // A listing the caller already has (list_versions' order).
  CheckpointDir(std::string path, std::vector<VersionDir> versions);
  CheckpointDir(CheckpointDir&&) = default;
  CheckpointDir& operator=(CheckpointDir&&) = default;

  // Lists path. -ENOENT when it is missing or not a directory.
  int open(const std::string& path, std::string* detail);

  const std::string& path() const { return path_; }
  const std::vector<VersionDir>& versions() const { return versions_; }
  std::string version_path(size_t index) const { return path_ + "/" + versions_[index].name; }

  // read_version_manifest of versions()[index], read once; the reason (no path) in *detail.
  int manifest(size_t index, const Manifest** out, std::string* detail);

  // The version to restore: the newest one with a manifest (version kLatestVersion; those
  // without one are skipped and their paths appended to *skipped, which may be null), or the
  // exact version, of the given kind when full is set (the full one when both exist).
  // -ENOENT when there is none; -EBADMSG when the chosen one has no valid manifest (*index is
  // then set to it, for messages that name it).
  int choose(uint64_t version, std::optional<bool> full, size_t* index, std::string* detail,
             std::vector<std::string>* skipped);

  // The chain of versions()[index]: itself, then each parent back to a full checkpoint (newest
  // first). -EBADMSG when a parent is missing, has no valid manifest, or fails check_link.
  // Reads manifests only, no row data.
  int chain(size_t index, std::vector<ChainLink>* out, std::string* detail);

 private:
  struct Read {
    bool done = false;
    int rc = 0;
    std::string detail;
    Manifest manifest;
  };
  // "<version>/MANIFEST.json: <why>" for a manifest that did not read; -EBADMSG for -ENOENT.
  int manifest_error(size_t index, int rc, const std::string& why, const std::string& missing,
                     std::string* detail) const;

  std::string path_;
  std::vector<VersionDir> versions_;
  std::vector<Read> reads_;  // one per version
};

struct ChainReadOptions {
  // Drops repeated keys also when the chain is a full checkpoint alone (with deltas, always).
  bool unique_keys = false;
  // The sink leaves out the keys it already holds (a table being restored knows its keys), so
  // a key's older rows need not be dropped here: only the keys of tombstones are kept, to hide
  // older rows, and a block goes to the sink as it was read unless one of its keys is hidden.
  // Without unique_keys only; with it, every key is tracked here.
  bool sink_skips_held = false;
  // A block's payload checksum is checked while the sink uses it, and a mismatch fails the
  // read afterwards (RowFileReader's check_behind): for a sink whose work is dropped when the
  // read fails (a restore loading tables aside).
  bool check_behind = false;
  // Row files left unread when it returns true: a rank of a sharded store restoring a version
  // of its own world size reads only its shard's files (the others hold no key it owns, and
  // their own ranks read them).
  std::function<bool(const Manifest& version, const TableEntry& table, const FileEntry& file)>
      skip_file;
};

// Takes one block of rows (upserts only; each key once in the chain, unless the options say
// the sink skips the keys it holds). 0, or -errno with the
// reason in *detail; read_chain_rows then returns it as "<file>: block at offset N: <reason>".
using RowSink = std::function<int(const RowBlock& block, std::string* detail)>;

// Whether path (f's file) is there, a regular file, and f.bytes long: 0, or -EBADMSG with
// "<path> is missing ...", "<path>: truncated ..." in *detail; other -errno from lstat.
int check_file_size(const std::string& path, const FileEntry& f, std::string* detail);

// How read_row_file reads: 16 reads of 4 MiB in flight. On this project's test machine (a
// virtual disk), 1 MiB reads made a 10M-row restore take 4.7 s against 2.9 to 3.4 s with
// 32 to 64 MiB in flight (README, "How the restore is fast").
inline constexpr ReaderOptions kRowFileReads{16, size_t{4} << 20};

// Reads one row file of a version (path; f its entry in table t of a manifest of kind full)
// with every check restore makes: size, every block (checksums, no tombstones in a full
// checkpoint, the manifest's dim and state_dim), row count, and the whole file's XXH3 (hashed
// as it is read). Hands each block to on_block (may be empty), in file order. 0; -EBADMSG with
// *detail naming the file (and the block's offset); other -errno from reading. check_behind:
// RowFileReader's, for a caller that drops everything on_block did when this fails. reads: the
// reads in flight and their size (their buffers are allocated for each file).
int read_row_file(const std::string& path, const FileEntry& f, const TableEntry& t, bool full,
                  const RowSink& on_block, std::string* detail, bool check_behind = false,
                  const ReaderOptions& reads = kRowFileReads);
// The same checks for a delta's values-only file (f an entry of t.serving): blocks of state_dim
// 0, upserts and tombstones.
int read_serving_file(const std::string& path, const FileEntry& f, const TableEntry& t,
                      const RowSink& on_block, std::string* detail,
                      const ReaderOptions& reads = kRowFileReads);

// Hands sink the rows that chain (newest first, as CheckpointDir::chain gives it) holds for
// table (an entry of chain.front()'s manifest): every file of the table in every version that
// has it, each key's newest row only, and no key whose newest row is a tombstone: a key's status
// is that of its first occurrence in the newest file that holds it. Each file is read with
// read_row_file's checks; the table must keep its shape along the chain. The sum of the rows handed
// over is the table's rows at that version only if the chain is intact; callers compare it with
// table_rows.
int read_chain_rows(const std::vector<ChainLink>& chain, const TableEntry& table,
                    const ChainReadOptions& options, const RowSink& sink, std::string* detail);

// Reads the whole file f (an attachment, a table's admission counts) of the version directory
// vdir into *data and checks its size and XXH3 against the manifest. -EBADMSG when it is
// missing or differs.
int read_checked_file(const std::string& vdir, const FileEntry& f, std::string* data,
                      std::string* detail);

}  // namespace embstore::io
