// Restore (embstore_restore): pick the version, check its manifest, load every table into new
// table objects, and only when everything has loaded and checked, swap them into the store.
#include <cerrno>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "host/checkpoint/checkpointer.hpp"
#include "host/error.hpp"
#include "host/store.hpp"
#include "io/chain.hpp"
#include "io/manifest.hpp"
#include "io/row_file.hpp"

namespace embstore::checkpoint {

namespace {

// io/chain's errors as statuses: corrupt data, or an I/O error; the message names the file.
[[noreturn]] void fail_chain(int err, const std::string& detail) {
  fail(err == -EBADMSG ? EMBSTORE_CORRUPT : EMBSTORE_IO_ERROR, "{}", detail);
}

// Loads the table's admission counts from the chain's files (each checked against its
// manifest), merged into the counts at the restored version.
void load_admission(const std::vector<io::ChainLink>& chain, const std::string& table,
                    Table& impl) {
  std::vector<std::string> files;  // oldest first
  for (auto link = chain.rbegin(); link != chain.rend(); ++link) {
    for (const io::TableEntry& e : link->manifest->tables) {
      if (e.name != table || !e.admission) continue;
      std::string detail;
      files.emplace_back();
      if (int r = io::read_checked_file(link->path, *e.admission, &files.back(), &detail); r < 0) {
        fail_chain(r, detail);
      }
    }
  }
  if (files.empty()) return;
  std::string why;
  try {
    if (!impl.load_admission(files, &why)) {
      std::fprintf(stderr,
                   "embstore: restore leaves the admission counts of table '%s' in %s: %s\n",
                   table.c_str(), chain.front().path.c_str(), why.c_str());
    }
  } catch (const Error& e) {
    fail(e.status(), "{}: table '{}': {}", chain.front().path, table, e.what());
  }
}

}  // namespace

uint64_t Checkpointer::restore(const std::string& dir, uint64_t version) {
  std::lock_guard op(op_mutex_);
  {
    std::unique_lock lock(mutex_);
    wait_for_job(lock, false);
  }
  static_assert(EMBSTORE_LATEST == io::kLatestVersion);
  io::CheckpointDir checkpoints;
  std::string detail;
  if (int r = checkpoints.open(dir, &detail); r < 0) {
    if (r == -ENOENT) fail(EMBSTORE_NOT_FOUND, "{}", detail);
    fail_chain(r, detail);
  }
  size_t chosen = 0;
  std::vector<std::string> skipped;
  const int r = checkpoints.choose(version, std::nullopt, &chosen, &detail, &skipped);
  for (const std::string& path : skipped) {
    std::fprintf(stderr, "embstore: restore skips '%s': it has no %s\n", path.c_str(),
                 io::kManifestName);
  }
  if (r == -ENOENT) fail(EMBSTORE_NOT_FOUND, "{}", detail);
  if (r < 0) fail_chain(r, detail);
  std::vector<io::ChainLink> chain;
  if (int e = checkpoints.chain(chosen, &chain, &detail); e < 0) fail_chain(e, detail);
  const io::Manifest& m = *chain.front().manifest;
  const std::string& vdir = chain.front().path;
  for (const io::ChainLink& c : chain) {
    if (c.manifest->world_size != 1) {
      fail(EMBSTORE_UNSUPPORTED, "{} was written by {} ranks: resharding is not supported yet",
           c.path, c.manifest->world_size);
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
    // A backend that checks its input (the CUDA one refuses repeated keys) finds the file
    // inconsistent: corrupt.
    const io::RowSink load = [&](const io::RowBlock& b, std::string* why) {
      try {
        impl->load_rows(b.keys, b.values, b.state, b.rows, m.version);
      } catch (const Error& e) {
        if (e.status() != EMBSTORE_INVALID_ARGUMENT) throw;
        *why = e.what();
        return -EBADMSG;
      }
      return 0;
    };
    if (int e = io::read_chain_rows(chain, t, {}, load, &detail); e < 0) fail_chain(e, detail);
    // Every file checked out; the rows must also be the table's rows at that version.
    if (const uint64_t rows = impl->counters().rows; rows != t.table_rows) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}' has {} rows after loading, the manifest says {}", vdir,
           t.name, rows, t.table_rows);
    }
    load_admission(chain, t.name, *impl);
    loaded.push_back({existing, std::move(impl)});
  }
  std::map<std::string, std::vector<char>> attachments;
  for (const io::AttachmentEntry& a : m.attachments) {
    std::string data;
    if (int e = io::read_checked_file(vdir, a.file, &data, &detail); e < 0) fail_chain(e, detail);
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
  // Marks of the abandoned run would make the restored rows look idle since long ago.
  store_.idle_clock.clear();
  std::lock_guard lock(mutex_);
  restored_attachments_ = std::move(attachments);
  // The schedules go on from the restored step, and the next delta in dir follows it.
  policy_full_step_ = policy_incr_step_ = m.version;
  policy_full_time_ = policy_incr_time_ = std::chrono::steady_clock::now();
  policy_full_due_ = policy_incr_due_ = false;
  chain_ = Chain{true, dir, m.version, 0, 0, 0};
  for (const io::ChainLink& c : chain) {
    uint64_t bytes = 0;
    // Every file, as the checkpointer counts a version it writes.
    for (const io::TableEntry& t : c.manifest->tables) {
      for (const io::FileEntry& f : t.files) bytes += f.bytes;
      if (t.admission) bytes += t.admission->bytes;
    }
    for (const io::AttachmentEntry& a : c.manifest->attachments) bytes += a.file.bytes;
    if (c.manifest->full) {
      chain_.full_bytes = bytes;
    } else {
      chain_.delta_bytes += bytes;
      ++chain_.deltas;
    }
  }
  return m.version;
}

}  // namespace embstore::checkpoint
