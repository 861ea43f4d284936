// Restore (embstore_restore): pick the version, check its manifest, load every table into new
// table objects, and only when everything has loaded and checked, swap them into the store.
#include <sys/stat.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>

#include "host/checkpoint/checkpointer.hpp"
#include "host/error.hpp"
#include "host/store.hpp"
#include "io/commit.hpp"
#include "io/engine.hpp"
#include "io/manifest.hpp"
#include "io/row_file.hpp"

namespace embstore::checkpoint {

namespace {

std::string errno_text(int negative_errno) {
  return fmt::format("{} ({})", std::strerror(-negative_errno),
                     io::detail::errno_name(negative_errno));
}

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
void load_file(const std::string& path, const io::FileEntry& f, const io::TableEntry& t,
               uint64_t step, Table& table) {
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
  while ((r = reader->next_block(&b)) == 1) {
    if (b.kind != io::RowBlockKind::kUpserts) {
      fail(EMBSTORE_CORRUPT, "{}: block at offset {} holds tombstones in a full checkpoint", path,
           b.offset);
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
    rows += b.rows;
  }
  if (r == -EBADMSG) fail(EMBSTORE_CORRUPT, "{}: {}", path, reader->error_detail());
  if (r < 0) fail_io(path, r);
  if (rows != f.rows) {
    fail(EMBSTORE_CORRUPT, "{}: holds {} rows, the manifest says {}", path, rows, f.rows);
  }
}

}  // namespace

uint64_t Checkpointer::restore(const std::string& dir, uint64_t version) {
  std::lock_guard op(op_mutex_);
  {
    std::unique_lock lock(mutex_);
    wait_for_job(lock, false);
  }
  const Chosen chosen = choose(dir, version);
  const io::Manifest& m = chosen.manifest;
  const std::string vdir = dir + "/" + chosen.dir.name;
  if (!m.full) {
    fail(EMBSTORE_UNSUPPORTED, "{} is a delta: incremental checkpoints are not supported yet",
         vdir);
  }
  if (m.world_size != 1) {
    fail(EMBSTORE_UNSUPPORTED, "{} was written by {} ranks: resharding is not supported yet", vdir,
         m.world_size);
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
    for (const io::FileEntry& f : t.files) load_file(vdir + "/" + f.path, f, t, m.version, *impl);
    // Every file checked out; their rows must also be distinct keys.
    if (const uint64_t rows = impl->counters().rows; rows != t.rows) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}' loaded {} distinct rows, the manifest says {}", vdir,
           t.name, rows, t.rows);
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
  restored_ = true;
  policy_step_mark_ = m.version;  // the schedule goes on from the restored step
  policy_time_mark_ = std::chrono::steady_clock::now();
  return m.version;
}

}  // namespace embstore::checkpoint
