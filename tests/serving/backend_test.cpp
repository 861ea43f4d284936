// Followers on the tested backend (--backend host|cuda): host pointers, or device pointers on
// CUDA, where the follower copies each lookup's keys to the host and its rows back. After its
// load and after every poll (deltas with new keys and evictions, then a new full checkpoint)
// its rows equal those of a restore of the same version on the same backend.
#include "support/backend.hpp"

#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <string>
#include <vector>

#include "support/checkpoint_helpers.hpp"
#include "tests/io/io_fixtures.hpp"

namespace {

using namespace embstore_test;

constexpr uint32_t kDim = 8;

std::vector<float> restored_rows(const std::string& dir, uint64_t version,
                                 const std::vector<int64_t>& keys) {
  StoreGuard store(make_store());
  require_ok(embstore_restore(store, dir.c_str(), version, nullptr));
  embstore_table_t* table = nullptr;
  require_ok(embstore_table_get(store, "items", &table));
  return lookup_ok(table, keys, 0);
}

void check_equals_restore(embstore_follower_t* f, const std::string& dir, uint64_t version,
                          const std::vector<int64_t>& keys) {
  uint64_t served = 0;
  require_ok(embstore_follower_version(f, &served));
  REQUIRE(served == version);
  std::vector<float> got;
  require_ok(follower_lookup(f, "items", keys, kDim, &got));
  const std::vector<float> want = restored_rows(dir, version, keys);
  INFO("version " << version << " on " << backend_name());
  CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
}

TEST_CASE("A follower on the tested backend equals a restore after each poll", "[serving]") {
  TempDir tmp;
  const std::string dir = tmp.path() + "/run";
  StoreGuard store(make_store());
  no_rebaseline(store);
  embstore_table_config_t c = table_config("items", kDim);
  c.optimizer = EMBSTORE_OPT_ADAGRAD;
  c.evict_idle_steps = 2;  // the moving window below leaves keys idle: tombstones
  embstore_table_t* table = make_table(store, c);
  std::vector<int64_t> all;  // every key any step touches, and some never touched
  for (int64_t k = -50; k < 400; ++k) all.push_back(k);

  embstore_follower_t* f = nullptr;
  for (uint64_t step = 1; step <= 6; ++step) {
    require_ok(embstore_step(store, step));
    std::vector<int64_t> keys;
    for (int64_t k = 0; k < 120; ++k) keys.push_back(k + 40 * static_cast<int64_t>(step));
    lookup_ok(table, keys);
    std::vector<float> grads(keys.size() * kDim);
    for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i % 13) - 0.05f;
    apply_ok(table, keys, grads);
    uint64_t version = 0;
    const embstore_ckpt_kind_t kind =
        step == 1 || step == 5 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
    require_ok(embstore_checkpoint(store, dir.c_str(), kind, &version));
    require_ok(embstore_checkpoint_wait(store, version));
    if (f == nullptr) {
      embstore_follower_config_t fc;
      embstore_follower_config_init(&fc);
      fc.dir = dir.c_str();
      fc.backend = backend();
      fc.lease_seconds = 0;
      INFO(embstore_last_error());
      REQUIRE(embstore_follower_create(&fc, &f) == EMBSTORE_OK);
    } else {
      uint64_t polled = 0;
      require_ok(embstore_follower_poll(f, &polled));
      CHECK(polled == version);
    }
    check_equals_restore(f, dir, version, all);
  }
  embstore_follower_stats_t st{};
  st.struct_size = sizeof st;
  require_ok(embstore_follower_stats(f, &st));
  CHECK(st.versions_applied == 4);  // 2, 3, 4 and 6
  CHECK(st.full_loads == 2);        // 1, and the rebase at 5
  // Bad input on this backend: a table not served, NULL pointers.
  std::vector<float> out;
  CHECK(follower_lookup(f, "other", {1, 2}, kDim, &out) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(embstore_follower_lookup(f, "items", nullptr, 2, nullptr, nullptr) ==
        EMBSTORE_INVALID_ARGUMENT);
  embstore_follower_destroy(f);
}

}  // namespace
