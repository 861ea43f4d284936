// Restore (embstore_restore): plan the version (restore_plan.hpp, shared with embstore-ckpt),
// load every table into new table objects, and only when everything has loaded and checked,
// swap them into the store. Warm start (warm_start.cpp) plans otherwise and shares the rest
// (replace_tables).

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cuda/row/optimizer.h"
#include "cuda/row/shard.h"
#include "host/checkpoint/checkpointer.hpp"
#include "host/checkpoint/load_stages.hpp"
#include "host/checkpoint/restore_plan.hpp"
#include "host/checkpoint/routed_read.hpp"
#include "host/error.hpp"
#include "host/shard/agreement.hpp"
#include "io/format/chain.hpp"
#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"
#include "io/format/xxh3.hpp"

namespace embstore::checkpoint {
namespace {

// Memory a table of `rows` rows of stride floats takes on the host backend: the row, its
// metadata (key and step) and about two index slots.
constexpr uint64_t kRowOverheadBytes = 16 + 32;

// Whether the restore parks the tables it replaces (SpillMode): only host tables it replaces
// spill, and under kAuto only when the restored tables would not fit in the memory available
// beside them. The file when it does, else null. IO_ERROR when it must but cannot create one.
std::unique_ptr<SpillFile> open_spill_file(StoreView& store, const std::vector<TableLoad>& loads,
                                           const char* op) {
  const PipelineSettings settings = store.pipeline();
  if (settings.restore_spill == SpillMode::kNever) return nullptr;
  bool replaces = false;
  uint64_t needed = 0;
  for (const TableLoad& l : loads) {
    const Table* existing = store.find_table(l.table->entry->name);
    replaces = replaces || (existing != nullptr && existing->can_spill());
    // The table loaded has the existing one's configuration (with values only, maybe another
    // optimizer than the checkpoint's).
    const TableSpec& spec = existing != nullptr ? existing->spec() : l.table->spec;
    needed +=
        rows_to_reserve(*l.plan, *l.table) * (uint64_t{spec.stride()} * 4 + kRowOverheadBytes);
  }
  if (!replaces) return nullptr;
  const uint64_t available = available_memory_bytes();
  if (settings.restore_spill == SpillMode::kAuto && needed <= available) return nullptr;
  std::unique_ptr<SpillFile> file;
  const int r = SpillFile::open(settings.spill_dir, &file);
  if (r < 0 || file->in_memory()) {
    fail(EMBSTORE_IO_ERROR,
         "the {} must park the tables it replaces ({} MB to load, {} MB available), but "
         "cannot in '{}' (spill_dir): {}",
         op, needed >> 20, available == UINT64_MAX ? 0 : available >> 20, settings.spill_dir,
         r < 0 ? std::strerror(-r) : "it is in memory (tmpfs), where parking frees nothing");
  }
  return file;
}

// A failed restore's last stage: the parked tables read back. Allocates nothing (lost has room
// for every table), so it runs even when memory is what failed; returns the first failure to
// read back, with the tables it left in *lost.
std::exception_ptr unspill_all(const std::vector<Table*>& spilled, SpillFile* file,
                               std::vector<Table*>* lost) noexcept {
  std::exception_ptr first;
  for (Table* t : spilled) {
    try {
      t->unspill(*file);
    } catch (...) {
      if (!first) first = std::current_exception();
      lost->push_back(t);
    }
  }
  return first;
}

std::string what_of(const std::exception_ptr& e);

// In a handler of the restore's failure (the current exception): reads back the parked tables;
// when some could not be, IO_ERROR saying what failed and which tables lost their rows.
void read_back_parked(StoreView& store, const std::vector<Table*>& spilled, SpillFile* file,
                      std::vector<Table*>* lost, const char* op) {
  if (spilled.empty()) return;
  const std::exception_ptr why = unspill_all(spilled, file, lost);
  if (lost->empty()) return;
  // A lost table keeps its index over rows that now read as zeros: it is replaced by an empty
  // table of its configuration (the handle stays valid), never left half there.
  std::string names;
  std::vector<std::unique_ptr<Table>> empty;
  for (const Table* t : *lost) {
    names += (names.empty() ? "'" : ", '") + t->spec().name + "'";
    empty.push_back(store.make_table(t->spec()));
  }
  store.install(std::move(empty), store.step(), false);
  fail(EMBSTORE_IO_ERROR,
       "{} failed ({}), and reading table(s) {} back from its spill file failed ({}): "
       "their rows are lost from this store, and the tables are empty",
       op, what_of(std::current_exception()), names, what_of(why));
}

// The checks of every table a restore or warm start replaces (dim; the optimizer, unless it
// loads values only), made before any is parked or loaded. INVALID_ARGUMENT naming the table.
void check_replaced_tables(StoreView& store, const std::vector<TableLoad>& loads) {
  for (const TableLoad& l : loads) {
    const io::TableEntry& entry = *l.table->entry;
    const Table* existing = store.find_table(entry.name);
    if (existing == nullptr) continue;
    const TableSpec& spec = existing->spec();
    if (spec.dim != l.table->spec.dim) {
      fail(EMBSTORE_INVALID_ARGUMENT, "table '{}' has dim {}, the checkpoint {} has dim {}",
           entry.name, spec.dim, l.plan->path(), l.table->spec.dim);
    }
    if (!l.values_only && spec.opt.kind != l.table->spec.opt.kind) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "table '{}' uses optimizer {}, the checkpoint {} holds the state of {}", entry.name,
           io::optimizer_name(static_cast<int>(spec.opt.kind)), l.plan->path(),
           io::optimizer_name(static_cast<int>(l.table->spec.opt.kind)));
    }
  }
}

// A version's bytes: every file, as the checkpointer counts a version it writes.
uint64_t version_bytes(const io::Manifest& m) {
  uint64_t bytes = 0;
  for (const io::TableEntry& t : m.tables) {
    for (const io::FileEntry& f : t.files) bytes += f.bytes;
    for (const io::FileEntry& f : t.admission) bytes += f.bytes;
  }
  for (const io::AttachmentEntry& a : m.attachments) bytes += a.file.bytes;
  return bytes;
}

// What a restore or warm start loads, as one number every rank of a sharded store must share:
// every version it planned (tables loaded from it or not: its attachments count too), each
// table with the manifest it comes from and how, and the step the store goes on from.
uint64_t signature_of(const Replacement& r) {
  std::string bytes;
  const auto add = [&](uint64_t x) { bytes.append(reinterpret_cast<const char*>(&x), sizeof x); };
  add(r.step);
  for (const RestorePlan* p : r.plans) add(p->manifest().xxh3);
  for (const TableLoad& l : r.loads) {
    add(l.plan->manifest().xxh3);
    bytes += l.table->entry->name;
    bytes += l.values_only ? '\1' : '\0';
  }
  return io::xxh3_64(bytes.data(), bytes.size());
}

// A sharded store's restore or warm start, before any rank reads rows: every rank planned the
// same (signature_of), so that all make the same collective reads. Throws on every rank alike.
void agree_on_plan(shard::Communicator& comm, const shard::LocalCheck& local, const Replacement& r,
                   const char* op) {
  struct Planned {
    int32_t status = EMBSTORE_OK;
    uint32_t tables = 0;
    uint64_t signature = 0;
  } mine;
  mine.status = local.status;
  if (local.status == EMBSTORE_OK) {
    mine.tables = static_cast<uint32_t>(r.loads.size());
    mine.signature = signature_of(r);
  }
  std::vector<Planned> all(static_cast<size_t>(comm.size()));
  comm.all_gather(&mine, sizeof mine, all.data());
  std::vector<int32_t> statuses;
  for (const Planned& p : all) statuses.push_back(p.status);
  shard::raise_first_failure(statuses, comm.rank(), local,
                             fmt::format("to plan its part of the {}", op).c_str());
  for (size_t q = 0; q < all.size(); ++q) {
    if (all[q].tables != mine.tables || all[q].signature != mine.signature) {
      fail(EMBSTORE_CORRUPT,
           "rank {} planned other versions or tables than this rank ({} tables{}{}): every rank "
           "must load the same (was a version committed in between, or do the ranks pass "
           "different sources?)",
           q, r.loads.size(), r.plans.empty() ? "" : ", from ",
           r.plans.empty() ? "" : r.plans.front()->path());
    }
  }
}

// After the ranks loaded (and read what else `local` covers): the ranks' rows of each table add
// up to the table's rows at its version, each row loaded by exactly one rank. Throws on every
// rank alike.
void agree_on_rows(shard::Communicator& comm, const shard::LocalCheck& local, const Replacement& r,
                   const std::vector<std::unique_ptr<Table>>& loaded, const char* op) {
  shard::agree(comm, local, fmt::format("to load its part of the {}", op).c_str());
  const size_t world = static_cast<size_t>(comm.size());
  std::vector<uint64_t> rows(r.loads.size()), every(rows.size() * world);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = loaded[i]->counters().rows;
  comm.all_gather(rows.data(), rows.size() * sizeof(uint64_t), every.data());
  for (size_t i = 0; i < rows.size(); ++i) {
    uint64_t sum = 0;
    for (size_t q = 0; q < world; ++q) sum += every[q * rows.size() + i];
    const io::TableEntry& entry = *r.loads[i].table->entry;
    if (sum != entry.table_rows) {
      fail(EMBSTORE_CORRUPT,
           "{}: table '{}' has {} rows over the ranks after loading, the manifest says {}",
           r.loads[i].plan->path(), entry.name, sum, entry.table_rows);
    }
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

void Checkpointer::end_job_in_flight() {
  if (sharded()) {
    settle(true);
  } else {
    std::unique_lock lock(mutex_);
    wait_for_job(lock, false);
  }
}

uint64_t Checkpointer::restore(const std::string& dir, uint64_t version) {
  std::lock_guard op(op_mutex_);
  end_job_in_flight();
  LoadStages stages(sharded());

  // Stage 1: the version and its plan (manifests, links, configurations), as embstore-ckpt
  // verify checks them.
  io::CheckpointDir checkpoints;
  std::optional<RestorePlan> plan;
  Replacement r;
  stages.run([&] {
    std::vector<std::string> skipped;
    const size_t chosen = choose_version(dir, version, std::nullopt, &checkpoints, &skipped);
    for (const std::string& path : skipped) {
      std::fprintf(stderr, "embstore: restore skips '%s': it has no %s\n", path.c_str(),
                   io::kManifestName);
    }
    plan = plan_version(checkpoints, chosen);
    refuse_serving_only(*plan, "restore");
    r.plans.push_back(&*plan);
    for (const TablePlan& t : plan->tables) r.loads.push_back(TableLoad{&*plan, &t, false});
    r.step = plan->manifest().version;
  });

  // Stages 2 to 4 (replace_tables), with the version's attachments and what the checkpointer
  // keeps of the chain, read before the store changes.
  std::map<std::string, std::vector<char>> attachments;
  Chain chain;
  replace_tables(stages, r, [&] {
    const io::Manifest& m = plan->manifest();
    chain = Chain{true, dir, m.version, m.full, m.lineage, m.xxh3, 0, 0, 0};
    attachments = read_attachments(*plan, store_.rank());
    for (const io::ChainLink& c : plan->chain) {
      const uint64_t bytes = version_bytes(*c.manifest);
      if (c.manifest->full) {
        chain.full_bytes = bytes;
      } else {
        chain.delta_bytes += bytes;
        ++chain.deltas;
      }
    }
  });
  std::lock_guard lock(mutex_);
  restored_attachments_ = std::move(attachments);
  // The schedules go on from the restored step, and the next delta in dir follows it.
  schedule_.restart(chain.version);
  chain_ = std::move(chain);
  return chain_.version;
}

void Checkpointer::replace_tables(LoadStages& stages, const Replacement& r,
                                  const std::function<void()>& also) {
  // Stage 2: the checks of the tables replaced; a spill file, when the restore must park them;
  // room for every table before any is parked (reading them back must not allocate), and for
  // the tables loaded (so that nothing allocates between the collective parts of the loads).
  std::unique_ptr<SpillFile> spill_file;
  std::vector<Table*> spilled, lost;
  std::vector<std::unique_ptr<Table>> loaded;
  stages.run([&] {
    check_replaced_tables(store_, r.loads);
    spill_file = open_spill_file(store_, r.loads, r.op);
    spilled.reserve(r.loads.size());
    lost.reserve(r.loads.size());
    loaded.reserve(r.loads.size());
  });

  if (stages.collective()) agree_on_plan(*store_.comm(), stages.local(), r, r.op);

  // Stage 3: every table loaded aside; the store is not touched until all of it has checked.
  // Short of memory, each table replaced is parked in the spill file just before its
  // replacement loads, and read back if the restore fails.
  try {
    load_tables(r, spill_file.get(), &spilled, &loaded);
    stages.run(also);
    if (stages.collective()) agree_on_rows(*store_.comm(), stages.local(), r, loaded, r.op);
    // Stage 4: swap in. Only install's allocation can fail, before it replaces any table.
    store_.install(std::move(loaded), r.step, r.new_run);
  } catch (...) {
    loaded.clear();  // their memory first
    read_back_parked(store_, spilled, spill_file.get(), &lost, r.op);
    throw;
  }
}

namespace {

// A new row's optimizer state, for tables loaded without theirs (values only).
std::vector<float> new_row_state(const TableSpec& spec) {
  std::vector<float> state(spec.state_dim());
  if (!state.empty()) row::init_state(spec.opt, spec.dim, state.data());
  return state;
}

}  // namespace

void Checkpointer::load_tables(const Replacement& r, SpillFile* spill_file,
                               std::vector<Table*>* spilled,
                               std::vector<std::unique_ptr<Table>>* loaded) {
  const uint32_t rank = store_.rank(), world = store_.world_size();
  // On a sharded store the ranks agree after each part of each table, so that all go on to the
  // next collective read or all stop (throwing alike); alone, a part throws. Between parts
  // nothing allocates, so nothing can fail on one rank alone.
  const auto part = [&](const char* what, auto&& stage) {
    if (world == 1) {
      stage();
    } else {
      shard::agree(*store_.comm(), shard::run_stage(stage), what);
    }
  };
  for (const TableLoad& l : r.loads) {
    const RestorePlan& plan = *l.plan;
    const TablePlan& t = *l.table;
    const std::string& name = t.entry->name;
    Table* existing = store_.find_table(name);
    std::vector<float> fresh_state;
    std::unique_ptr<Table> impl;
    io::ChainReadOptions options;
    io::RowSink load;
    std::vector<int64_t> keys;
    std::vector<float> values, state;
    part("to prepare its part of the tables", [&] {
      // An existing table keeps its own configuration (checked by check_replaced_tables).
      TableSpec spec = existing != nullptr ? existing->spec() : t.spec;
      // Built once, at its final size: no growth or rehash while it loads (a rank of several
      // holds about its share of the rows).
      const uint64_t all_rows = rows_to_reserve(plan, t);
      const uint64_t rows =
          world == 1 ? all_rows : all_rows / world + all_rows / (4 * world) + 1024;
      // A new table's initial_capacity comes from the manifest, which the files must back: it
      // is at most what it loads, so that a forged one cannot make the table allocate (and, on
      // the host, zero an index for) billions of rows it will never hold.
      if (existing == nullptr) {
        spec.initial_capacity = std::min(spec.initial_capacity, std::max<uint64_t>(rows, 1024));
      }
      // Values only: each row's state is a new row's, of the loading table's optimizer.
      if (l.values_only) fresh_state = new_row_state(spec);
      if (spill_file != nullptr && existing != nullptr && existing->can_spill()) {
        spilled->push_back(
            existing);  // first (room was made): unspill after a failed spill is a no-op
        existing->spill(*spill_file);
      }
      impl = store_.make_table(std::move(spec));
      impl->reserve(rows);
      // Newest version first. A table that knows its keys (both backends) skips the older rows
      // of a key itself; otherwise the chain reader drops them, with a set of every key.
      options.sink_skips_held = impl->skips_held_keys();
      options.check_behind = true;  // the table is aside: a failure drops it
      if (world > 1) {
        // A version of this world size: this rank's keys are all in its own shard's files.
        options.skip_file = [&](const io::Manifest& v, const io::TableEntry& e,
                                const io::FileEntry& f) {
          return v.world_size == world &&
                 f.path != io::row_file_path(v.format_version, e.name, rank, world);
        };
      }
      // A backend that checks its input (without skipping, the CUDA one refuses repeated keys)
      // finds the file inconsistent: corrupt.
      // Rows go to the table as they come, unless this rank keeps only the rows of the keys it
      // owns, or they take new state: then they are gathered first.
      const bool gather = world > 1 || l.values_only;
      load = [&, gather](const io::RowBlock& b, std::string* why) {
        try {
          if (!gather) {
            impl->load_rows(b.keys, b.values, b.state, b.rows, r.step, options.sink_skips_held);
            return 0;
          }
          keys.clear();
          values.clear();
          state.clear();
          for (uint32_t i = 0; i < b.rows; ++i) {
            if (world > 1 && row::shard_of(b.keys[i], world) != rank) continue;
            keys.push_back(b.keys[i]);
            values.insert(values.end(), b.values + size_t{i} * b.dim,
                          b.values + size_t{i + 1} * b.dim);
            if (l.values_only) {
              state.insert(state.end(), fresh_state.begin(), fresh_state.end());
            } else if (b.state_dim > 0) {
              state.insert(state.end(), b.state + size_t{i} * b.state_dim,
                           b.state + size_t{i + 1} * b.state_dim);
            }
          }
          if (!keys.empty()) {
            impl->load_rows(keys.data(), values.data(), state.empty() ? nullptr : state.data(),
                            keys.size(), r.step, options.sink_skips_held);
          }
        } catch (const Error& e) {
          if (e.status() != EMBSTORE_INVALID_ARGUMENT) throw;
          *why = e.what();
          return -EBADMSG;
        }
        return 0;
      };
    });
    // Values only: the counts stay behind with the optimizer state.
    const auto load_counts = [&] {
      const std::optional<io::AdmissionFile> counts =
          l.values_only ? std::nullopt : read_admission(plan, t, rank, world);
      std::string why;
      if (counts && !impl->load_admission(*counts, &why)) {
        std::fprintf(stderr, "embstore: %s leaves the admission counts of table '%s' in %s: %s\n",
                     r.op, name.c_str(), plan.path().c_str(), why.c_str());
      }
    };
    if (world > 1 && needs_routing(plan, t, world)) {
      // Another world size wrote some version: each rank reads a share of the files once and
      // routes every row to its owner (routed_read.hpp). A rank stopped by another's failure
      // goes straight to the agreement, which fails every rank with that one's status.
      bool stopped = false;
      shard::LocalCheck read =
          read_table_routed(*store_.comm(), plan, t, options, load, kRoutedRoundBytes, &stopped);
      if (read.status == EMBSTORE_OK && !stopped) read = shard::run_stage(load_counts);
      shard::agree(*store_.comm(), read, "to read its share of the rows");
    } else {
      // A rank's share cannot be checked alone: agree_on_rows adds the ranks' rows up.
      part("to load its part of the tables", [&] {
        read_table(plan, t, options, load,
                   world == 1 ? std::function<uint64_t()>([&] { return impl->counters().rows; })
                              : std::function<uint64_t()>());
        load_counts();
      });
    }
    loaded->push_back(std::move(impl));
  }
}

}  // namespace embstore::checkpoint
