// Tests are written once against the C API and run on each backend: these helpers hide where
// the data must live (host memory, or device memory on the CUDA backend).
#pragma once

#include <embstore/embstore.h>

#include <cstdint>
#include <string>
#include <vector>

namespace embstore_test {

// The backend this process tests (--backend host|cuda; default host).
embstore_backend_t backend();
const char* backend_name();

// A store on the tested backend; fails the test on error.
embstore_store_t* make_store(int host_threads = 0);
// The same with config's other fields (backend is set to the tested one).
embstore_store_t* make_store(embstore_store_config_t config);

struct StoreGuard {
  embstore_store_t* store;
  explicit StoreGuard(embstore_store_t* s) : store(s) {}
  ~StoreGuard() { embstore_store_destroy(store); }
  StoreGuard(const StoreGuard&) = delete;
  StoreGuard& operator=(const StoreGuard&) = delete;
  operator embstore_store_t*() const { return store; }
};

// A config with the given name and dim, everything else at its default.
embstore_table_config_t table_config(const char* name, uint32_t dim);

embstore_table_t* make_table(embstore_store_t* store, const embstore_table_config_t& config);

// Data path calls with host vectors, copied to and from the device where needed.
embstore_status_t lookup(embstore_table_t* table, const std::vector<int64_t>& keys, uint32_t flags,
                         std::vector<float>* out);
embstore_status_t apply_gradients(embstore_table_t* table, const std::vector<int64_t>& keys,
                                  const std::vector<float>& grads);

// A follower's lookup of keys (dim floats a row) with host vectors, through device copies on
// the CUDA backend (a follower created with the tested backend).
embstore_status_t follower_lookup(embstore_follower_t* follower, const char* table,
                                  const std::vector<int64_t>& keys, uint32_t dim,
                                  std::vector<float>* out);

// embstore_prefetch of keys; on CUDA through a device copy, kept until the device is done with it.
embstore_status_t prefetch(embstore_table_t* table, const std::vector<int64_t>& keys);

// Shorthands that require OK.
std::vector<float> lookup_ok(embstore_table_t* table, const std::vector<int64_t>& keys,
                             uint32_t flags = EMBSTORE_LOOKUP_INSERT);
void apply_ok(embstore_table_t* table, const std::vector<int64_t>& keys,
              const std::vector<float>& grads);
embstore_table_stats_t stats(embstore_table_t* table);
void prefetch_ok(embstore_table_t* table, const std::vector<int64_t>& keys);

}  // namespace embstore_test
