// The checkpoint directory commit protocol (docs/DESIGN.md, "On-disk layout and commit"):
// a checkpoint is written into <dir>/.tmp-<version>-<nonce>/, every file and directory in it
// fsynced, the directory renamed to its final name (never over an existing one) and <dir>
// fsynced. Readers only ever see renamed directories; .tmp-* leftovers of a crash are ignored
// by list_versions and removed by remove_leftovers.
//
// liburing style: every function returns 0 or -errno and nothing throws.
//
//   std::string staging;
//   if (int r = make_staging_dir(dir, version, &staging); r < 0) return r;
//   int r = write_files(staging);
//   if (r == 0) r = commit_staging_dir(staging, dir + "/" + version_dir_name(version, full));
//   if (r < 0) remove_tree(staging);  // a failed commit leaves the staging dir to the caller
//   return r;
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace embstore::io {

// mkdir -p with mode 0755. Each level it creates has its parent directory fsynced, so the new
// entries survive a crash, unless durable is false (inside a staging directory, whose commit
// fsyncs every directory in it anyway). Existing directories (or symlinks to them) are fine; a
// component that exists and is not a directory gives -ENOTDIR; -ENOENT for an empty path.
int create_directories(const std::string& path, bool durable = true);

// "00000000000000001000.full" / "00000000000000001000.delta": 20 digits hold any uint64_t,
// and zero padding makes name order version order.
std::string version_dir_name(uint64_t version, bool full);
// Strict inverse of version_dir_name: exactly 20 digits (no overflow) and ".full" or
// ".delta"; false for anything else, and the outputs are then left untouched.
bool parse_version_dir_name(const std::string& name, uint64_t* version, bool* full);

// Creates <parent>/.tmp-<version>-<nonce> (mode 0755, nonce: 16 random hex digits) and stores
// its path in *path_out. Another name is tried on EEXIST; -EEXIST only when many tries in a
// row collide. The parent must exist.
int make_staging_dir(const std::string& parent, uint64_t version, std::string* path_out);

// Opens path (as a directory when it is one), fsyncs it and closes it.
int fsync_path(const std::string& path);

// Makes staging durable under final_path: fsyncs every regular file and every directory below
// staging (depth first), then staging itself, renames staging to final_path without
// replacing anything (-EEXIST when final_path exists, even as an empty directory), and fsyncs
// final_path's parent directory. Symlinks are not followed.
// On failure before the rename, staging is left as it was (the caller removes it) and
// final_path does not exist. When only the last fsync fails, the rename has happened:
// final_path exists, staging does not, and the error is still reported because the commit may
// not survive a crash. *renamed (may be null) tells which: a caller rolls back only what it
// renamed, never a final_path that was there before (-EEXIST leaves it alone).
int commit_staging_dir(const std::string& staging, const std::string& final_path,
                       bool* renamed = nullptr);

// rm -rf without following symlinks. A missing path is 0. Goes on after an error and returns
// the first one (ENOENT, from entries removed concurrently, is not an error).
int remove_tree(const std::string& path);

// Removes every entry of parent whose name starts with ".tmp-" (crash leftovers) and appends
// the names removed, sorted, to *removed (may be null). Returns the first error; entries that
// could not be removed are not reported as removed.
int remove_leftovers(const std::string& parent, std::vector<std::string>* removed);

// Puts the file from at the new path to (never replacing one): a hard link, or, where the file
// systems differ or links are not allowed, a byte copy. Either way to must then hold `bytes`
// bytes (what a manifest says of from): -EBADMSG, and to removed, when it does not.
int link_or_copy(const std::string& from, const std::string& to, uint64_t bytes);

// Deletes <parent>/<name>: renamed to <parent>/.tmp-retired-<name>-<nonce> first (so that a crash half-way
// never leaves a damaged version for readers: remove_leftovers takes what is left), then
// removed.
int retire_version(const std::string& parent, const std::string& name);

struct VersionDir {
  uint64_t version = 0;
  bool full = false;
  std::string name;  // the directory's name inside parent
};

// The committed version directories in parent: directories whose names parse with
// parse_version_dir_name (.tmp-* and anything else is ignored), sorted by version (a full
// checkpoint before a delta of the same version). -ENOENT when parent is missing. *out is
// replaced.
int list_versions(const std::string& parent, std::vector<VersionDir>* out);

// Test-only: hook(step) is asked before each step of commit_staging_dir. Steps:
//   "fsync_file"   before each regular file's fsync inside staging
//   "fsync_dir"    before each directory's fsync inside staging (staging excluded)
//   "fsync_staging" before staging's own fsync
//   "rename"       before the rename
//   "renameat2"    stands in for renameat2's result: -ENOSYS or -EINVAL here makes the commit
//                  take the stat-and-rename fallback used where RENAME_NOREPLACE is missing
//   "fsync_parent" before the parent directory's fsync
// 0 lets the step go ahead; a -errno fails it with that error and nothing is done. An empty
// function turns injection off. Global to the process; tests reset it when done.
void set_commit_fault_injection(std::function<int(const char* step)> hook);

}  // namespace embstore::io
