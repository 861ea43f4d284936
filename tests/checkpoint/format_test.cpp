// Checkpoints written in an older on-disk format restore. tests/data/checkpoint-format1/ holds a
// chain (a full checkpoint and two deltas with tombstones, admission counts and an attachment)
// written by embstore 0.3.0, format 1: table files at <table>/, before the tables/ namespace.
// The chain was made by format1_training below (the hidden test case "[.make_format1_fixture]",
// run with the 0.3.0 library); the test replays the same training in a fresh store and
// requires every restored version to equal the replay at its step bit for bit, and training
// to go on identically from there.
#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "support/backend.hpp"
#include "support/checkpoint_helpers.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_test;
namespace fs = std::filesystem;

namespace {

constexpr int64_t kKeys = 48;  // keys in [-24, 24)
constexpr uint64_t kVersions[] = {3, 6, 8};

embstore_table_config_t users_config() {
  embstore_table_config_t c = table_config("users", 4);
  c.optimizer = EMBSTORE_OPT_ADAM;
  c.learning_rate = 0.05f;
  c.weight_decay = 0.01f;
  c.init_a = -0.5f;
  c.init_b = 0.5f;
  c.seed = 11;
  c.initial_capacity = 32;
  c.admit_after = 2;  // exact counting: counts in every checkpoint
  return c;
}

embstore_table_config_t items_config() {
  embstore_table_config_t c = table_config("items", 8);
  c.optimizer = EMBSTORE_OPT_ADAGRAD;
  c.learning_rate = 0.1f;
  c.init = EMBSTORE_INIT_NORMAL;
  c.init_a = 0.0f;
  c.init_b = 0.1f;
  c.seed = 5;
  c.initial_capacity = 16;
  c.evict_idle_steps = 2;  // evictions between checkpoints: tombstones in the deltas
  return c;
}

void train(embstore_store_t* store, embstore_table_t* t, uint64_t step, int64_t spread) {
  std::mt19937_64 rng(step * 1000003 + embstore_table_dim(t));
  const uint32_t dim = embstore_table_dim(t);
  std::vector<int64_t> keys(24);
  // Later steps draw from a narrower range, so rows of the wider one go idle and are evicted.
  for (auto& k : keys) k = static_cast<int64_t>(rng() % static_cast<uint64_t>(spread)) - kKeys / 2;
  std::vector<float> grads(keys.size() * dim);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& g : grads) g = u(rng);
  lookup_ok(t, keys);
  apply_ok(t, keys, grads);
  (void)store;
}

// Steps 1..last; at_step(step) runs after each step's embstore_step.
void format1_training(embstore_store_t* store, uint64_t last,
                      const std::function<void(uint64_t)>& at_step) {
  embstore_table_t* users = make_table(store, users_config());
  embstore_table_t* items = make_table(store, items_config());
  for (uint64_t step = 1; step <= last; ++step) {
    require_ok(embstore_step(store, step));
    train(store, users, step, kKeys);
    train(store, items, step, step <= 3 ? kKeys : kKeys / 3);
    uint64_t evicted = 0;
    require_ok(embstore_table_evict(items, &evicted));
    at_step(step);
  }
}

std::vector<int64_t> all_keys() {
  std::vector<int64_t> k;
  for (int64_t i = -kKeys / 2; i < kKeys / 2; ++i) k.push_back(i);
  return k;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Both stores' tables read the same for every key (no row: zeros).
void require_same_tables(embstore_store_t* a, embstore_store_t* b) {
  for (const char* name : {"users", "items"}) {
    embstore_table_t *ta = nullptr, *tb = nullptr;
    require_ok(embstore_table_get(a, name, &ta));
    require_ok(embstore_table_get(b, name, &tb));
    INFO("table " << name);
    REQUIRE(stats(ta).rows == stats(tb).rows);
    REQUIRE(stats(ta).pending_admission == stats(tb).pending_admission);
    REQUIRE(same_bits(lookup_ok(ta, all_keys(), 0), lookup_ok(tb, all_keys(), 0)));
  }
}

std::string fixture_dir() { return std::string(EMBSTORE_TEST_DATA_DIR) + "/checkpoint-format1"; }

}  // namespace

TEST_CASE("a chain written in format 1 restores every version exactly", "[checkpoint][format]") {
  TempDir dir;  // a copy: restore never writes, but the fixture stays untouched all the same
  fs::copy(fixture_dir(), dir.path() + "/ckpt", fs::copy_options::recursive);
  const std::string ckpt = dir.path() + "/ckpt";
  for (const uint64_t version : kVersions) {
    INFO("version " << version);
    StoreGuard restored(make_store());
    uint64_t got = 0;
    require_ok(embstore_restore(restored, ckpt.c_str(), version, &got));
    REQUIRE(got == version);
    StoreGuard replay(make_store());
    format1_training(replay, version, [](uint64_t) {});
    require_same_tables(restored, replay);
    if (version == 3) {
      char reader[32] = {};
      size_t bytes = 0;
      require_ok(embstore_restore_attachment(restored, "reader", reader, sizeof reader, &bytes));
      REQUIRE(std::string(reader, bytes) == "offset 3");
      embstore_table_t* users = nullptr;
      require_ok(embstore_table_get(restored, "users", &users));
      REQUIRE(stats(users).pending_admission > 0);  // the fixture holds counts
    }
    // Optimizer state and admission counts came back too: training goes on identically (on
    // users: rows' last-touched steps are not checkpointed, so items would evict differently).
    std::vector<float> next[2];
    int i = 0;
    for (embstore_store_t* s : {restored.store, replay.store}) {
      embstore_table_t* users = nullptr;
      require_ok(embstore_table_get(s, "users", &users));
      for (uint64_t step = version + 1; step <= version + 2; ++step) train(s, users, step, kKeys);
      next[i++] = lookup_ok(users, all_keys(), 0);
    }
    REQUIRE(same_bits(next[0], next[1]));
  }
}

// Writes the fixture with the library it is linked against: EMBSTORE_FIXTURE_OUT=DIR.
TEST_CASE("make the format 1 fixture", "[.make_format1_fixture]") {
  const char* out = std::getenv("EMBSTORE_FIXTURE_OUT");
  REQUIRE(out != nullptr);
  StoreGuard store(make_store());
  no_rebaseline(store);
  format1_training(store, 8, [&](uint64_t step) {
    if (step == 3) {
      require_ok(embstore_checkpoint_attach(store, "reader", "offset 3", 8));
      uint64_t v = 0;
      require_ok(embstore_checkpoint(store, out, EMBSTORE_CKPT_FULL, &v));
      require_ok(embstore_checkpoint_wait(store, v));
    } else if (step == 6 || step == 8) {
      incremental_ok(store, out);
    }
  });
}
