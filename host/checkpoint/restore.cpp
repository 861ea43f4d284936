// Restore (embstore_restore): plan the version (restore_plan.hpp, shared with embstore-ckpt),
// load every table into new table objects, and only when everything has loaded and checked,
// swap them into the store.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
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
namespace {

// Memory a table of `rows` rows of stride floats takes on the host backend: the row, its
// metadata (key and step) and about two index slots.
constexpr uint64_t kRowOverheadBytes = 16 + 32;

// Whether the restore parks the tables it replaces (SpillMode): only host tables it replaces
// spill, and under kAuto only when the restored tables would not fit in the memory available
// beside them. The file when it does, else null. IO_ERROR when it must but cannot create one.
std::unique_ptr<SpillFile> open_spill_file(StoreView& store, const RestorePlan& plan) {
  const PipelineSettings settings = store.pipeline();
  if (settings.restore_spill == SpillMode::kNever) return nullptr;
  bool replaces = false;
  uint64_t needed = 0;
  for (const TablePlan& t : plan.tables) {
    const Table* existing = store.find_table(t.entry->name);
    replaces = replaces || (existing != nullptr && existing->can_spill());
    needed += rows_to_reserve(plan, t) * (uint64_t{t.spec.stride()} * 4 + kRowOverheadBytes);
  }
  if (!replaces) return nullptr;
  const uint64_t available = available_memory_bytes();
  if (settings.restore_spill == SpillMode::kAuto && needed <= available) return nullptr;
  std::unique_ptr<SpillFile> file;
  if (const int r = SpillFile::open(settings.spill_dir, &file); r < 0) {
    fail(EMBSTORE_IO_ERROR,
         "the restore must park the tables it replaces ({} MB to load, {} MB available), but "
         "cannot create a spill file in '{}' (spill_dir): {}",
         needed >> 20, available == UINT64_MAX ? 0 : available >> 20, settings.spill_dir,
         std::strerror(-r));
  }
  return file;
}

// A failed restore's last stage: the parked tables read back. Their rows are lost only when
// the spill file cannot be read: then the error says so, and which tables.
void unspill_all(const std::vector<Table*>& spilled, SpillFile* file, const std::string& cause) {
  std::string lost, why;
  for (Table* t : spilled) {
    try {
      t->unspill(*file);
    } catch (const Error& e) {
      lost += (lost.empty() ? "'" : ", '") + t->spec().name + "'";
      if (why.empty()) why = e.what();
    }
  }
  if (!lost.empty()) {
    fail(EMBSTORE_IO_ERROR,
         "restore failed ({}), and reading table(s) {} back from its spill file failed ({}): "
         "their rows are lost from this store",
         cause, lost, why);
  }
}

std::string what_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown exception";
  }
}

}  // namespace

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

  // Stage 2: every table loaded aside; the store is not touched until all of it has checked.
  // Short of memory, each table the restore replaces is parked in a spill file just before its
  // replacement loads, and read back if the restore fails.
  const std::unique_ptr<SpillFile> spill_file = open_spill_file(store_, plan);
  std::vector<Table*> spilled;
  std::vector<std::unique_ptr<Table>> loaded;
  std::map<std::string, std::vector<char>> attachments;
  try {
    load_tables(plan, spill_file.get(), &spilled, &loaded);
    attachments = read_attachments(plan);
  } catch (...) {
    loaded.clear();  // their memory first
    if (!spilled.empty()) unspill_all(spilled, spill_file.get(), what_of(std::current_exception()));
    throw;
  }

  // Stage 3: swap in. Nothing below fails but allocation, and install allocates before it
  // replaces any table.
  try {
    store_.install(std::move(loaded), m.version);
  } catch (...) {
    if (!spilled.empty()) unspill_all(spilled, spill_file.get(), what_of(std::current_exception()));
    throw;
  }
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

// Stage 2's loop: each table of the plan loaded aside into *loaded, in plan order; with a spill
// file, the store's table it replaces is parked first (and added to *spilled).
void Checkpointer::load_tables(const RestorePlan& plan, SpillFile* spill_file,
                               std::vector<Table*>* spilled,
                               std::vector<std::unique_ptr<Table>>* loaded) {
  const io::Manifest& m = plan.manifest();
  const std::string& vdir = plan.path();
  for (const TablePlan& t : plan.tables) {
    const std::string& name = t.entry->name;
    Table* existing = store_.find_table(name);
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
    if (spill_file != nullptr && existing != nullptr && existing->can_spill()) {
      existing->spill(*spill_file);
      spilled->push_back(existing);
    }
    std::unique_ptr<Table> impl = store_.make_table(std::move(spec));
    // Built once, at its final size: no growth or rehash while it loads.
    impl->reserve(rows_to_reserve(plan, t));
    // Newest version first. A table that knows its keys (both backends) skips the older rows of
    // a key itself; otherwise the chain reader drops them, with a set of every key.
    io::ChainReadOptions options;
    options.sink_skips_held = impl->skips_held_keys();
    options.check_behind = true;  // the table is aside: a failure drops it
    // A backend that checks its input (without skipping, the CUDA one refuses repeated keys)
    // finds the file inconsistent: corrupt.
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
    loaded->push_back(std::move(impl));
  }
}

}  // namespace embstore::checkpoint
