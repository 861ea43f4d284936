// Restore (embstore_restore): pick the version, check its manifest, load every table into new
// table objects, and only when everything has loaded and checked, swap them into the store.
#include <sys/stat.h>
#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <unordered_set>

#include "host/checkpoint/checkpointer.hpp"
#include "host/error.hpp"
#include "host/store.hpp"
#include "io/commit.hpp"
#include "io/engine.hpp"
#include "io/manifest.hpp"
#include "io/row_file.hpp"

namespace embstore::checkpoint {

namespace {

using io::detail::errno_text;

[[noreturn]] void fail_io(const std::string& path, int err) {
  if (err == -EBADMSG) fail(EMBSTORE_CORRUPT, "{}: corrupt", path);
  fail(EMBSTORE_IO_ERROR, "{}: {}", path, errno_text(err));
}

// The version directory to restore and its manifest.
struct Chosen {
  io::VersionDir dir;
  io::Manifest manifest;
};

Chosen choose(const std::string& dir, uint64_t version) {
  std::vector<io::VersionDir> versions;
  if (int r = io::list_versions(dir, &versions); r < 0) {
    if (r == -ENOENT || r == -ENOTDIR) {
      fail(EMBSTORE_NOT_FOUND, "checkpoint directory '{}' does not exist", dir);
    }
    fail_io(dir, r);
  }
  const bool latest = version == EMBSTORE_LATEST;
  for (auto it = versions.rbegin(); it != versions.rend(); ++it) {
    if (!latest && it->version != version) continue;
    const std::string path = dir + "/" + it->name;
    Chosen c;
    c.dir = *it;
    std::string detail;
    const int r = io::read_manifest(path, &c.manifest, &detail);
    if (r == -ENOENT) {
      // Not a committed checkpoint (the commit writes the manifest before the rename).
      if (!latest) {
        fail(EMBSTORE_CORRUPT, "{}/{} is missing: version {} is not a committed checkpoint", path,
             io::kManifestName, version);
      }
      std::fprintf(stderr, "embstore: restore skips '%s': it has no %s\n", path.c_str(),
                   io::kManifestName);
      continue;
    }
    if (r == -EBADMSG) {
      fail(EMBSTORE_CORRUPT, "{}/{}: {}", path, io::kManifestName, detail);
    }
    if (r < 0) fail_io(path + "/" + io::kManifestName, r);
    if (c.manifest.version != it->version || c.manifest.full != it->full) {
      fail(EMBSTORE_CORRUPT, "{}/{}: it describes version {} ({}), not the directory's", path,
           io::kManifestName, c.manifest.version, c.manifest.full ? "full" : "delta");
    }
    return c;
  }
  if (latest) fail(EMBSTORE_NOT_FOUND, "'{}' holds no committed checkpoint", dir);
  fail(EMBSTORE_NOT_FOUND, "'{}' holds no version {}", dir, version);
}

// Loads one row file into table, checking it against its manifest entry.
// With `seen` (a chain with deltas, read newest first), only keys not seen in a newer
// version are loaded, and tombstones hide a key from older versions.
void load_file(const std::string& path, const io::FileEntry& f, const io::TableEntry& t,
               uint64_t step, bool full, std::unordered_set<int64_t>* seen, Table& table) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) fail(EMBSTORE_CORRUPT, "{} is missing", path);
    fail_io(path, -errno);
  }
  if (static_cast<uint64_t>(st.st_size) != f.bytes) {
    fail(EMBSTORE_CORRUPT,
         "{}: the file is {} bytes, the manifest says {} (truncated at offset {}?)", path,
         st.st_size, f.bytes, std::min<uint64_t>(st.st_size, f.bytes));
  }
  std::unique_ptr<io::RowFileReader> reader;
  if (int r = io::RowFileReader::open(path, {}, &reader); r < 0) fail_io(path, r);
  io::RowBlock b;
  uint64_t rows = 0;
  int r;
  std::vector<int64_t> keys;
  std::vector<float> values, state;
  while ((r = reader->next_block(&b)) == 1) {
    if (b.kind != io::RowBlockKind::kUpserts && full) {
      fail(EMBSTORE_CORRUPT, "{}: block at offset {} holds tombstones in a full checkpoint", path,
           b.offset);
    }
    rows += b.rows;
    if (seen != nullptr) {
      if (b.kind == io::RowBlockKind::kTombstones) {
        for (uint32_t i = 0; i < b.rows; ++i) seen->insert(b.keys[i]);
        continue;
      }
      keys.clear();
      values.clear();
      state.clear();
      for (uint32_t i = 0; i < b.rows; ++i) {
        if (!seen->insert(b.keys[i]).second) continue;
        keys.push_back(b.keys[i]);
        values.insert(values.end(), b.values + size_t{i} * b.dim, b.values + size_t{i + 1} * b.dim);
        if (b.state_dim > 0) {
          state.insert(state.end(), b.state + size_t{i} * b.state_dim,
                       b.state + size_t{i + 1} * b.state_dim);
        }
      }
      b.keys = keys.data();
      b.values = values.data();
      b.state = state.data();
      b.rows = static_cast<uint32_t>(keys.size());
    }
    if (b.dim != t.config.dim || b.state_dim != t.state_dim) {
      fail(EMBSTORE_CORRUPT,
           "{}: block at offset {} has dim {} and state_dim {}, the manifest {} and {}", path,
           b.offset, b.dim, b.state_dim, t.config.dim, t.state_dim);
    }
    try {
      table.load_rows(b.keys, b.values, b.state, b.rows, step);
    } catch (const Error& e) {
      // A backend that checks its input (the CUDA one refuses repeated keys) found the file
      // inconsistent.
      if (e.status() != EMBSTORE_INVALID_ARGUMENT) throw;
      fail(EMBSTORE_CORRUPT, "{}: block at offset {}: {}", path, b.offset, e.what());
    }
  }
  if (r == -EBADMSG) fail(EMBSTORE_CORRUPT, "{}: {}", path, reader->error_detail());
  if (r < 0) fail_io(path, r);
  if (rows != f.rows) {
    fail(EMBSTORE_CORRUPT, "{}: holds {} rows, the manifest says {}", path, rows, f.rows);
  }
}

// The chain of a version: itself, then each parent back to a full checkpoint (newest first).
std::vector<Chosen> resolve_chain(const std::string& dir, Chosen target) {
  std::vector<io::VersionDir> versions;
  if (int r = io::list_versions(dir, &versions); r < 0) fail_io(dir, r);
  std::vector<Chosen> chain;
  chain.push_back(std::move(target));
  while (!chain.back().manifest.full) {
    const Chosen& child = chain.back();
    const uint64_t parent = *child.manifest.parent;
    const std::string child_path = dir + "/" + child.dir.name;
    if (parent >= child.dir.version) {
      fail(EMBSTORE_CORRUPT, "{}/{}: parent version {} is not older than the delta", child_path,
           io::kManifestName, parent);
    }
    auto it = std::find_if(versions.begin(), versions.end(),
                           [&](const io::VersionDir& v) { return v.version == parent; });
    if (it == versions.end()) {
      fail(EMBSTORE_CORRUPT, "{}: its parent version {} is not in '{}': the chain is broken",
           child_path, parent, dir);
    }
    Chosen c;
    c.dir = *it;
    std::string detail;
    const std::string path = dir + "/" + it->name;
    const int r = io::read_manifest(path, &c.manifest, &detail);
    if (r == -ENOENT) {
      fail(EMBSTORE_CORRUPT, "{}/{} is missing: {} needs it (the chain is broken)", path,
           io::kManifestName, child_path);
    }
    if (r == -EBADMSG) fail(EMBSTORE_CORRUPT, "{}/{}: {}", path, io::kManifestName, detail);
    if (r < 0) fail_io(path + "/" + io::kManifestName, r);
    chain.push_back(std::move(c));
  }
  return chain;
}

}  // namespace

uint64_t Checkpointer::restore(const std::string& dir, uint64_t version) {
  std::lock_guard op(op_mutex_);
  {
    std::unique_lock lock(mutex_);
    wait_for_job(lock, false);
  }
  const std::vector<Chosen> chain = resolve_chain(dir, choose(dir, version));
  const io::Manifest& m = chain.front().manifest;
  const std::string vdir = dir + "/" + chain.front().dir.name;
  for (const Chosen& c : chain) {
    if (c.manifest.world_size != 1) {
      fail(EMBSTORE_UNSUPPORTED, "{}/{} was written by {} ranks: resharding is not supported yet",
           dir, c.dir.name, c.manifest.world_size);
    }
  }

  // Load everything aside; the store is not touched until all of it has checked.
  struct Loaded {
    embstore_table* existing;
    std::unique_ptr<Table> impl;
  };
  std::vector<Loaded> loaded;
  for (const io::TableEntry& t : m.tables) {
    embstore_table* existing = store_.find_table(t.name.c_str());
    TableSpec spec;
    if (existing != nullptr) {
      spec = existing->impl->spec();
      if (spec.dim != t.config.dim) {
        fail(EMBSTORE_INVALID_ARGUMENT, "table '{}' has dim {}, the checkpoint {} has dim {}",
             t.name, spec.dim, vdir, t.config.dim);
      }
      if (static_cast<int>(spec.opt.kind) != static_cast<int>(t.config.optimizer)) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "table '{}' uses optimizer {}, the checkpoint {} holds the state of {}", t.name,
             io::optimizer_name(static_cast<int>(spec.opt.kind)), vdir,
             io::optimizer_name(t.config.optimizer));
      }
    } else {
      try {
        spec = make_table_spec(t.config);
      } catch (const Error& e) {
        fail(EMBSTORE_CORRUPT, "{}/{}: table '{}': {}", vdir, io::kManifestName, t.name, e.what());
      }
    }
    if (spec.state_dim() != t.state_dim) {
      fail(EMBSTORE_CORRUPT, "{}/{}: table '{}' has state_dim {}, its optimizer needs {}", vdir,
           io::kManifestName, t.name, t.state_dim, spec.state_dim());
    }
    std::unique_ptr<Table> impl = store_.make_table_impl(std::move(spec));
    // Newest first: a key's newest version wins, and each key is loaded once.
    std::unordered_set<int64_t> seen;
    std::unordered_set<int64_t>* filter = chain.size() > 1 ? &seen : nullptr;
    for (const Chosen& c : chain) {
      auto it = std::find_if(c.manifest.tables.begin(), c.manifest.tables.end(),
                             [&](const io::TableEntry& e) { return e.name == t.name; });
      if (it == c.manifest.tables.end()) continue;  // created after that version
      if (it->config.dim != t.config.dim || it->state_dim != t.state_dim) {
        fail(EMBSTORE_CORRUPT, "{}/{}: table '{}' changes shape along the chain", dir, c.dir.name,
             t.name);
      }
      for (const io::FileEntry& f : it->files) {
        load_file(dir + "/" + c.dir.name + "/" + f.path, f, *it, m.version, c.manifest.full, filter,
                  *impl);
      }
    }
    // Every file checked out; the rows must also be the table's rows at that version.
    if (const uint64_t rows = impl->counters().rows; rows != t.table_rows) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}' has {} rows after loading, the manifest says {}", vdir,
           t.name, rows, t.table_rows);
    }
    loaded.push_back({existing, std::move(impl)});
  }
  std::map<std::string, std::vector<char>> attachments;
  for (const io::AttachmentEntry& a : m.attachments) {
    const std::string path = vdir + "/" + a.file.path;
    std::string data;
    if (int r = io::read_whole_file(path, &data); r < 0) {
      if (r == -ENOENT) fail(EMBSTORE_CORRUPT, "{} is missing", path);
      fail_io(path, r);
    }
    if (data.size() != a.file.bytes) {
      fail(EMBSTORE_CORRUPT, "{}: the file is {} bytes, the manifest says {} (offset {})", path,
           data.size(), a.file.bytes, std::min<uint64_t>(data.size(), a.file.bytes));
    }
    if (XXH3_64bits(data.data(), data.size()) != a.file.xxh3) {
      fail(EMBSTORE_CORRUPT, "{}: checksum mismatch over bytes [0, {})", path, data.size());
    }
    attachments[a.name].assign(data.begin(), data.end());
  }

  // Swap in. Nothing below fails but allocation.
  for (Loaded& l : loaded) {
    if (l.existing != nullptr) {
      l.existing->impl = std::move(l.impl);
    } else {
      store_.adopt_table(std::move(l.impl));
    }
  }
  store_.step.store(m.version, std::memory_order_relaxed);
  std::lock_guard lock(mutex_);
  restored_attachments_ = std::move(attachments);
  // The schedules go on from the restored step, and the next delta in dir follows it.
  policy_full_step_ = policy_incr_step_ = m.version;
  policy_full_time_ = policy_incr_time_ = std::chrono::steady_clock::now();
  policy_full_due_ = policy_incr_due_ = false;
  chain_ = Chain{true, dir, m.version, 0, 0, 0};
  for (const Chosen& c : chain) {
    uint64_t bytes = 0;
    for (const io::TableEntry& t : c.manifest.tables) {
      for (const io::FileEntry& f : t.files) bytes += f.bytes;
    }
    if (c.manifest.full) {
      chain_.full_bytes = bytes;
    } else {
      chain_.delta_bytes += bytes;
      ++chain_.deltas;
    }
  }
  return m.version;
}

}  // namespace embstore::checkpoint
