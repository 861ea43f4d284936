// Sharded CUDA stores over NCCL, for a machine with at least two GPUs: W = min(devices, 4)
// ranks as threads of one process, rank r on device r, NCCL communicators from ncclCommInitAll
// for the data path and the thread group's callbacks for control. Each rank trains the sharded
// scenario's tables (sharded_scenario.hpp) through embstore_sharded_lookup and
// embstore_sharded_apply_gradients with device buffers and compares, bit for bit, with one
// host-backend process on the ranks' concatenated batches: the rows every sharded lookup
// returns, then every row it owns (plain embstore_lookup with device keys). Then the ranks
// checkpoint collectively, and one host store restores it and compares every row.
// Exits 77 (skipped) with fewer than two usable devices, 0 when every rank passed.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "shard/sharded_scenario.hpp"
#include "shard/thread_group.hpp"

namespace {

namespace sharded = embstore_test::sharded;
using sharded::kTables;
using sharded::Outcome;

constexpr size_t kTableCount = sizeof(kTables) / sizeof(kTables[0]);

// A device copy of a host vector, and back.
template <typename T>
struct Device {
  T* ptr = nullptr;
  size_t n = 0;
  explicit Device(const std::vector<T>& v) : n(v.size()) {
    cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T));
    cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  explicit Device(size_t count) : n(count) { cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T)); }
  ~Device() { cudaFree(ptr); }
  std::vector<T> host() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

Outcome run_rank(embstore_store_config_t config, int rank, int world, ncclComm_t nccl,
                 const std::string& dir) {
  Outcome out;
  const std::string at = "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": ";
  cudaSetDevice(rank);
  config.backend = EMBSTORE_BACKEND_CUDA;
  config.device = rank;
  config.nccl_comm = nccl;
  embstore_store_t* store = nullptr;
  out.expect_status(embstore_store_create(&config, &store), EMBSTORE_OK, at + "store_create");
  embstore_store_config_t one;
  embstore_store_config_init(&one);
  one.backend = EMBSTORE_BACKEND_HOST;
  embstore_store_t* reference = nullptr;
  out.expect_status(embstore_store_create(&one, &reference), EMBSTORE_OK, at + "reference");
  if (store == nullptr || reference == nullptr) return out;
  std::vector<embstore_table_t*> tables(kTableCount), replay(kTableCount);
  for (size_t t = 0; t < kTableCount; ++t) {
    const embstore_table_config_t c = sharded::config_of(kTables[t]);
    out.expect_status(embstore_table_create(store, &c, &tables[t]), EMBSTORE_OK, at + "table");
    out.expect_status(embstore_table_create(reference, &c, &replay[t]), EMBSTORE_OK,
                      at + "reference table");
  }
  std::set<int64_t> seen;
  for (int step = 1; step <= sharded::kSteps && out.failures == 0; ++step) {
    embstore_step(store, static_cast<uint64_t>(step));
    embstore_step(reference, static_cast<uint64_t>(step));
    for (size_t t = 0; t < kTableCount; ++t) {
      const uint32_t dim = kTables[t].dim;
      const std::string where = at + kTables[t].name + " step " + std::to_string(step);
      std::vector<int64_t> all_keys;
      std::vector<size_t> begin(world + 1, 0);
      for (int q = 0; q < world; ++q) {
        const std::vector<int64_t> k = sharded::batch_of(q, step, t);
        all_keys.insert(all_keys.end(), k.begin(), k.end());
        begin[q + 1] = all_keys.size();
      }
      seen.insert(all_keys.begin(), all_keys.end());
      std::vector<float> all_rows(all_keys.size() * dim);
      out.expect_status(embstore_lookup(replay[t], all_keys.data(), all_keys.size(),
                                        all_rows.data(), EMBSTORE_LOOKUP_INSERT, nullptr),
                        EMBSTORE_OK, where + ": reference lookup");
      const std::vector<int64_t> keys = sharded::batch_of(rank, step, t);
      const Device<int64_t> d_keys(keys);
      Device<float> d_rows(keys.size() * dim);
      out.expect_status(embstore_sharded_lookup(tables[t], d_keys.ptr, keys.size(), d_rows.ptr,
                                                EMBSTORE_LOOKUP_INSERT, nullptr),
                        EMBSTORE_OK, where + ": sharded_lookup");
      const std::vector<float> rows = d_rows.host();
      out.expect(sharded::same_bits(rows.data(), all_rows.data() + begin[rank] * dim, rows.size()),
                 where + ": sharded_lookup rows differ from one process's");
      std::vector<float> all_grads;
      for (int q = 0; q < world; ++q) {
        const std::vector<float> seg(all_rows.begin() + begin[q] * dim,
                                     all_rows.begin() + begin[q + 1] * dim);
        const std::vector<float> g = sharded::grads_of(q, step, seg);
        all_grads.insert(all_grads.end(), g.begin(), g.end());
      }
      out.expect_status(embstore_apply_gradients(replay[t], all_keys.data(), all_grads.data(),
                                                 all_keys.size(), nullptr),
                        EMBSTORE_OK, where + ": reference gradients");
      const Device<float> d_grads(sharded::grads_of(rank, step, rows));
      out.expect_status(embstore_sharded_apply_gradients(tables[t], d_keys.ptr, d_grads.ptr,
                                                         keys.size(), nullptr),
                        EMBSTORE_OK, where + ": sharded_apply_gradients");
    }
  }
  // Every row this rank owns, through the plain call with device keys.
  std::vector<int64_t> owned;
  for (int64_t k : seen) {
    if (embstore_shard_of(k, static_cast<uint32_t>(world)) == static_cast<uint32_t>(rank)) {
      owned.push_back(k);
    }
  }
  for (size_t t = 0; t < kTableCount && out.failures == 0; ++t) {
    const uint32_t dim = kTables[t].dim;
    const Device<int64_t> d_owned(owned);
    Device<float> d_mine(owned.size() * dim);
    out.expect_status(embstore_lookup(tables[t], d_owned.ptr, owned.size(), d_mine.ptr, 0, nullptr),
                      EMBSTORE_OK, at + "lookup of owned keys");
    std::vector<float> theirs(owned.size() * dim);
    embstore_lookup(replay[t], owned.data(), owned.size(), theirs.data(), 0, nullptr);
    out.expect(sharded::same_bits(d_mine.host().data(), theirs.data(), theirs.size()),
               at + kTables[t].name + ": owned rows differ from one process's");
  }
  // A collective checkpoint of the CUDA ranks, restored into one host store.
  uint64_t version = 0;
  out.expect_status(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, &version),
                    EMBSTORE_OK, at + "checkpoint");
  out.expect_status(embstore_checkpoint_wait(store, version), EMBSTORE_OK, at + "checkpoint_wait");
  out.expect_status(embstore_store_destroy(store), EMBSTORE_OK, at + "store_destroy");
  if (rank == 0 && out.failures == 0) {
    embstore_store_t* back = nullptr;
    out.expect_status(embstore_store_create(&one, &back), EMBSTORE_OK, at + "restore store");
    out.expect_status(embstore_restore(back, dir.c_str(), version, nullptr), EMBSTORE_OK,
                      at + "restore into one host store");
    const std::vector<int64_t> every(seen.begin(), seen.end());
    for (size_t t = 0; t < kTableCount && back != nullptr; ++t) {
      const uint32_t dim = kTables[t].dim;
      embstore_table_t* restored = nullptr;
      embstore_table_get(back, kTables[t].name, &restored);
      std::vector<float> a(every.size() * dim), b(every.size() * dim);
      out.expect_status(embstore_lookup(restored, every.data(), every.size(), a.data(), 0, nullptr),
                        EMBSTORE_OK, at + "lookup of the restored rows");
      embstore_lookup(replay[t], every.data(), every.size(), b.data(), 0, nullptr);
      out.expect(sharded::same_bits(a.data(), b.data(), a.size()),
                 at + kTables[t].name + ": restored rows differ from one process's");
    }
    embstore_store_destroy(back);
  }
  embstore_store_destroy(reference);
  return out;
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("SKIPPED: %d CUDA device(s); the NCCL path needs at least 2\n", devices);
    return 77;
  }
  const int world = std::min(devices, 4);
  std::vector<ncclComm_t> comms(world);
  std::vector<int> list(world);
  for (int r = 0; r < world; ++r) list[r] = r;
  if (ncclCommInitAll(comms.data(), world, list.data()) != ncclSuccess) {
    std::printf("SKIPPED: ncclCommInitAll failed over %d devices\n", world);
    return 77;
  }
  const std::string dir =
      (std::filesystem::temp_directory_path() / "embstore-nccl-sharded-test").string();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
  const auto outcomes = embstore_test::threads::on_ranks(
      world,
      [&](embstore_store_config_t c, int r) { return run_rank(c, r, world, comms[r], dir); });
  long failures = 0;
  for (const Outcome& o : outcomes) {
    if (o.failures > 0) std::fprintf(stderr, "%s\n", o.first.c_str());
    failures += o.failures;
  }
  for (ncclComm_t c : comms) ncclCommDestroy(c);
  std::filesystem::remove_all(dir, ec);
  std::printf("nccl_sharded_test: %d ranks, %ld failures\n", world, failures);
  return failures == 0 ? 0 : 1;
}
