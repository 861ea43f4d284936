#include "io/format/chain.hpp"

#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <memory>
#include <optional>
#include <unordered_set>
#include <utility>

#include "io/engine/engine.hpp"
#include "io/engine/regular_file.hpp"
#include "io/format/xxh3.hpp"

namespace embstore::io {

namespace {

using detail::errno_text;

// "<path>: corrupt" or "<path>: <errno text>" for an error without a reason of its own.
int path_error(const std::string& path, int err, std::string* detail) {
  *detail = err == -EBADMSG ? path + ": corrupt" : fmt::format("{}: {}", path, errno_text(err));
  return err;
}

int corrupt(std::string* detail, std::string message) {
  *detail = std::move(message);
  return -EBADMSG;
}

}  // namespace

int read_version_manifest(const std::string& parent, const VersionDir& v, Manifest* out,
                          std::string* detail) {
  const int r = read_manifest(parent + "/" + v.name, out, detail);
  if (r == 0 && (out->version != v.version || out->full != v.full)) {
    if (detail != nullptr) {
      *detail = fmt::format("it describes version {} ({}), not the directory's", out->version,
                            out->full ? "full" : "delta");
    }
    return -EBADMSG;
  }
  return r;
}

int check_link(const Manifest& child, const Manifest& parent, std::string* why) {
  auto broken = [&](std::string reason) {
    if (why != nullptr) *why = std::move(reason);
    return -EBADMSG;
  };
  if (!child.parent || *child.parent != parent.version) {
    return broken(fmt::format("it is not the parent of version {}", child.version));
  }
  if (parent.version >= child.version) {
    return broken(fmt::format("parent version {} is not older than the delta (version {})",
                              parent.version, child.version));
  }
  if (child.lineage != parent.lineage) {
    return broken(
        fmt::format("parent version {} is of lineage {:016x}, the delta of {:016x}: "
                    "another run's version",
                    parent.version, parent.lineage, child.lineage));
  }
  if (child.serving_only != parent.serving_only) {
    return broken(
        fmt::format("parent version {} is {}serving-only, the delta is {}: not of one "
                    "directory",
                    parent.version, parent.serving_only ? "" : "not ",
                    child.serving_only ? "serving-only" : "not"));
  }
  if (child.parent_xxh3 && *child.parent_xxh3 != parent.xxh3) {
    return broken(
        fmt::format("parent version {} has manifest checksum {:016x}, the delta was "
                    "written on {:016x}: not the version it applies on",
                    parent.version, parent.xxh3, *child.parent_xxh3));
  }
  return 0;
}

CheckpointDir::CheckpointDir(std::string path, std::vector<VersionDir> versions)
    : path_(std::move(path)), versions_(std::move(versions)), reads_(versions_.size()) {}

int CheckpointDir::open(const std::string& path, std::string* detail) {
  std::vector<VersionDir> versions;
  if (int r = list_versions(path, &versions); r < 0) {
    if (r == -ENOENT || r == -ENOTDIR) {
      *detail = fmt::format("checkpoint directory '{}' does not exist", path);
      return -ENOENT;
    }
    return path_error(path, r, detail);
  }
  *this = CheckpointDir(path, std::move(versions));
  return 0;
}

int CheckpointDir::manifest(size_t index, const Manifest** out, std::string* detail) {
  Read& read = reads_[index];
  if (!read.done) {
    read.rc = read_version_manifest(path_, versions_[index], &read.manifest, &read.detail);
    read.done = true;
  }
  if (read.rc < 0) {
    if (detail != nullptr) *detail = read.detail;
    return read.rc;
  }
  *out = &read.manifest;
  return 0;
}

int CheckpointDir::manifest_error(size_t index, int rc, const std::string& why,
                                  const std::string& missing, std::string* detail) const {
  const std::string file = version_path(index) + "/" + kManifestName;
  if (rc == -ENOENT) return corrupt(detail, fmt::format("{} is missing: {}", file, missing));
  if (rc == -EBADMSG) return corrupt(detail, fmt::format("{}: {}", file, why));
  return path_error(file, rc, detail);
}

int CheckpointDir::choose(uint64_t version, std::optional<bool> full, size_t* index,
                          std::string* detail, std::vector<std::string>* skipped) {
  const bool latest = version == kLatestVersion;
  // A bare version number takes the full checkpoint when there are both kinds (only a hand
  // can put them there): as embstore-ckpt inspect does, and needing no chain.
  if (!latest && !full && std::any_of(versions_.begin(), versions_.end(), [&](const VersionDir& v) {
        return v.version == version && v.full;
      })) {
    full = true;
  }
  for (size_t i = versions_.size(); i-- > 0;) {
    const VersionDir& v = versions_[i];
    if (!latest && (v.version != version || (full && *full != v.full))) continue;
    const Manifest* m = nullptr;
    std::string why;
    const int r = manifest(i, &m, &why);
    // Not a committed checkpoint (the commit writes the manifest before the rename).
    if (r == -ENOENT && latest) {
      if (skipped != nullptr) skipped->push_back(version_path(i));
      continue;
    }
    if (r < 0) {
      *index = i;
      return manifest_error(
          i, r, why, fmt::format("version {} is not a committed checkpoint", version), detail);
    }
    *index = i;
    return 0;
  }
  if (latest) {
    *detail = fmt::format("'{}' holds no committed checkpoint", path_);
  } else {
    *detail = fmt::format("'{}' holds no version {}", path_,
                          full ? version_dir_name(version, *full) : std::to_string(version));
  }
  return -ENOENT;
}

int CheckpointDir::chain(size_t index, std::vector<ChainLink>* out, std::string* detail) {
  out->clear();
  const Manifest* m = nullptr;
  std::string why;
  if (int r = manifest(index, &m, &why); r < 0) {
    return manifest_error(index, r, why, "it is not a committed checkpoint", detail);
  }
  for (;;) {
    out->push_back({&versions_[index], m, version_path(index)});
    if (m->full) return 0;
    const uint64_t parent = *m->parent;
    const std::string child = out->back().path;
    if (parent >= versions_[index].version) {
      return corrupt(detail, fmt::format("{}/{}: parent version {} is not older than the delta",
                                         child, kManifestName, parent));
    }
    // The parent: the version of that number whose manifest the delta names (of a full
    // checkpoint and a delta of one version, the full is tried first).
    std::optional<size_t> found;
    int first_rc = 0;
    size_t first = 0;
    std::string first_why;
    for (size_t i = 0; i < versions_.size() && !found; ++i) {
      if (versions_[i].version != parent) continue;
      const Manifest* pm = nullptr;
      std::string reason;
      int r = manifest(i, &pm, &reason);
      if (r == 0 && check_link(*m, *pm, &reason) < 0) r = 1;  // reads, but is not the parent
      if (r == 0) {
        found = i;
        m = pm;
      } else if (first_rc == 0) {
        first_rc = r;
        first = i;
        first_why = std::move(reason);
      }
    }
    if (found) {
      index = *found;
      continue;
    }
    if (first_rc == 0) {
      return corrupt(detail,
                     fmt::format("{}: its parent version {} is not in '{}': the chain is broken",
                                 child, parent, path_));
    }
    if (first_rc == 1) {
      return corrupt(
          detail, fmt::format("{}/{}: {}: the chain is broken", child, kManifestName, first_why));
    }
    return manifest_error(first, first_rc, first_why, child + " needs it (the chain is broken)",
                          detail);
  }
}

int check_file_size(const std::string& path, const FileEntry& f, std::string* detail) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return corrupt(detail, fmt::format("{} is missing (the manifest lists it with {} bytes)",
                                         path, f.bytes));
    }
    return path_error(path, -errno, detail);
  }
  if (!S_ISREG(st.st_mode)) return corrupt(detail, path + ": not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  if (size < f.bytes) {
    return corrupt(detail, fmt::format("{}: truncated: the file is {} bytes, the manifest says {} "
                                       "(data ends at offset {})",
                                       path, size, f.bytes, size));
  }
  if (size > f.bytes) {
    return corrupt(detail, fmt::format("{}: the file is {} bytes, the manifest says {} ({} "
                                       "unexpected bytes from offset {})",
                                       path, size, f.bytes, size - f.bytes, f.bytes));
  }
  return 0;
}

namespace {

// read_row_file with the state_dim its blocks must have: the table's, or 0 in a values-only file.
int read_checked_rows(const std::string& path, const FileEntry& f, const TableEntry& t,
                      uint32_t state_dim, bool full, const RowSink& on_block, std::string* detail,
                      bool check_behind, const ReaderOptions& reads) {
  if (int r = check_file_size(path, f, detail); r < 0) return r;
  std::unique_ptr<RowFileReader> reader;
  if (int r = RowFileReader::open(path, reads, &reader, check_behind); r < 0) {
    if (r == kNotRegularFile || r == -ELOOP) {  // swapped since the check above
      return corrupt(detail, path + ": " + regular_file_error(r));
    }
    return path_error(path, r, detail);
  }
  RowBlock b;
  uint64_t rows = 0;
  int r;
  while ((r = reader->next_block(&b)) == 1) {
    if (b.kind != RowBlockKind::kUpserts && full) {
      return corrupt(
          detail, fmt::format("{}: block at offset {} holds tombstones in a full checkpoint", path,
                              b.offset));
    }
    if (b.dim != t.config.dim || b.state_dim != state_dim) {
      return corrupt(detail,
                     fmt::format("{}: block at offset {} has dim {} and state_dim {}, the "
                                 "manifest says {} and {}",
                                 path, b.offset, b.dim, b.state_dim, t.config.dim, state_dim));
    }
    rows += b.rows;
    if (!on_block) continue;
    std::string why;
    int e = 0;
    // A block checked behind may have made on_block fail: then its corruption is the error.
    const auto corrupt_block = [&] {
      return check_behind && reader->wait_checked() == -EBADMSG
                 ? corrupt(detail, fmt::format("{}: {}", path, reader->error_detail()))
                 : 0;
    };
    try {
      e = on_block(b, &why);
    } catch (...) {
      if (const int c = corrupt_block(); c < 0) return c;
      throw;
    }
    if (e < 0) {
      if (const int c = corrupt_block(); c < 0) return c;
      *detail = fmt::format("{}: block at offset {}: {}", path, b.offset, why);
      return e;
    }
  }
  if (r == -EBADMSG) return corrupt(detail, fmt::format("{}: {}", path, reader->error_detail()));
  if (r < 0) return path_error(path, r, detail);
  if (rows != f.rows) {
    return corrupt(detail,
                   fmt::format("{}: holds {} rows, the manifest says {}", path, rows, f.rows));
  }
  if (reader->checksum() != f.xxh3) {
    return corrupt(detail, fmt::format("{}: XXH3 checksum mismatch: the file hashes to {:016x}, "
                                       "the manifest says {:016x}",
                                       path, reader->checksum(), f.xxh3));
  }
  return 0;
}

}  // namespace

int read_row_file(const std::string& path, const FileEntry& f, const TableEntry& t, bool full,
                  const RowSink& on_block, std::string* detail, bool check_behind,
                  const ReaderOptions& reads) {
  return read_checked_rows(path, f, t, t.state_dim, full, on_block, detail, check_behind, reads);
}

int read_serving_file(const std::string& path, const FileEntry& f, const TableEntry& t,
                      const RowSink& on_block, std::string* detail, const ReaderOptions& reads) {
  return read_checked_rows(path, f, t, 0, false, on_block, detail, false, reads);
}

int read_chain_rows(const std::vector<ChainLink>& chain, const TableEntry& table,
                    const ChainReadOptions& options, const RowSink& sink, std::string* detail) {
  // Newest first: a key's newest row wins, and each key is handed over once; a tombstone hides
  // the key from older files. seen: every key handed over or hidden, or (when the sink skips
  // the keys it holds) only the hidden ones.
  std::unordered_set<int64_t> seen;
  const bool filter = chain.size() > 1 || options.unique_keys;
  const bool track_upserts = options.unique_keys || !options.sink_skips_held;
  std::vector<int64_t> keys;
  std::vector<float> values, state;
  const RowSink hand_over = [&](const RowBlock& block, std::string* why) {
    if (block.rows == 0) return 0;
    if (!filter) return sink(block, why);
    if (block.kind == RowBlockKind::kTombstones) {
      for (uint32_t i = 0; i < block.rows; ++i) seen.insert(block.keys[i]);
      return 0;
    }
    const auto hidden = [&](int64_t key) { return seen.count(key) != 0; };
    if (!track_upserts && std::none_of(block.keys, block.keys + block.rows, hidden)) {
      return sink(block, why);  // the usual case: no tombstone so far names a key of the block
    }
    keys.clear();
    values.clear();
    state.clear();
    for (uint32_t i = 0; i < block.rows; ++i) {
      if (track_upserts ? !seen.insert(block.keys[i]).second : hidden(block.keys[i])) continue;
      keys.push_back(block.keys[i]);
      values.insert(values.end(), block.values + size_t{i} * block.dim,
                    block.values + size_t{i + 1} * block.dim);
      if (block.state_dim > 0) {
        state.insert(state.end(), block.state + size_t{i} * block.state_dim,
                     block.state + size_t{i + 1} * block.state_dim);
      }
    }
    if (keys.empty()) return 0;
    RowBlock b = block;
    b.keys = keys.data();
    b.values = values.data();
    b.state = b.state_dim > 0 ? state.data() : nullptr;
    b.rows = static_cast<uint32_t>(keys.size());
    return sink(b, why);
  };
  for (const ChainLink& c : chain) {
    auto it = std::find_if(c.manifest->tables.begin(), c.manifest->tables.end(),
                           [&](const TableEntry& e) { return e.name == table.name; });
    if (it == c.manifest->tables.end()) continue;  // created after that version
    if (it->config.dim != table.config.dim || it->state_dim != table.state_dim) {
      return corrupt(
          detail, fmt::format("{}: table '{}' changes shape along the chain", c.path, table.name));
    }
    for (const FileEntry& f : it->files) {
      if (options.skip_file && options.skip_file(*c.manifest, *it, f)) continue;
      if (int r = read_row_file(c.path + "/" + f.path, f, *it, c.manifest->full, hand_over, detail,
                                options.check_behind);
          r < 0) {
        return r;
      }
    }
  }
  return 0;
}

int read_checked_file(const std::string& vdir, const FileEntry& f, std::string* data,
                      std::string* detail) {
  const std::string path = vdir + "/" + f.path;
  if (int r = check_file_size(path, f, detail); r < 0) return r;
  // At most what the manifest says: a file swapped for a FIFO or an endless one since the check
  // must not hang or fill the reader.
  if (int r = read_regular(path, f.bytes, data); r < 0) {
    if (r == kNotRegularFile || r == -ELOOP) {
      return corrupt(detail, path + ": " + regular_file_error(r));
    }
    if (r == -EFBIG) {
      return corrupt(detail, fmt::format("{}: grew past the {} bytes the manifest says while read",
                                         path, f.bytes));
    }
    return path_error(path, r, detail);
  }
  if (data->size() != f.bytes) {
    return corrupt(detail, fmt::format("{}: read {} bytes, the manifest says {}: it changed while "
                                       "read",
                                       path, data->size(), f.bytes));
  }
  if (const uint64_t sum = xxh3_64(data->data(), data->size()); sum != f.xxh3) {
    return corrupt(detail, fmt::format("{}: XXH3 checksum mismatch: the file hashes to {:016x}, "
                                       "the manifest says {:016x}",
                                       path, sum, f.xxh3));
  }
  return 0;
}

}  // namespace embstore::io
