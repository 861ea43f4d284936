#include "support/backend.hpp"

#include <catch2/catch.hpp>
#include <cstring>

#if defined(EMBSTORE_HAVE_CUDA)
#include <cuda_runtime.h>
#endif

namespace embstore_test {

extern embstore_backend_t g_backend;

embstore_backend_t backend() { return g_backend; }
const char* backend_name() { return g_backend == EMBSTORE_BACKEND_CUDA ? "cuda" : "host"; }

embstore_store_t* make_store(int host_threads) {
  embstore_store_config_t config;
  embstore_store_config_init(&config);
  config.host_threads = host_threads;
  return make_store(config);
}

embstore_store_t* make_store(embstore_store_config_t config) {
  config.backend = g_backend;
  embstore_store_t* store = nullptr;
  const embstore_status_t st = embstore_store_create(&config, &store);
  INFO(embstore_last_error());
  REQUIRE(st == EMBSTORE_OK);
  REQUIRE(embstore_store_backend(store) == g_backend);
  return store;
}

embstore_table_config_t table_config(const char* name, uint32_t dim) {
  embstore_table_config_t config;
  embstore_table_config_init(&config);
  config.name = name;
  config.dim = dim;
  return config;
}

embstore_table_t* make_table(embstore_store_t* store, const embstore_table_config_t& config) {
  embstore_table_t* table = nullptr;
  const embstore_status_t st = embstore_table_create(store, &config, &table);
  INFO(embstore_last_error());
  REQUIRE(st == EMBSTORE_OK);
  REQUIRE(table != nullptr);
  return table;
}

namespace {

#if defined(EMBSTORE_HAVE_CUDA)
// Device copy of a host vector, copied back on request.
template <typename T>
class DeviceCopy {
 public:
  explicit DeviceCopy(const std::vector<T>& host) : n_(host.size()) {
    if (n_ == 0) return;
    REQUIRE(cudaMalloc(&ptr_, n_ * sizeof(T)) == cudaSuccess);
    REQUIRE(cudaMemcpy(ptr_, host.data(), n_ * sizeof(T), cudaMemcpyHostToDevice) == cudaSuccess);
  }
  ~DeviceCopy() { cudaFree(ptr_); }
  T* get() const { return static_cast<T*>(ptr_); }
  void copy_to(std::vector<T>* host) const {
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    if (n_ == 0) return;
    REQUIRE(cudaMemcpy(host->data(), ptr_, n_ * sizeof(T), cudaMemcpyDeviceToHost) == cudaSuccess);
  }

 private:
  size_t n_;
  void* ptr_ = nullptr;
};
#endif

}  // namespace

embstore_status_t lookup(embstore_table_t* table, const std::vector<int64_t>& keys, uint32_t flags,
                         std::vector<float>* out) {
  out->assign(keys.size() * embstore_table_dim(table), -1.0f);
#if defined(EMBSTORE_HAVE_CUDA)
  if (g_backend == EMBSTORE_BACKEND_CUDA) {
    DeviceCopy<int64_t> d_keys(keys);
    DeviceCopy<float> d_out(*out);
    const embstore_status_t st =
        embstore_lookup(table, d_keys.get(), keys.size(), d_out.get(), flags, nullptr);
    if (st == EMBSTORE_OK) d_out.copy_to(out);
    return st;
  }
#endif
  return embstore_lookup(table, keys.data(), keys.size(), out->data(), flags, nullptr);
}

embstore_status_t apply_gradients(embstore_table_t* table, const std::vector<int64_t>& keys,
                                  const std::vector<float>& grads) {
#if defined(EMBSTORE_HAVE_CUDA)
  if (g_backend == EMBSTORE_BACKEND_CUDA) {
    DeviceCopy<int64_t> d_keys(keys);
    DeviceCopy<float> d_grads(grads);
    const embstore_status_t st =
        embstore_apply_gradients(table, d_keys.get(), d_grads.get(), keys.size(), nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return st;
  }
#endif
  return embstore_apply_gradients(table, keys.data(), grads.data(), keys.size(), nullptr);
}

embstore_status_t prefetch(embstore_table_t* table, const std::vector<int64_t>& keys) {
#if defined(EMBSTORE_HAVE_CUDA)
  if (g_backend == EMBSTORE_BACKEND_CUDA) {
    DeviceCopy<int64_t> d_keys(keys);
    const embstore_status_t st = embstore_prefetch(table, d_keys.get(), keys.size(), nullptr);
    REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
    return st;
  }
#endif
  return embstore_prefetch(table, keys.data(), keys.size(), nullptr);
}

embstore_status_t follower_lookup(embstore_follower_t* follower, const char* table,
                                  const std::vector<int64_t>& keys, uint32_t dim,
                                  std::vector<float>* out) {
  out->assign(keys.size() * dim, -1.0f);
#if defined(EMBSTORE_HAVE_CUDA)
  if (g_backend == EMBSTORE_BACKEND_CUDA) {
    DeviceCopy<int64_t> d_keys(keys);
    DeviceCopy<float> d_out(*out);
    const embstore_status_t st =
        embstore_follower_lookup(follower, table, d_keys.get(), keys.size(), d_out.get(), nullptr);
    if (st == EMBSTORE_OK) d_out.copy_to(out);
    return st;
  }
#endif
  return embstore_follower_lookup(follower, table, keys.data(), keys.size(), out->data(), nullptr);
}

std::vector<float> lookup_ok(embstore_table_t* table, const std::vector<int64_t>& keys,
                             uint32_t flags) {
  std::vector<float> out;
  const embstore_status_t st = lookup(table, keys, flags, &out);
  INFO(embstore_last_error());
  REQUIRE(st == EMBSTORE_OK);
  return out;
}

void apply_ok(embstore_table_t* table, const std::vector<int64_t>& keys,
              const std::vector<float>& grads) {
  const embstore_status_t st = apply_gradients(table, keys, grads);
  INFO(embstore_last_error());
  REQUIRE(st == EMBSTORE_OK);
}

void prefetch_ok(embstore_table_t* table, const std::vector<int64_t>& keys) {
  const embstore_status_t st = prefetch(table, keys);
  INFO(embstore_last_error());
  REQUIRE(st == EMBSTORE_OK);
}

embstore_table_stats_t stats(embstore_table_t* table) {
  embstore_table_stats_t s;
  std::memset(&s, 0, sizeof(s));
  s.struct_size = sizeof(s);
  const embstore_status_t st = embstore_table_stats(table, &s);
  INFO(embstore_last_error());
  REQUIRE(st == EMBSTORE_OK);
  return s;
}

}  // namespace embstore_test
