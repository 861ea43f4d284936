// What the tier tests share: a store with an SSD tier, a tiered table beside its untiered twin,
// the stream both are trained on, and checks that they hold the same rows bit for bit.
#pragma once

#include <embstore/embstore.h>
#include <pthread.h>

#include <catch2/catch.hpp>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "host/backend/host_table.hpp"
#include "tests/checkpoint/checkpoint_fixtures.hpp"

namespace embstore_test::tiers {

using namespace embstore_test::checkpoint;  // NOLINT: the checkpoint tests' vocabulary

// Whether this run builds the host backend's tiered tables as a stack of two host tables, as the
// CUDA backend's SSD tier is built (host/table/stacked_table.hpp): ctest's "host-stacked:" run of
// these tests sets EMBSTORE_TEST_STACKED_TIERS=1 and leaves out the cases tagged [host_tier],
// which check the host table's own moves (its counts, its background thread, its frames).
inline bool stacked_tiers() {
  const char* v = std::getenv("EMBSTORE_TEST_STACKED_TIERS");
  return v != nullptr && v[0] == '1';
}

// A store of the tested backend whose tier files go to dir (NULL: no tier_dir).
inline embstore_store_t* tier_store(const char* dir, size_t staging_bytes = 0) {
  embstore_store_config_t config;
  embstore_store_config_init(&config);
  config.tier_dir = dir;
  if (staging_bytes != 0) config.staging_bytes = staging_bytes;
  return make_store(config);
}

// The test tables: Adagrad unless said, 64 rows up front, a seeded initializer.
inline embstore_table_config_t tier_config(const char* name, uint32_t dim, uint64_t memory_rows,
                                           embstore_optimizer_t opt = EMBSTORE_OPT_ADAGRAD) {
  embstore_table_config_t c = config_for(name, dim, opt);
  c.memory_rows = memory_rows;
  return c;
}

// A case of the bit-for-bit training tests: a first-tier budget (memory_rows on the host,
// device_rows on CUDA), an optimizer, admission and eviction.
struct TrainCase {
  uint64_t budget;
  embstore_optimizer_t opt;
  uint32_t admit_after;
  uint64_t evict_idle_steps;
  uint64_t max_capacity = 0;  // with evict_when_full

  // The untiered twin's config (dim 8) of this case.
  embstore_table_config_t untiered_config() const {
    embstore_table_config_t c = tier_config("emb", 8, 0, opt);
    c.admit_after = admit_after;
    c.evict_idle_steps = evict_idle_steps;
    if (max_capacity != 0) {
      c.initial_capacity = 64;
      c.max_capacity = max_capacity;
      c.evict_when_full = 1;
    }
    return c;
  }
  bool evicts() const { return evict_idle_steps != 0 || max_capacity != 0; }
};

inline std::ostream& operator<<(std::ostream& os, const TrainCase& c) {
  return os << "budget " << c.budget << ", optimizer " << c.opt << ", admit_after " << c.admit_after
            << ", evict_idle_steps " << c.evict_idle_steps << ", max_capacity " << c.max_capacity;
}

// Keys first, first + 1, ..., n of them.
inline std::vector<int64_t> keys_from(int64_t first, size_t n) {
  std::vector<int64_t> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = first + static_cast<int64_t>(i);
  return k;
}

// Whether the cases of the host table's own moves ([host_tier]: its counts, its background
// thread, its frames) apply: on the host backend with its own tier, not on a stack of tables
// (the CUDA backend's SSD tier, or the host's under EMBSTORE_TEST_STACKED_TIERS).
inline bool host_tier_policy() { return backend() == EMBSTORE_BACKEND_HOST && !stacked_tiers(); }

// Two tables trained alike: `plain` untiered, `tiered` with a budget. step() gives both the same
// batch (step_batch's keys in [-keys/2, keys/2)) and requires the same lookup results. With
// prefetch_next, the tiered table prefetches the next step's batch between its lookup and its
// update, as a pipelined trainer does: the read goes on while the update runs.
struct Twins {
  embstore_store_t* plain_store;
  embstore_store_t* tiered_store;
  embstore_table_t* plain;
  embstore_table_t* tiered;
  bool prefetch_next = false;

  void step(uint64_t s, int64_t keys, size_t batch) {
    std::vector<int64_t> k;
    std::vector<float> g;
    step_batch(s, keys, batch, embstore_table_dim(plain), &k, &g);
    const std::vector<float> a = lookup_ok(plain, k);
    const std::vector<float> b = lookup_ok(tiered, k);
    REQUIRE(same_bits(a, b));
    if (prefetch_next) {
      std::vector<int64_t> next_keys;
      std::vector<float> next_grads;
      step_batch(s + 1, keys, batch, embstore_table_dim(plain), &next_keys, &next_grads);
      prefetch_ok(tiered, next_keys);
    }
    apply_ok(plain, k, g);
    apply_ok(tiered, k, g);
    ok(embstore_step(plain_store, s));
    ok(embstore_step(tiered_store, s));
  }
};

// A full checkpoint of each store's table `name` into its own directory, and its rows (values
// and optimizer state) read back: they must be equal.
inline void require_same_checkpoint(embstore_store_t* a, embstore_store_t* b,
                                    const std::string& dir_a, const std::string& dir_b,
                                    const char* name) {
  const uint64_t va = checkpoint_ok(a, dir_a);
  const uint64_t vb = checkpoint_ok(b, dir_b);
  REQUIRE(va == vb);
  const auto rows_a = read_rows(version_dir(dir_a, va) + "/" + row_file(name));
  const auto rows_b = read_rows(version_dir(dir_b, vb) + "/" + row_file(name));
  REQUIRE(rows_a.size() == rows_b.size());
  REQUIRE(rows_a == rows_b);  // floats compared by value: also checked bitwise below
  for (const auto& [key, rec] : rows_a) REQUIRE(same_bits(rec, rows_b.at(key)));
}

// Holds the first write not made on this thread (a checkpoint writer's) until release(), so that
// that checkpoint's snapshot stays captured while this thread trains; the tier's own writes (on
// this thread or the table's tier thread, told by its name) go ahead. As HeldWriter, which would
// hold a tier write, but for at most `hold` (2 s: long enough for the training calls under a
// sanitizer to meet the captured rows while the writer is held): a training call whose
// copy-on-write finds staging full waits for the writer, and goes on once it moves.
// Then::kWrite: the held write, and every later one, are made. Then::kFail: every checkpoint
// write waits for release() (or `hold`) and then fails with EIO, so the checkpoint fails.
class HeldCheckpointWriter {
 public:
  enum class Then { kWrite, kFail };
  static bool on_tier_thread() {
    char name[16] = {};
    pthread_getname_np(pthread_self(), name, sizeof(name));
    return std::string(name) == embstore::host_backend::kTierThreadName;
  }
  explicit HeldCheckpointWriter(std::chrono::milliseconds hold = std::chrono::seconds(2),
                                Then then = Then::kWrite)
      : trainer_(std::this_thread::get_id()),
        hold_(hold),
        then_(then),
        guard_([this](uint64_t, size_t) {
          if (std::this_thread::get_id() == trainer_ || on_tier_thread()) return 0;
          std::unique_lock lock(m_);
          if (held_ && then_ == Then::kWrite) return 0;
          held_ = true;
          cv_.notify_all();
          cv_.wait_for(lock, hold_, [&] { return released_; });
          return then_ == Then::kFail ? -EIO : 0;
        }) {}
  ~HeldCheckpointWriter() { release(); }
  // Waits until the writer is held.
  void wait_held() {
    std::unique_lock lock(m_);
    REQUIRE(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return held_; }));
  }
  void release() {
    {
      std::lock_guard lock(m_);
      released_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::thread::id trainer_;
  std::chrono::milliseconds hold_;
  Then then_;
  std::mutex m_;
  std::condition_variable cv_;
  bool held_ = false, released_ = false;
  FaultGuard guard_;
};

}  // namespace embstore_test::tiers
