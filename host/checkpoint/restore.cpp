// Restore (embstore_restore): plan the version (restore_plan.hpp, shared with embstore-ckpt),
// load every table into new table objects, and only when everything has loaded and checked,
// swap them into the store.
#include <cerrno>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "host/checkpoint/checkpointer.hpp"
#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "io/format/chain.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"

namespace embstore::checkpoint {

uint64_t Checkpointer::restore(const std::string& dir, uint64_t version) {
  std::lock_guard op(op_mutex_);
  {
    std::unique_lock lock(mutex_);
    wait_for_job(lock, false);
  }
  // Stage 1: the version and its plan (manifests, links, configurations), as embstore-ckpt
  // verify checks them.
  io::CheckpointDir checkpoints;
  std::vector<std::string> skipped;
  const size_t chosen = choose_version(dir, version, std::nullopt, &checkpoints, &skipped);
  for (const std::string& path : skipped) {
    std::fprintf(stderr, "embstore: restore skips '%s': it has no %s\n", path.c_str(),
                 io::kManifestName);
  }
  const RestorePlan plan = plan_version(checkpoints, chosen);
  const io::Manifest& m = plan.manifest();
  const std::string& vdir = plan.path();

  // Stage 2: every table loaded aside; the store is not touched until all of it has checked.
  std::vector<std::unique_ptr<Table>> loaded;
  for (const TablePlan& t : plan.tables) {
    const std::string& name = t.entry->name;
    const Table* existing = store_.find_table(name);
    TableSpec spec = t.spec;
    if (existing != nullptr) {
      spec = existing->spec();
      if (spec.dim != t.spec.dim) {
        fail(EMBSTORE_INVALID_ARGUMENT, "table '{}' has dim {}, the checkpoint {} has dim {}", name,
             spec.dim, vdir, t.spec.dim);
      }
      if (spec.opt.kind != t.spec.opt.kind) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "table '{}' uses optimizer {}, the checkpoint {} holds the state of {}", name,
             io::optimizer_name(static_cast<int>(spec.opt.kind)), vdir,
             io::optimizer_name(static_cast<int>(t.spec.opt.kind)));
      }
    }
    std::unique_ptr<Table> impl = store_.make_table(std::move(spec));
    // Built once, at its final size: no growth or rehash while it loads.
    impl->reserve(rows_to_reserve(plan, t));
    // Newest version first. A table that knows its keys skips the older rows of a key itself;
    // otherwise the chain reader drops them, with a set of every key.
    io::ChainReadOptions options;
    options.sink_skips_held = impl->skips_held_keys();
    options.check_behind = true;  // the table is aside: a failure drops it
    // A backend that checks its input (the CUDA one refuses repeated keys) finds the file
    // inconsistent: corrupt.
    const io::RowSink load = [&](const io::RowBlock& b, std::string* why) {
      try {
        impl->load_rows(b.keys, b.values, b.state, b.rows, m.version, options.sink_skips_held);
      } catch (const Error& e) {
        if (e.status() != EMBSTORE_INVALID_ARGUMENT) throw;
        *why = e.what();
        return -EBADMSG;
      }
      return 0;
    };
    read_table(plan, t, options, load, [&] { return impl->counters().rows; });
    if (const std::optional<io::AdmissionFile> counts = read_admission(plan, t)) {
      std::string why;
      if (!impl->load_admission(*counts, &why)) {
        std::fprintf(stderr,
                     "embstore: restore leaves the admission counts of table '%s' in %s: %s\n",
                     name.c_str(), vdir.c_str(), why.c_str());
      }
    }
    loaded.push_back(std::move(impl));
  }
  std::map<std::string, std::vector<char>> attachments = read_attachments(plan);

  // Stage 3: swap in. Nothing below fails but allocation.
  store_.install(std::move(loaded), m.version);
  std::lock_guard lock(mutex_);
  restored_attachments_ = std::move(attachments);
  // The schedules go on from the restored step, and the next delta in dir follows it.
  schedule_.restart(m.version);
  chain_ = Chain{true, dir, m.version, m.full, m.lineage, m.xxh3, 0, 0, 0};
  for (const io::ChainLink& c : plan.chain) {
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
