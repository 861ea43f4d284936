// Followers' test fixtures: a trainer writing deltas with tombstones and pending keys, a
// follower of a directory, and the check that a follower serves what a restore holds.
#pragma once

#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "io/codec/block_codec.hpp"
#include "io/format/manifest.hpp"
#include "tests/io/io_fixtures.hpp"

namespace embstore_test::serving {

inline constexpr int64_t kKeys = 600;

inline embstore_store_t* host_store() {
  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = EMBSTORE_BACKEND_HOST;
  c.host_threads = 1;
  embstore_store_t* s = nullptr;
  REQUIRE(embstore_store_create(&c, &s) == EMBSTORE_OK);
  return s;
}

struct Trainer {
  embstore_store_t* store = host_store();
  embstore_table_t* items = nullptr;    // Adagrad, rows idle for 2 steps evicted (tombstones)
  embstore_table_t* counted = nullptr;  // admission after 3 sightings (pending keys)
  std::mt19937_64 rng{11};

  // serving_deltas: every delta also gets values-only files, in serving_codec.
  explicit Trainer(bool serving_deltas = false,
                   embstore_codec_t serving_codec = EMBSTORE_CODEC_NONE) {
    embstore_table_config_t c;
    embstore_table_config_init(&c);
    c.serving_codec = serving_codec;
    c.name = "items";
    c.dim = 4;
    c.optimizer = EMBSTORE_OPT_ADAGRAD;
    c.evict_idle_steps = 2;
    REQUIRE(embstore_table_create(store, &c, &items) == EMBSTORE_OK);
    c.name = "counted";
    c.dim = 3;
    c.evict_idle_steps = 0;
    c.admit_after = 3;
    REQUIRE(embstore_table_create(store, &c, &counted) == EMBSTORE_OK);
    // Deltas stay deltas (these small tables change mostly between checkpoints).
    embstore_checkpoint_policy_t policy;
    embstore_checkpoint_policy_init(&policy);
    policy.max_chain_length = 0;
    policy.rebaseline_fraction = 0;
    policy.serving_deltas = serving_deltas ? 1 : 0;
    REQUIRE(embstore_checkpoint_set_policy(store, &policy) == EMBSTORE_OK);
  }
  ~Trainer() { embstore_store_destroy(store); }

  void step(uint64_t s) {
    REQUIRE(embstore_step(store, s) == EMBSTORE_OK);
    for (embstore_table_t* t : {items, counted}) {
      const uint32_t dim = embstore_table_dim(t);
      std::vector<int64_t> keys(200);
      // A moving window of keys: older keys go idle and are evicted.
      for (int64_t& k : keys)
        k = static_cast<int64_t>(rng() % 300) + static_cast<int64_t>(s) * 30 - 300;
      std::vector<float> rows(keys.size() * dim), grads(keys.size() * dim);
      for (float& g : grads) g = static_cast<float>(rng() % 100) / 100.0f - 0.5f;
      REQUIRE(embstore_lookup(t, keys.data(), keys.size(), rows.data(), EMBSTORE_LOOKUP_INSERT,
                              nullptr) == EMBSTORE_OK);
      REQUIRE(embstore_apply_gradients(t, keys.data(), grads.data(), keys.size(), nullptr) ==
              EMBSTORE_OK);
    }
  }

  uint64_t checkpoint(const std::string& dir, embstore_ckpt_kind_t kind) {
    uint64_t v = 0;
    REQUIRE(embstore_checkpoint(store, dir.c_str(), kind, &v) == EMBSTORE_OK);
    REQUIRE(embstore_checkpoint_wait(store, v) == EMBSTORE_OK);
    return v;
  }
};

// A run's directory holding version 1: a full checkpoint of the trainer's step 1.
struct Run {
  embstore_test::TempDir tmp;
  std::string dir = tmp.path() + "/run";
  Trainer trainer;
  explicit Run(bool serving_deltas = false, embstore_codec_t serving_codec = EMBSTORE_CODEC_NONE)
      : trainer(serving_deltas, serving_codec) {
    trainer.step(1);
    trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
  }
};

// The manifest of the version directory vdir, which must read.
inline embstore::io::Manifest manifest_of(const std::string& vdir) {
  embstore::io::Manifest m;
  std::string detail;
  INFO(detail);
  REQUIRE(embstore::io::read_manifest(vdir, &m, &detail) == 0);
  return m;
}

// A follower configuration of dir with the defaults, to adjust before follow_with.
inline embstore_follower_config_t follower_config(const std::string& dir) {
  embstore_follower_config_t c;
  embstore_follower_config_init(&c);
  c.dir = dir.c_str();  // dir outlives the create
  return c;
}

inline embstore_follower_t* follow_with(const embstore_follower_config_t& c) {
  embstore_follower_t* f = nullptr;
  INFO(embstore_last_error());
  REQUIRE(embstore_follower_create(&c, &f) == EMBSTORE_OK);
  return f;
}

inline embstore_follower_t* follow(const std::string& dir, int rank = 0, int world = 1,
                                   uint32_t flags = 0) {
  embstore_follower_config_t c = follower_config(dir);
  c.rank = rank;
  c.world_size = world;
  c.flags = flags;
  return follow_with(c);
}

inline embstore_follower_stats_t stats_of(embstore_follower_t* f) {
  embstore_follower_stats_t st{};
  st.struct_size = sizeof st;
  REQUIRE(embstore_follower_stats(f, &st) == EMBSTORE_OK);
  return st;
}

// The follower's rows of every key it serves (keys in [-kKeys, kKeys)) equal those of a store
// that restored `version` of dir; with a lossy codec (values-only deltas in serving_codec),
// each row is within that codec's bound of the restored one.
inline void check_equals_restore(embstore_follower_t* f, const std::string& dir, uint64_t version,
                                 int rank = 0, int world = 1,
                                 embstore::io::Codec codec = embstore::io::Codec::kNone) {
  uint64_t served = 0;
  REQUIRE(embstore_follower_version(f, &served) == EMBSTORE_OK);
  REQUIRE(served == version);
  embstore_store_t* restored = host_store();
  REQUIRE(embstore_restore(restored, dir.c_str(), version, nullptr) == EMBSTORE_OK);
  std::vector<int64_t> keys;
  for (int64_t k = -kKeys; k < kKeys; ++k) {
    if (embstore_shard_of(k, static_cast<uint32_t>(world)) == static_cast<uint32_t>(rank)) {
      keys.push_back(k);
    }
  }
  for (const char* name : {"items", "counted"}) {
    embstore_table_t* t = nullptr;
    REQUIRE(embstore_table_get(restored, name, &t) == EMBSTORE_OK);
    const uint32_t dim = embstore_table_dim(t);
    std::vector<float> want(keys.size() * dim), got(keys.size() * dim, -7.0f);
    REQUIRE(embstore_lookup(t, keys.data(), keys.size(), want.data(), 0, nullptr) == EMBSTORE_OK);
    REQUIRE(embstore_follower_lookup(f, name, keys.data(), keys.size(), got.data(), nullptr) ==
            EMBSTORE_OK);
    INFO("table " << name << " at version " << version << ", codec "
                  << embstore::io::codec_name(codec));
    CHECK(embstore::io::within_bound(codec, want.data(), got.data(), keys.size(), dim));
  }
  embstore_store_destroy(restored);
}

// A new follower of followed serves, at once, what a restore of dir's version holds (within
// codec).
inline void check_new_follower(const std::string& followed, const std::string& dir,
                               uint64_t version,
                               embstore::io::Codec codec = embstore::io::Codec::kNone) {
  embstore_follower_t* f = follow(followed);
  check_equals_restore(f, dir, version, 0, 1, codec);
  embstore_follower_destroy(f);
}

}  // namespace embstore_test::serving
