// The C API: argument checks, then the store and its tables. Every function catches
// everything; errors become a status plus this thread's last_error message.
#include <embstore/embstore.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "cuda/row/shard.h"
#include "host/backend/backends.hpp"
#include "host/error.hpp"
#include "host/serving/follower.hpp"
#include "host/shard/sharded_calls.hpp"
#include "host/store/store.hpp"

using embstore::fail;

namespace {

thread_local std::string t_last_error;

embstore_status_t record(embstore_status_t status, const char* function, const char* message) {
  try {
    t_last_error = std::string(function) + ": " + message;
  } catch (...) {
    // No memory for the message: keep the status.
  }
  return status;
}

template <typename F>
embstore_status_t guarded(const char* function, F&& body) noexcept {
  try {
    body();
    return EMBSTORE_OK;
  } catch (const embstore::Error& e) {
    return record(e.status(), function, e.what());
  } catch (const std::bad_alloc&) {
    return record(EMBSTORE_OUT_OF_MEMORY, function, "host memory allocation failed");
  } catch (const std::exception& e) {
    return record(EMBSTORE_INTERNAL, function, e.what());
  } catch (...) {
    return record(EMBSTORE_INTERNAL, function, "unknown exception");
  }
}

template <typename T>
void require(const T* pointer, const char* what) {
  if (pointer == nullptr) fail(EMBSTORE_INVALID_ARGUMENT, "{} is NULL", what);
}

// Positions inside a batch are 32-bit in both backends.
void check_batch(size_t n) {
  if (n > std::numeric_limits<uint32_t>::max()) {
    fail(EMBSTORE_INVALID_ARGUMENT, "batch of {} keys: at most {} per call", n,
         std::numeric_limits<uint32_t>::max());
  }
}

// A checkpoint's outcome, reported like any other failure of the call.
void raise(embstore_status_t status, std::string message) {
  if (status != EMBSTORE_OK) throw embstore::Error(status, std::move(message));
}

// The plain data path on a sharded store acts on the rank's own shard: keys of other ranks are
// refused before anything is read or changed.
// On CUDA the keys are device memory: they are copied to the host for the check (the call then
// waits for the stream's earlier work).
void check_own_shard(const embstore_store& store, const int64_t* keys, size_t n, void* stream) {
  if (store.world_size == 1) return;
  std::vector<int64_t> on_host;
  if (store.backend == EMBSTORE_BACKEND_CUDA) {
    on_host = embstore::copy_keys_to_host(keys, n, store.device, stream);
    keys = on_host.data();
  }
  embstore::shard::check_owned(keys, n, static_cast<uint32_t>(store.rank),
                               static_cast<uint32_t>(store.world_size));
}

// A sharded store's collective calls, one at a time per store: another thread's sharded call or
// checkpoint call must not interleave its messages with theirs on the store's communicator.
std::unique_lock<std::mutex> collective_section(embstore_store* store) {
  if (store->world_size == 1) return {};
  return std::unique_lock<std::mutex>(store->comm_mutex);
}

}  // namespace

struct embstore_follower {
  std::unique_ptr<embstore::serving::Follower> impl;
  // CUDA: lookups take device pointers of `device` (the rows stay in host memory).
  bool cuda = false;
  int device = 0;
};

extern "C" {

int embstore_version(void) { return EMBSTORE_VERSION_CODE; }

const char* embstore_status_name(embstore_status_t s) {
  switch (s) {
    case EMBSTORE_OK:
      return "EMBSTORE_OK";
    case EMBSTORE_INVALID_ARGUMENT:
      return "EMBSTORE_INVALID_ARGUMENT";
    case EMBSTORE_NOT_FOUND:
      return "EMBSTORE_NOT_FOUND";
    case EMBSTORE_ALREADY_EXISTS:
      return "EMBSTORE_ALREADY_EXISTS";
    case EMBSTORE_OUT_OF_MEMORY:
      return "EMBSTORE_OUT_OF_MEMORY";
    case EMBSTORE_CAPACITY_EXCEEDED:
      return "EMBSTORE_CAPACITY_EXCEEDED";
    case EMBSTORE_IO_ERROR:
      return "EMBSTORE_IO_ERROR";
    case EMBSTORE_CORRUPT:
      return "EMBSTORE_CORRUPT";
    case EMBSTORE_UNSUPPORTED:
      return "EMBSTORE_UNSUPPORTED";
    case EMBSTORE_BUSY:
      return "EMBSTORE_BUSY";
    case EMBSTORE_DEVICE_ERROR:
      return "EMBSTORE_DEVICE_ERROR";
    case EMBSTORE_INTERNAL:
      return "EMBSTORE_INTERNAL";
    case EMBSTORE_COMM_ERROR:
      return "EMBSTORE_COMM_ERROR";
  }
  return "EMBSTORE_UNKNOWN_STATUS";
}

const char* embstore_last_error(void) { return t_last_error.c_str(); }

void embstore_store_config_init(embstore_store_config_t* c) {
  if (c == nullptr) return;
  std::memset(c, 0, sizeof(*c));
  c->struct_size = sizeof(*c);
  c->backend = EMBSTORE_BACKEND_AUTO;
  c->device = 0;
  c->rank = 0;
  c->world_size = 1;
  c->nccl_comm = nullptr;
  c->staging_bytes = size_t{256} << 20;
  c->io_queue_depth = 16;
  c->host_threads = 0;
  c->restore_spill = EMBSTORE_SPILL_AUTO;
  c->spill_dir = nullptr;
  c->tier_dir = nullptr;
  c->mpi_comm = nullptr;
  c->comm_callbacks = nullptr;
}

void embstore_comm_callbacks_init(embstore_comm_callbacks_t* callbacks) {
  if (callbacks == nullptr) return;
  std::memset(callbacks, 0, sizeof(*callbacks));
  callbacks->struct_size = sizeof(*callbacks);
}

uint32_t embstore_shard_of(int64_t key, uint32_t world_size) {
  return embstore::row::shard_of(key, world_size == 0 ? 1 : world_size);
}

embstore_status_t embstore_store_create(const embstore_store_config_t* config,
                                        embstore_store_t** store_out) {
  return guarded(__func__, [&] {
    require(store_out, "store_out");
    *store_out = nullptr;
    embstore_store_config_t c;
    embstore_store_config_init(&c);
    if (config != nullptr) {
      // A program built against 0.4.0's header passes a config without the later fields.
      constexpr size_t kBaseSize = offsetof(embstore_store_config_t, restore_spill);
      if (config->struct_size < kBaseSize) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "store config struct_size is {}, expected {}: fill it with "
             "embstore_store_config_init",
             config->struct_size, sizeof(embstore_store_config_t));
      }
      std::memcpy(&c, config, std::min(config->struct_size, sizeof(c)));
      c.struct_size = sizeof(c);
    }
    *store_out = new embstore_store(c);
  });
}

embstore_status_t embstore_store_destroy(embstore_store_t* store) {
  if (store == nullptr) return EMBSTORE_OK;
  return guarded(__func__, [&] {
    std::string message;
    embstore_status_t status;
    {
      const auto collective = collective_section(store);
      status = store->checkpointer->wait_idle(&message);
    }
    delete store;
    raise(status, std::move(message));
  });
}

embstore_backend_t embstore_store_backend(const embstore_store_t* store) {
  return store ? store->backend : EMBSTORE_BACKEND_HOST;
}

void embstore_table_config_init(embstore_table_config_t* c) {
  if (c == nullptr) return;
  std::memset(c, 0, sizeof(*c));
  c->struct_size = sizeof(*c);
  c->name = nullptr;
  c->dim = 0;
  c->initial_capacity = 1024;
  c->max_capacity = 0;
  c->optimizer = EMBSTORE_OPT_ADAGRAD;
  c->learning_rate = 0.01f;
  c->epsilon = 1e-8f;
  c->beta1 = 0.9f;
  c->beta2 = 0.999f;
  c->weight_decay = 0.0f;
  c->initial_accumulator = 0.0f;
  c->init = EMBSTORE_INIT_UNIFORM;
  c->init_a = -0.01f;
  c->init_b = 0.01f;
  c->seed = 0;
  c->admit_after = 1;
  c->evict_idle_steps = 0;
  c->evict_idle_seconds = 0.0;
  c->evict_when_full = 0;
  c->admit_bloom_bytes = 0;
  c->device_rows = 0;
  c->memory_rows = 0;
  c->value_codec = EMBSTORE_CODEC_NONE;
  c->state_codec = EMBSTORE_CODEC_NONE;
  c->serving_codec = EMBSTORE_CODEC_NONE;
}

embstore_status_t embstore_table_create(embstore_store_t* store,
                                        const embstore_table_config_t* config,
                                        embstore_table_t** table_out) {
  return guarded(__func__, [&] {
    require(table_out, "table_out");
    *table_out = nullptr;
    require(store, "store");
    require(config, "config");
    *table_out = store->create_table(*config);
  });
}

embstore_status_t embstore_table_get(embstore_store_t* store, const char* name,
                                     embstore_table_t** table_out) {
  return guarded(__func__, [&] {
    require(table_out, "table_out");
    *table_out = nullptr;
    require(store, "store");
    require(name, "name");
    embstore_table* table = store->find_table(name);
    if (table == nullptr) fail(EMBSTORE_NOT_FOUND, "no table named '{}'", name);
    *table_out = table;
  });
}

uint32_t embstore_table_dim(const embstore_table_t* table) {
  return table ? table->dim : 0;  // not table->impl: a restore may replace it meanwhile
}

embstore_status_t embstore_lookup(embstore_table_t* table, const int64_t* keys, size_t n,
                                  float* values_out, uint32_t flags, void* stream) {
  return guarded(__func__, [&] {
    require(table, "table");
    if (flags & ~EMBSTORE_LOOKUP_INSERT) {
      fail(EMBSTORE_INVALID_ARGUMENT, "unknown flags {:#x}", flags & ~EMBSTORE_LOOKUP_INSERT);
    }
    if (n == 0) return;
    require(keys, "keys");
    require(values_out, "values_out");
    check_batch(n);
    const embstore::TableCalls::Scope in_flight(table->store->table_calls);
    check_own_shard(*table->store, keys, n, stream);
    table->impl->lookup(keys, n, values_out, (flags & EMBSTORE_LOOKUP_INSERT) != 0,
                        table->store->step.load(std::memory_order_relaxed), stream);
  });
}

embstore_status_t embstore_apply_gradients(embstore_table_t* table, const int64_t* keys,
                                           const float* grads, size_t n, void* stream) {
  return guarded(__func__, [&] {
    require(table, "table");
    if (n == 0) return;
    require(keys, "keys");
    require(grads, "grads");
    check_batch(n);
    const embstore::TableCalls::Scope in_flight(table->store->table_calls);
    check_own_shard(*table->store, keys, n, stream);
    table->impl->apply_gradients(keys, grads, n, table->store->step.load(std::memory_order_relaxed),
                                 stream);
  });
}

embstore_status_t embstore_prefetch(embstore_table_t* table, const int64_t* keys, size_t n,
                                    void* stream) {
  return guarded(__func__, [&] {
    require(table, "table");
    if (n == 0) return;
    require(keys, "keys");
    check_batch(n);
    const embstore::TableCalls::Scope in_flight(table->store->table_calls);
    table->impl->prefetch(keys, n, stream);
  });
}

embstore_status_t embstore_sharded_lookup(embstore_table_t* table, const int64_t* keys, size_t n,
                                          float* values_out, uint32_t flags, void* stream) {
  if (table == nullptr || table->store->world_size == 1) {
    return embstore_lookup(table, keys, n, values_out, flags, stream);
  }
  return guarded(__func__, [&] {
    const embstore::shard::LocalCheck check = embstore::shard::run_stage([&] {
      if (flags & ~EMBSTORE_LOOKUP_INSERT) {
        fail(EMBSTORE_INVALID_ARGUMENT, "unknown flags {:#x}", flags & ~EMBSTORE_LOOKUP_INSERT);
      }
      if (n == 0) return;
      require(keys, "keys");
      require(values_out, "values_out");
      check_batch(n);
    });
    const bool insert = (flags & EMBSTORE_LOOKUP_INSERT) != 0;
    embstore_store* store = table->store;
    // Under comm_mutex: a restore on another thread replaces table->impl while it holds it.
    std::lock_guard lock(store->comm_mutex);
    // Occurrences count one by one toward admission: an insert there sends each of them.
    const bool per_occurrence = insert && table->impl->spec().admit_after > 1;
    const uint64_t step = store->step.load(std::memory_order_relaxed);
    if (store->device_exchange) {
      store->device_exchange->sharded_lookup(*table->impl, *store->comm, check, keys, n, values_out,
                                             insert, per_occurrence, step, stream);
    } else {
      embstore::shard::sharded_lookup(*table->impl, *store->comm, check, keys, n, values_out,
                                      insert, per_occurrence, step);
    }
  });
}

embstore_status_t embstore_sharded_apply_gradients(embstore_table_t* table, const int64_t* keys,
                                                   const float* grads, size_t n, void* stream) {
  if (table == nullptr || table->store->world_size == 1) {
    return embstore_apply_gradients(table, keys, grads, n, stream);
  }
  return guarded(__func__, [&] {
    const embstore::shard::LocalCheck check = embstore::shard::run_stage([&] {
      if (n == 0) return;
      require(keys, "keys");
      require(grads, "grads");
      check_batch(n);
    });
    embstore_store* store = table->store;
    std::lock_guard lock(store->comm_mutex);
    const uint64_t step = store->step.load(std::memory_order_relaxed);
    if (store->device_exchange) {
      store->device_exchange->sharded_apply_gradients(*table->impl, *store->comm, check, keys,
                                                      grads, n, step, stream);
    } else {
      embstore::shard::sharded_apply_gradients(*table->impl, *store->comm, check, keys, grads, n,
                                               step);
    }
  });
}

embstore_status_t embstore_step(embstore_store_t* store, uint64_t global_step) {
  return guarded(__func__, [&] {
    require(store, "store");
    const auto collective = collective_section(store);
    // A sharded store's step is collective and serialized with its restore (comm_mutex): it
    // must not fail on one rank alone.
    std::optional<embstore::TableCalls::Scope> in_flight;
    if (store->world_size == 1) in_flight.emplace(store->table_calls);
    const uint64_t previous = store->step.exchange(global_step, std::memory_order_relaxed);
    store->on_step(previous, global_step);
    std::string message;
    const embstore_status_t status = store->checkpointer->on_step(global_step, &message);
    raise(status, std::move(message));
  });
}

embstore_status_t embstore_table_stats(embstore_table_t* table, embstore_table_stats_t* out) {
  return guarded(__func__, [&] {
    require(table, "table");
    require(out, "out");
    // Callers built against 0.2 lack the fields from `admitted` on.
    constexpr size_t kBaseSize = offsetof(embstore_table_stats_t, admitted);
    if (out->struct_size < kBaseSize) {
      fail(EMBSTORE_INVALID_ARGUMENT, "stats struct_size is {}, expected {}", out->struct_size,
           sizeof(embstore_table_stats_t));
    }
    const embstore::TableCalls::Scope in_flight(table->store->table_calls);
    const embstore::TableCounters c = table->impl->counters();
    // Each group of fields for callers whose struct reaches it (0.3: admitted; tiers after).
    if (out->struct_size >= offsetof(embstore_table_stats_t, admitted) + sizeof(uint64_t)) {
      out->admitted = c.admitted;
    }
    out->rows = c.rows;
    out->capacity = c.capacity;
    out->dirty_rows = c.dirty_rows;
    out->inserted = c.inserted;
    out->evicted = c.evicted;
    out->pending_admission = c.pending_admission;
    out->skipped_keys = c.skipped_keys;
    if (out->struct_size >= offsetof(embstore_table_stats_t, tier_bytes_written) + 8) {
      out->rows_in_device = c.rows_in_device;
      out->rows_in_memory = c.rows_in_memory;
      out->rows_on_disk = c.rows_on_disk;
      out->rows_moved_up = c.rows_moved_up;
      out->rows_moved_down = c.rows_moved_down;
      out->tier_bytes_read = c.tier_bytes_read;
      out->tier_bytes_written = c.tier_bytes_written;
    }
  });
}

embstore_status_t embstore_table_evict(embstore_table_t* table, uint64_t* evicted_out) {
  return guarded(__func__, [&] {
    require(table, "table");
    const embstore::TableCalls::Scope in_flight(table->store->table_calls);
    const uint64_t evicted = table->store->evict_idle(table);
    if (evicted_out) *evicted_out = evicted;
  });
}

// --------------------------------------------------------------------------- checkpoints --

embstore_status_t embstore_checkpoint(embstore_store_t* store, const char* dir,
                                      embstore_ckpt_kind_t kind, uint64_t* version_out) {
  return guarded(__func__, [&] {
    require(store, "store");
    require(dir, "dir");
    if (*dir == '\0') fail(EMBSTORE_INVALID_ARGUMENT, "dir is empty");
    const int k = embstore::enum_value(kind);
    if (k != EMBSTORE_CKPT_FULL && k != EMBSTORE_CKPT_INCREMENTAL) {
      fail(EMBSTORE_INVALID_ARGUMENT, "unknown checkpoint kind {}", k);
    }
    const auto collective = collective_section(store);
    const uint64_t version = store->checkpointer->checkpoint(dir, k == EMBSTORE_CKPT_FULL);
    if (version_out) *version_out = version;
  });
}

embstore_status_t embstore_checkpoint_wait(embstore_store_t* store, uint64_t version) {
  return guarded(__func__, [&] {
    require(store, "store");
    const auto collective = collective_section(store);
    std::string message;
    const embstore_status_t status = store->checkpointer->wait(version, &message);
    raise(status, std::move(message));
  });
}

embstore_status_t embstore_checkpoint_attach(embstore_store_t* store, const char* name,
                                             const void* data, size_t bytes) {
  return guarded(__func__, [&] {
    require(store, "store");
    embstore::check_name("attachment", name);
    if (bytes > 0) require(data, "data");
    store->checkpointer->attach(name, data, bytes);
  });
}

void embstore_checkpoint_policy_init(embstore_checkpoint_policy_t* policy) {
  if (policy == nullptr) return;
  std::memset(policy, 0, sizeof(*policy));
  policy->struct_size = sizeof(*policy);
  policy->max_chain_length = 32;
  policy->rebaseline_fraction = 0.5;
}

embstore_status_t embstore_checkpoint_set_policy(embstore_store_t* store,
                                                 const embstore_checkpoint_policy_t* policy) {
  return guarded(__func__, [&] {
    require(store, "store");
    require(policy, "policy");
    // Callers built before the rebaseline fields get their defaults.
    const size_t base_size = offsetof(embstore_checkpoint_policy_t, max_chain_length);
    if (policy->struct_size < base_size) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "policy struct_size is {}, expected {}: fill it with embstore_checkpoint_policy_init",
           policy->struct_size, base_size);
    }
    embstore_checkpoint_policy_t p_in;
    embstore_checkpoint_policy_init(&p_in);
    std::memcpy(&p_in, policy, std::min(policy->struct_size, sizeof(p_in)));
    policy = &p_in;
    for (double s : {policy->full_every_seconds, policy->incremental_every_seconds,
                     policy->rebaseline_fraction}) {
      if (!(s >= 0.0) || s == std::numeric_limits<double>::infinity()) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "policy seconds and rebaseline_fraction must be finite and >= 0, are {}", s);
      }
    }
    const bool scheduled = policy->full_every_steps != 0 || policy->full_every_seconds != 0.0 ||
                           policy->incremental_every_steps != 0 ||
                           policy->incremental_every_seconds != 0.0;
    const bool has_dir = policy->dir != nullptr && *policy->dir != '\0';
    if ((scheduled || policy->keep_full != 0) && !has_dir) {
      fail(EMBSTORE_INVALID_ARGUMENT, "policy has a schedule or keep_full but no dir");
    }
    embstore::checkpoint::Policy p;
    if (has_dir) p.dir = policy->dir;
    p.full_every_steps = policy->full_every_steps;
    p.full_every_seconds = policy->full_every_seconds;
    p.incremental_every_steps = policy->incremental_every_steps;
    p.incremental_every_seconds = policy->incremental_every_seconds;
    p.keep_full = policy->keep_full;
    p.max_chain_length = policy->max_chain_length;
    p.rebaseline_fraction = policy->rebaseline_fraction;
    if (policy->serving_deltas > 1) {
      fail(EMBSTORE_INVALID_ARGUMENT, "policy serving_deltas must be 0 or 1, is {}",
           policy->serving_deltas);
    }
    p.serving_deltas = policy->serving_deltas != 0;
    if (policy->serving_dir != nullptr && *policy->serving_dir != '\0') {
      if (!has_dir) fail(EMBSTORE_INVALID_ARGUMENT, "policy has a serving_dir but no dir");
      p.serving_dir = policy->serving_dir;
    }
    store->checkpointer->set_policy(std::move(p));
  });
}

embstore_status_t embstore_checkpoint_stats(embstore_store_t* store,
                                            embstore_checkpoint_stats_t* out) {
  return guarded(__func__, [&] {
    require(store, "store");
    require(out, "out");
    // 0.5's struct ended at deferred; later fields are filled where struct_size has room.
    constexpr size_t kOldest = offsetof(embstore_checkpoint_stats_t, serving_published);
    if (out->struct_size < kOldest) {
      fail(EMBSTORE_INVALID_ARGUMENT, "stats struct_size is {}, expected at least {}",
           out->struct_size, kOldest);
    }
    const size_t size = std::min(out->struct_size, sizeof(embstore_checkpoint_stats_t));
    embstore_checkpoint_stats_t stats = store->checkpointer->stats();
    stats.struct_size = out->struct_size;
    std::memcpy(out, &stats, size);
  });
}

embstore_status_t embstore_checkpoint_info(embstore_store_t* store, uint64_t version,
                                           embstore_checkpoint_info_t* out) {
  bool found = false;
  const embstore_status_t status = guarded(__func__, [&] {
    require(store, "store");
    require(out, "out");
    if (out->struct_size < sizeof(embstore_checkpoint_info_t)) {
      fail(EMBSTORE_INVALID_ARGUMENT, "info struct_size is {}, expected {}", out->struct_size,
           sizeof(embstore_checkpoint_info_t));
    }
    found = store->checkpointer->info(version, out);
  });
  if (status != EMBSTORE_OK || found) return status;
  // Not an exception: a caller may ask step after step for a version not taken yet.
  char message[96];
  std::snprintf(message, sizeof(message), "this store took no checkpoint of version %llu",
                static_cast<unsigned long long>(version));
  return record(EMBSTORE_NOT_FOUND, __func__, message);
}

embstore_status_t embstore_restore(embstore_store_t* store, const char* dir, uint64_t version,
                                   uint64_t* restored_version_out) {
  return guarded(__func__, [&] {
    require(store, "store");
    require(dir, "dir");
    if (*dir == '\0') fail(EMBSTORE_INVALID_ARGUMENT, "dir is empty");
    const auto collective = collective_section(store);
    const embstore::TableCalls::Replacement replacing(store->table_calls, store->world_size > 1);
    const uint64_t restored = store->checkpointer->restore(dir, version);
    if (restored_version_out) *restored_version_out = restored;
  });
}

embstore_status_t embstore_restore_attachment(embstore_store_t* store, const char* name, void* buf,
                                              size_t capacity, size_t* bytes_out) {
  return guarded(__func__, [&] {
    require(store, "store");
    require(name, "name");
    if (capacity > 0) require(buf, "buf");
    require(bytes_out, "bytes_out");
    std::vector<char> data;
    if (!store->checkpointer->restored_attachment(name, &data)) {
      fail(EMBSTORE_NOT_FOUND, "the last restore brought no attachment named '{}'", name);
    }
    *bytes_out = data.size();
    if (buf == nullptr && capacity == 0) return;
    if (capacity < data.size()) {
      fail(EMBSTORE_INVALID_ARGUMENT, "attachment '{}' is {} bytes, capacity is {}", name,
           data.size(), capacity);
    }
    if (!data.empty()) std::memcpy(buf, data.data(), data.size());
  });
}

void embstore_warm_start_source_init(embstore_warm_start_source_t* source) {
  if (source == nullptr) return;
  std::memset(source, 0, sizeof(*source));
  source->struct_size = sizeof(*source);
  source->version = EMBSTORE_LATEST;
  source->tables_regex = ".*";
}

embstore_status_t embstore_warm_start(embstore_store_t* store,
                                      const embstore_warm_start_source_t* sources, size_t n) {
  return guarded(__func__, [&] {
    require(store, "store");
    if (n == 0) fail(EMBSTORE_INVALID_ARGUMENT, "no warm start sources (n is 0)");
    require(sources, "sources");
    // A program built before `flags` passes sources without it: no flags.
    constexpr size_t kBaseSize = offsetof(embstore_warm_start_source_t, flags);
    std::vector<embstore::checkpoint::Checkpointer::WarmSource> warm(n);
    for (size_t i = 0; i < n; ++i) {
      const embstore_warm_start_source_t& s = sources[i];
      if (s.struct_size < kBaseSize) {
        fail(EMBSTORE_INVALID_ARGUMENT,
             "warm start source {}: struct_size is {}, expected {}: fill it with "
             "embstore_warm_start_source_init",
             i, s.struct_size, sizeof(embstore_warm_start_source_t));
      }
      const uint32_t flags = s.struct_size >= kBaseSize + sizeof(s.flags) ? s.flags : 0;
      if (s.dir == nullptr || *s.dir == '\0') {
        fail(EMBSTORE_INVALID_ARGUMENT, "warm start source {}: dir is {}", i,
             s.dir == nullptr ? "NULL" : "empty");
      }
      if (s.tables_regex == nullptr) {
        fail(EMBSTORE_INVALID_ARGUMENT, "warm start source {}: tables_regex is NULL", i);
      }
      if ((flags & ~EMBSTORE_WARM_START_VALUES_ONLY) != 0) {
        fail(EMBSTORE_INVALID_ARGUMENT, "warm start source {}: unknown flags {:#x}", i, flags);
      }
      warm[i].dir = s.dir;
      warm[i].version = s.version;
      warm[i].tables_regex = s.tables_regex;
      warm[i].values_only = (flags & EMBSTORE_WARM_START_VALUES_ONLY) != 0;
    }
    const auto collective = collective_section(store);
    const embstore::TableCalls::Replacement replacing(store->table_calls, store->world_size > 1);
    store->checkpointer->warm_start(warm);
  });
}

void embstore_follower_config_init(embstore_follower_config_t* config) {
  if (config == nullptr) return;
  std::memset(config, 0, sizeof(*config));
  config->struct_size = sizeof(*config);
  config->backend = EMBSTORE_BACKEND_AUTO;
  config->tables_regex = ".*";
  config->world_size = 1;
  config->lease_seconds = 60;
}

embstore_status_t embstore_follower_create(const embstore_follower_config_t* config,
                                           embstore_follower_t** out) {
  return guarded(__func__, [&] {
    require(out, "out");
    *out = nullptr;
    require(config, "config");
    // The first version ended at flags: its callers get no background polling, a 60 s lease.
    constexpr size_t kBaseSize = offsetof(embstore_follower_config_t, poll_interval_ms);
    if (config->struct_size < kBaseSize) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "follower config struct_size is {}, expected {}: fill it with "
           "embstore_follower_config_init",
           config->struct_size, sizeof(embstore_follower_config_t));
    }
    // The second version ended at lease_seconds: no pacing.
    const bool has_polling = config->struct_size >=
                             offsetof(embstore_follower_config_t, lease_seconds) + sizeof(uint32_t);
    const bool has_pacing = config->struct_size >= sizeof(embstore_follower_config_t);
    require(config->dir, "dir");
    if (*config->dir == '\0') fail(EMBSTORE_INVALID_ARGUMENT, "dir is empty");
    if (config->world_size < 1 || config->rank < 0 || config->rank >= config->world_size ||
        static_cast<uint32_t>(config->world_size) > embstore::io::kMaxWorldSize) {
      fail(EMBSTORE_INVALID_ARGUMENT, "rank {} is not in a serving layout of {}", config->rank,
           config->world_size);
    }
    if ((config->flags & ~(EMBSTORE_FOLLOWER_INITIAL_VALUES | EMBSTORE_FOLLOWER_INTERVAL_ONLY)) !=
        0) {
      fail(EMBSTORE_INVALID_ARGUMENT, "unknown flags {:#x}", config->flags);
    }
    const int device = has_pacing ? config->device : 0;
    switch (embstore::enum_value(config->backend)) {
      case EMBSTORE_BACKEND_AUTO:  // host pointers, as in the first version
      case EMBSTORE_BACKEND_HOST:
        break;
      case EMBSTORE_BACKEND_CUDA: {
        if (device < 0) fail(EMBSTORE_INVALID_ARGUMENT, "device must be >= 0, is {}", device);
        std::string why;
        if (!embstore::cuda_device_usable(device, &why)) {
          fail(EMBSTORE_UNSUPPORTED, "CUDA backend unavailable: {}", why);
        }
        break;
      }
      default:
        fail(EMBSTORE_INVALID_ARGUMENT, "unknown backend {}",
             embstore::enum_value(config->backend));
    }
    embstore::serving::FollowerOptions o;
    o.dir = config->dir;
    if (config->tables_regex != nullptr) o.tables_regex = config->tables_regex;
    o.rank = static_cast<uint32_t>(config->rank);
    o.world_size = static_cast<uint32_t>(config->world_size);
    o.initial_values = (config->flags & EMBSTORE_FOLLOWER_INITIAL_VALUES) != 0;
    o.watch_commits = (config->flags & EMBSTORE_FOLLOWER_INTERVAL_ONLY) == 0;
    if (has_polling) {
      o.poll_interval_ms = config->poll_interval_ms;
      o.lease_seconds = config->lease_seconds;
    }
    if (has_pacing) o.apply_bytes_per_second = config->apply_bytes_per_second;
    if (o.lease_seconds > 0 && o.poll_interval_ms > uint64_t{500} * o.lease_seconds) {
      fail(EMBSTORE_INVALID_ARGUMENT,
           "poll_interval_ms {} is more than half of lease_seconds {}: the lease would expire "
           "between polls",
           o.poll_interval_ms, o.lease_seconds);
    }
    o.who = fmt::format("follower in {}", program_invocation_short_name);
    *out = new embstore_follower{std::make_unique<embstore::serving::Follower>(std::move(o)),
                                 config->backend == EMBSTORE_BACKEND_CUDA, device};
  });
}

embstore_status_t embstore_follower_lookup(embstore_follower_t* follower, const char* table,
                                           const int64_t* keys, size_t n, float* values_out,
                                           void* stream) {
  return guarded(__func__, [&] {
    require(follower, "follower");
    require(table, "table");
    if (n == 0) return;
    require(keys, "keys");
    require(values_out, "values_out");
    if (!follower->cuda) {
      follower->impl->lookup(table, keys, n, values_out);
      return;
    }
    // The rows are host memory: the keys come over, the rows go back.
    uint32_t dim = 0;
    try {
      dim = follower->impl->table_dim(table);
    } catch (const embstore::Error& e) {
      fail(EMBSTORE_INVALID_ARGUMENT, "{}", e.what());
    }
    const std::vector<int64_t> host_keys =
        embstore::copy_keys_to_host(keys, n, follower->device, stream);
    std::vector<float> rows(n * dim);
    follower->impl->lookup(table, host_keys.data(), n, rows.data());
    embstore::copy_floats_to_device(rows.data(), values_out, rows.size(), follower->device, stream);
  });
}

embstore_status_t embstore_follower_poll(embstore_follower_t* follower, uint64_t* version_out) {
  return guarded(__func__, [&] {
    require(follower, "follower");
    const uint64_t v = follower->impl->poll();
    if (version_out != nullptr) *version_out = v;
  });
}

embstore_status_t embstore_follower_cancel(embstore_follower_t* follower) {
  return guarded(__func__, [&] {
    require(follower, "follower");
    follower->impl->cancel();
  });
}

embstore_status_t embstore_follower_version(embstore_follower_t* follower, uint64_t* version_out) {
  return guarded(__func__, [&] {
    require(follower, "follower");
    require(version_out, "version_out");
    *version_out = follower->impl->version();
  });
}

embstore_status_t embstore_follower_table_dim(embstore_follower_t* follower, const char* table,
                                              uint32_t* dim_out) {
  return guarded(__func__, [&] {
    require(follower, "follower");
    require(table, "table");
    require(dim_out, "dim_out");
    *dim_out = follower->impl->table_dim(table);
  });
}

embstore_status_t embstore_follower_stats(embstore_follower_t* follower,
                                          embstore_follower_stats_t* out) {
  return guarded(__func__, [&] {
    require(follower, "follower");
    require(out, "out");
    constexpr size_t kBaseSize = offsetof(embstore_follower_stats_t, polls);
    if (out->struct_size < kBaseSize) {
      fail(EMBSTORE_INVALID_ARGUMENT, "stats struct_size is {}, expected {}", out->struct_size,
           sizeof(embstore_follower_stats_t));
    }
    const embstore::serving::FollowerStats s = follower->impl->stats();
    out->version = s.version;
    out->versions_applied = s.versions_applied;
    out->full_loads = s.full_loads;
    out->lookups = s.lookups;
    out->last_apply_seconds = s.last_apply_seconds;
    if (out->struct_size < offsetof(embstore_follower_stats_t, delta_bytes_read)) return;
    out->polls = s.polls;
    out->chain_lost = s.chain_lost;
    out->last_poll_status = s.last_poll_status;
    out->last_lag_seconds = s.last_lag_seconds;
    out->lag_p50_seconds = s.lag_p50_seconds;
    out->lag_p99_seconds = s.lag_p99_seconds;
    if (out->struct_size < sizeof(embstore_follower_stats_t)) return;
    out->delta_bytes_read = s.delta_bytes_read;
    out->serving_files_read = s.serving_files_read;
    out->serving_fallbacks = s.serving_fallbacks;
  });
}

embstore_status_t embstore_follower_destroy(embstore_follower_t* follower) {
  delete follower;
  return EMBSTORE_OK;
}

}  // extern "C"
