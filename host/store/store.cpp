#include "host/store/store.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/table/stacked_table.hpp"
#include "io/engine/engine.hpp"
#include "io/format/manifest.hpp"

using embstore::fail;
namespace io = embstore::io;

embstore::TableCalls::Scope::Scope(TableCalls& calls) : calls_(calls) {
  calls_.in_flight_.fetch_add(1);
  if (calls_.replacing_.load()) {
    calls_.in_flight_.fetch_sub(1);
    fail(EMBSTORE_BUSY,
         "the store's tables are being replaced (embstore_restore or embstore_warm_start on "
         "another thread): call again once it has returned");
  }
}

embstore::TableCalls::Replacement::Replacement(TableCalls& calls, bool wait) : calls_(calls) {
  bool expected = false;
  if (!calls_.replacing_.compare_exchange_strong(expected, true)) {
    fail(EMBSTORE_BUSY, "another restore or warm start of this store is running");
  }
  for (uint64_t n; (n = calls_.in_flight_.load()) != 0;) {
    if (!wait) {
      calls_.replacing_.store(false);
      fail(EMBSTORE_BUSY,
           "{} call(s) on the store's tables are running on other threads: a restore or warm "
           "start would replace the tables under them",
           n);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

embstore_store::embstore_store(const embstore_store_config_t& c) {
  if (c.struct_size < sizeof(embstore_store_config_t)) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "store config struct_size is {}, expected {}: fill it with embstore_store_config_init",
         c.struct_size, sizeof(embstore_store_config_t));
  }
  if (c.host_threads < 0 ||
      static_cast<unsigned>(c.host_threads) > embstore::ThreadPool::max_threads()) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "host_threads must be 0 (one per core) to {} (4 per core, at least 16), is {}",
         embstore::ThreadPool::max_threads(), c.host_threads);
  }
  if (c.io_queue_depth < 1 || static_cast<unsigned>(c.io_queue_depth) > io::kMaxQueueDepth) {
    fail(EMBSTORE_INVALID_ARGUMENT, "io_queue_depth must be 1..{}, is {}", io::kMaxQueueDepth,
         c.io_queue_depth);
  }
  if (c.world_size < 1 || c.rank < 0 || c.rank >= c.world_size) {
    fail(EMBSTORE_INVALID_ARGUMENT, "rank {} is not in a world of size {}", c.rank, c.world_size);
  }
  if (static_cast<uint32_t>(c.world_size) > embstore::io::kMaxWorldSize) {
    fail(EMBSTORE_INVALID_ARGUMENT, "world_size {} is above {}", c.world_size,
         embstore::io::kMaxWorldSize);
  }
  if (c.world_size > 1 && (c.mpi_comm == nullptr) == (c.comm_callbacks == nullptr)) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "world_size {} needs exactly one communicator: mpi_comm or comm_callbacks ({} given)",
         c.world_size, c.mpi_comm == nullptr ? "neither" : "both");
  }
  // A chunk of the staging ring must hold the widest row (dim 4096 with Adam: 48 KiB), and the
  // ring several chunks.
  if (c.staging_bytes < (size_t{1} << 20)) {
    fail(EMBSTORE_INVALID_ARGUMENT, "staging_bytes must be >= 1 MiB, is {}", c.staging_bytes);
  }
  staging_bytes = c.staging_bytes;
  switch (embstore::enum_value(c.restore_spill)) {
    case EMBSTORE_SPILL_AUTO:
      restore_spill = embstore::checkpoint::SpillMode::kAuto;
      break;
    case EMBSTORE_SPILL_NEVER:
      restore_spill = embstore::checkpoint::SpillMode::kNever;
      break;
    case EMBSTORE_SPILL_ALWAYS:
      restore_spill = embstore::checkpoint::SpillMode::kAlways;
      break;
    default:
      fail(EMBSTORE_INVALID_ARGUMENT, "unknown restore_spill {}",
           embstore::enum_value(c.restore_spill));
  }
  spill_dir = c.spill_dir != nullptr ? c.spill_dir : "/var/tmp";
  if (c.tier_dir != nullptr) {
    if (c.tier_dir[0] == '\0') fail(EMBSTORE_INVALID_ARGUMENT, "tier_dir is empty");
    tier_dir = c.tier_dir;
  }
  io_queue_depth = static_cast<unsigned>(c.io_queue_depth);
  if (c.device < 0) fail(EMBSTORE_INVALID_ARGUMENT, "device must be >= 0, is {}", c.device);
  device = c.device;
  switch (embstore::enum_value(c.backend)) {
    case EMBSTORE_BACKEND_AUTO:
      // A sharded store picks by what the trainer passed, on every rank alike (a rank that saw
      // a device where another did not would otherwise fail while the others wait in the
      // communicator's duplication): CUDA with an NCCL communicator, else the host.
      if (c.world_size > 1) {
        backend = c.nccl_comm != nullptr ? EMBSTORE_BACKEND_CUDA : EMBSTORE_BACKEND_HOST;
      } else {
        backend = embstore::cuda_device_usable(c.device, nullptr) ? EMBSTORE_BACKEND_CUDA
                                                                  : EMBSTORE_BACKEND_HOST;
      }
      if (backend == EMBSTORE_BACKEND_CUDA && c.world_size > 1) {
        std::string why;
        if (!embstore::cuda_device_usable(c.device, &why)) {
          fail(EMBSTORE_UNSUPPORTED, "nccl_comm given, but the CUDA backend is unavailable: {}",
               why);
        }
      }
      break;
    case EMBSTORE_BACKEND_HOST:
      backend = EMBSTORE_BACKEND_HOST;
      break;
    case EMBSTORE_BACKEND_CUDA: {
      std::string why;
      if (!embstore::cuda_device_usable(c.device, &why)) {
        fail(EMBSTORE_UNSUPPORTED, "CUDA backend unavailable: {}", why);
      }
      backend = EMBSTORE_BACKEND_CUDA;
      break;
    }
    default:
      fail(EMBSTORE_INVALID_ARGUMENT, "unknown backend {}", embstore::enum_value(c.backend));
  }
  if (c.world_size > 1 && backend == EMBSTORE_BACKEND_CUDA) {
    if (!embstore::nccl_built()) {
      fail(EMBSTORE_UNSUPPORTED,
           "a sharded store (world_size {}) on the CUDA backend needs a build with NCCL: ask "
           "for EMBSTORE_BACKEND_HOST",
           c.world_size);
    }
    if (c.nccl_comm == nullptr) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "a sharded store (world_size {}) on the CUDA backend needs nccl_comm (its data "
           "path), besides mpi_comm or comm_callbacks",
           c.world_size);
    }
  }
  rank = c.rank;
  world_size = c.world_size;
  if (world_size > 1) {
    // Last of the checks: duplicating a communicator is collective.
    comm = c.mpi_comm != nullptr
               ? embstore::shard::make_mpi_communicator(c.mpi_comm, rank, world_size)
               : embstore::shard::make_callback_communicator(*c.comm_callbacks, rank, world_size);
    if (backend == EMBSTORE_BACKEND_CUDA) {
      device_exchange = embstore::make_nccl_exchange(c.nccl_comm, rank, world_size, device);
    }
  }
  // A CUDA store's tables with memory_rows have a host table below them (make_stacked_table).
  if (backend == EMBSTORE_BACKEND_HOST || !tier_dir.empty()) {
    pool = std::make_unique<embstore::ThreadPool>(static_cast<unsigned>(c.host_threads));
  }
  checkpointer = std::make_unique<embstore::checkpoint::Checkpointer>(checkpoint_view_);
}

embstore_store::~embstore_store() { checkpointer.reset(); }

std::unique_ptr<embstore::Table> embstore_store::make_table_impl(embstore::TableSpec spec) {
  // A user's table gets the store's tier_dir here; one a restore builds keeps the existing
  // table's spec (and so its budgets and directory) or has no budgets (a manifest's).
  if (spec.tier_dir.empty()) spec.tier_dir = tier_dir;
  if (spec.tiered() && spec.tier_dir.empty()) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "table '{}': memory_rows is {} but the store has no tier_dir for the rows beyond it",
         spec.name, spec.memory_rows);
  }
  if (spec.tiered() && (backend == EMBSTORE_BACKEND_CUDA || stacks_host_tiers())) {
    return make_stacked_table(std::move(spec));
  }
  return backend == EMBSTORE_BACKEND_CUDA ? embstore::make_cuda_table(std::move(spec), device)
                                          : embstore::make_host_table(std::move(spec), *pool);
}

// A table with memory_rows on the CUDA backend: a stack (host/table/stacked_table.hpp) of the CUDA
// table (its device_rows on the device, the rest of its share in mapped host memory) over a host
// table with its own SSD tier. On the host backend, for the tests only (stacks_host_tiers): two
// host tables, the upper one untiered.
std::unique_ptr<embstore::Table> embstore_store::make_stacked_table(embstore::TableSpec spec) {
  embstore::StackSpecs specs = embstore::stack_specs(spec);
  std::unique_ptr<embstore::Table> upper;
  embstore::StackedTable::KeysToHost keys_to_host;
  if (backend == EMBSTORE_BACKEND_CUDA) {
    upper = embstore::make_cuda_table(std::move(specs.upper), device);
    keys_to_host = [device = device](const int64_t* keys, size_t n, void* stream,
                                     std::vector<int64_t>* out) {
      *out = embstore::copy_keys_to_host(keys, n, device, stream);
    };
  } else {
    upper = embstore::make_host_table(std::move(specs.upper), *pool);
    keys_to_host = [](const int64_t* keys, size_t n, void*, std::vector<int64_t>* out) {
      out->assign(keys, keys + n);
    };
  }
  std::unique_ptr<embstore::Table> lower = embstore::make_host_table(std::move(specs.lower), *pool);
  return std::make_unique<embstore::StackedTable>(std::move(spec), std::move(upper),
                                                  std::move(lower), specs.upper_rows,
                                                  std::move(keys_to_host));
}

// Tests only: the host backend's tiered tables built as a stack of two host tables (as the CUDA
// backend's are), so that the tier tests exercise the stack where no GPU is.
bool embstore_store::stacks_host_tiers() {
  const char* v = std::getenv("EMBSTORE_TEST_STACKED_TIERS");
  return v != nullptr && v[0] == '1';
}

embstore_table* embstore_store::create_table(const embstore_table_config_t& config) {
  embstore::TableSpec spec = embstore::make_table_spec(config);
  if (find_table(spec.name.c_str()) != nullptr) {
    fail(EMBSTORE_ALREADY_EXISTS, "a table named '{}' exists", spec.name);
  }
  std::unique_ptr<embstore::Table> table = make_table_impl(std::move(spec));
  table->prefault_initial_capacity();
  return adopt_table(std::move(table));
}

void embstore_store::forget_table(const std::string& name) noexcept {
  std::lock_guard lock(mutex_);
  tables_.erase(name);
}

embstore_table* embstore_store::adopt_table(std::unique_ptr<embstore::Table> impl) {
  std::lock_guard lock(mutex_);
  const std::string& name = impl->spec().name;
  if (tables_.count(name) != 0) fail(EMBSTORE_ALREADY_EXISTS, "a table named '{}' exists", name);
  auto table = std::make_unique<embstore_table>();
  table->store = this;
  table->impl = std::move(impl);
  table->dim = table->impl->spec().dim;
  table->idle_pass_time = idle_clock.now();
  embstore_table* handle = table.get();
  tables_.emplace(handle->impl->spec().name, std::move(table));
  return handle;
}

std::vector<embstore_table*> embstore_store::tables() {
  std::lock_guard lock(mutex_);
  std::vector<embstore_table*> out;
  out.reserve(tables_.size());
  for (auto& [name, table] : tables_) out.push_back(table.get());
  return out;
}

embstore_table* embstore_store::find_table(const char* name) {
  std::lock_guard lock(mutex_);
  auto it = tables_.find(std::string_view(name));
  return it == tables_.end() ? nullptr : it->second.get();
}

uint64_t embstore_store::on_step(uint64_t previous, uint64_t step) {
  const std::vector<embstore_table*> all = tables();
  double resolution = 0, horizon = 0;
  for (embstore_table* t : all) {
    const double seconds = t->impl->spec().evict_idle_seconds;
    if (seconds == 0) continue;
    resolution = resolution == 0 ? seconds / 64 : std::min(resolution, seconds / 64);
    horizon = std::max(horizon, seconds);
  }
  const double now = idle_clock.now();
  if (horizon > 0) idle_clock.mark(step, now, resolution, horizon);
  uint64_t evicted = 0;
  for (embstore_table* t : all) {
    const embstore::TableSpec& spec = t->impl->spec();
    if (!spec.idle_rules() ||
        !embstore::idle_pass_due(spec, previous, step, now, t->idle_pass_time)) {
      continue;
    }
    t->idle_pass_time = now;
    evicted += run_idle_rules(t, step, now);
  }
  return evicted;
}

uint64_t embstore_store::evict_idle(embstore_table* table) {
  if (!table->impl->spec().idle_rules()) return 0;
  return run_idle_rules(table, step.load(std::memory_order_relaxed), idle_clock.now());
}

uint64_t embstore_store::run_idle_rules(embstore_table* table, uint64_t step, double now) {
  const uint64_t cutoff = embstore::idle_cutoff(table->impl->spec(), step, now, idle_clock);
  return cutoff > 0 ? table->impl->evict_before(cutoff) : 0;
}

// ------------------------------------------------------------------- the checkpointer's view --

std::vector<embstore::Table*> embstore_store::CheckpointView::tables() {
  std::vector<embstore::Table*> out;
  for (embstore_table* t : store_.tables()) out.push_back(t->impl.get());
  return out;
}

uint64_t embstore_store::CheckpointView::step() const {
  return store_.step.load(std::memory_order_relaxed);
}

embstore::checkpoint::PipelineSettings embstore_store::CheckpointView::pipeline() const {
  return {store_.staging_bytes, store_.io_queue_depth,
          store_.backend == EMBSTORE_BACKEND_CUDA ? store_.device : -1, store_.restore_spill,
          store_.spill_dir};
}

embstore::Table* embstore_store::CheckpointView::find_table(const std::string& name) {
  embstore_table* t = store_.find_table(name.c_str());
  return t != nullptr ? t->impl.get() : nullptr;
}

std::unique_ptr<embstore::Table> embstore_store::CheckpointView::make_table(
    embstore::TableSpec spec) {
  return store_.make_table_impl(std::move(spec));
}

void embstore_store::CheckpointView::install(std::vector<std::unique_ptr<embstore::Table>> tables,
                                             uint64_t step, bool new_run) {
  // New tables first: adopting one is the only step that allocates, so a failure there comes
  // before any table of the store is replaced (restore then reads back what it parked).
  std::vector<std::string> adopted;
  adopted.reserve(tables.size());
  try {
    for (std::unique_ptr<embstore::Table>& impl : tables) {
      if (store_.find_table(impl->spec().name.c_str()) == nullptr) {
        adopted.push_back(impl->spec().name);
        store_.adopt_table(std::move(impl));
      }
    }
  } catch (...) {
    for (const std::string& name : adopted) store_.forget_table(name);  // the store as it was
    throw;
  }
  for (std::unique_ptr<embstore::Table>& impl : tables) {
    if (impl == nullptr) continue;                                         // adopted
    store_.find_table(impl->spec().name.c_str())->impl = std::move(impl);  // the handle stays
  }
  store_.step.store(step, std::memory_order_relaxed);
  // Marks of the abandoned run would make the restored rows look idle since long ago. A warm
  // start keeps the step, so its marks stay true.
  if (new_run) store_.idle_clock.clear();
}
