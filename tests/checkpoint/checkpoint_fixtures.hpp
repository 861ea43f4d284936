// What the checkpoint tests share: checkpoint and restore calls that require OK, test tables
// of each optimizer, the training step they run (on the tested backend, or on a host store
// without Catch for forked children), row files read back, and bytes flipped. Links
// embstore_static for the io/ fault hooks and readers.
#pragma once

#include <embstore/embstore.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "io/engine/fault.hpp"
#include "io/format/commit.hpp"
#include "io/format/dir_lock.hpp"
#include "io/format/layout.hpp"
#include "io/format/row_file.hpp"
#include "support/backend.hpp"
#include "support/checkpoint_helpers.hpp"
#include "tests/io/io_fixtures.hpp"

namespace embstore_test::checkpoint {

namespace fs = std::filesystem;

using embstore_test::FaultGuard;
using embstore_test::HeldWriter;
using embstore_test::TempDir;

inline void require_status(embstore_status_t got, embstore_status_t want,
                           const char* mentions = "") {
  INFO("last_error: " << embstore_last_error());
  REQUIRE(std::string(embstore_status_name(got)) == embstore_status_name(want));
  REQUIRE(std::string(embstore_last_error()).find(mentions) != std::string::npos);
}

inline void ok(embstore_status_t s) { require_status(s, EMBSTORE_OK); }

inline uint64_t checkpoint_ok(embstore_store_t* store, const std::string& dir) {
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, &version));
  ok(embstore_checkpoint_wait(store, version));
  return version;
}

inline uint64_t restore_ok(embstore_store_t* store, const std::string& dir, uint64_t version) {
  uint64_t restored = 0;
  ok(embstore_restore(store, dir.c_str(), version, &restored));
  return restored;
}

// A store with a small staging ring (8 chunks of 128 KiB), so that rows of a snapshot are
// still captured, not staged, while its writer is held.
inline embstore_store_t* small_staging_store() {
  embstore_store_config_t config;
  embstore_store_config_init(&config);
  config.staging_bytes = size_t{1} << 20;
  return make_store(config);
}

inline embstore_table_config_t config_for(const char* name, uint32_t dim,
                                          embstore_optimizer_t opt) {
  embstore_table_config_t c = table_config(name, dim);
  c.optimizer = opt;
  c.learning_rate = 0.05f;
  c.init = EMBSTORE_INIT_UNIFORM;
  c.init_a = -0.5f;
  c.init_b = 0.5f;
  c.seed = 1234;
  c.initial_capacity = 64;
  if (opt == EMBSTORE_OPT_ADAM) c.weight_decay = 0.01f;
  return c;
}

// The batch train_step draws at step: keys in [-keys/2, keys/2) (duplicates included) and
// gradients in [-1, 1).
inline void step_batch(uint64_t step, int64_t keys, size_t batch, uint32_t dim,
                       std::vector<int64_t>* k, std::vector<float>* g) {
  std::mt19937_64 rng(step * 7919 + 17);
  k->resize(batch);
  for (auto& x : *k) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(keys)) - keys / 2;
  g->resize(batch * dim);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : *g) x = u(rng);
}

// train_step on a HOST store, with host pointers and without Catch: for a forked child, where
// a failed assertion would go on running the test suite. false on any error.
inline bool host_train_step(embstore_store_t* store, embstore_table_t* t, uint64_t step,
                            int64_t keys, size_t batch) {
  std::vector<int64_t> k;
  std::vector<float> g;
  const uint32_t dim = embstore_table_dim(t);
  step_batch(step, keys, batch, dim, &k, &g);
  std::vector<float> out(k.size() * dim);
  return embstore_lookup(t, k.data(), k.size(), out.data(), EMBSTORE_LOOKUP_INSERT, nullptr) ==
             EMBSTORE_OK &&
         embstore_apply_gradients(t, k.data(), g.data(), k.size(), nullptr) == EMBSTORE_OK &&
         embstore_step(store, step) == EMBSTORE_OK;
}

// One training step on step_batch, on the tested backend.
inline void train_step(embstore_store_t* store, embstore_table_t* table, uint64_t step,
                       int64_t keys, size_t batch = 256) {
  std::vector<int64_t> k;
  std::vector<float> g;
  step_batch(step, keys, batch, embstore_table_dim(table), &k, &g);
  lookup_ok(table, k);
  apply_ok(table, k, g);
  ok(embstore_step(store, step));
}

inline std::vector<int64_t> key_range(int64_t keys) {
  std::vector<int64_t> k(static_cast<size_t>(keys));
  for (int64_t i = 0; i < keys; ++i) k[static_cast<size_t>(i)] = i - keys / 2;
  return k;
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline embstore_table_t* get_table(embstore_store_t* store, const char* name) {
  embstore_table_t* t = nullptr;
  ok(embstore_table_get(store, name, &t));
  return t;
}

inline std::string version_dir(const std::string& dir, uint64_t version) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020llu.full", static_cast<unsigned long long>(version));
  return dir + "/" + name;
}

// Every row of a row file: key -> value and state, as written. A delta's tombstones go to
// *tombstones, sorted (without it, a file with tombstones fails the test).
inline std::map<int64_t, std::vector<float>> read_rows(const std::string& path,
                                                       std::vector<int64_t>* tombstones = nullptr) {
  std::unique_ptr<embstore::io::RowFileReader> reader;
  REQUIRE(embstore::io::RowFileReader::open(path, {}, &reader) == 0);
  std::map<int64_t, std::vector<float>> rows;
  embstore::io::RowBlock b;
  int r;
  if (tombstones != nullptr) tombstones->clear();
  while ((r = reader->next_block(&b)) == 1) {
    if (b.kind == embstore::io::RowBlockKind::kTombstones) {
      REQUIRE(tombstones != nullptr);
      tombstones->insert(tombstones->end(), b.keys, b.keys + b.rows);
      continue;
    }
    for (uint32_t i = 0; i < b.rows; ++i) {
      std::vector<float> rec(b.values + size_t{i} * b.dim, b.values + size_t{i + 1} * b.dim);
      if (b.state_dim > 0) {
        rec.insert(rec.end(), b.state + size_t{i} * b.state_dim,
                   b.state + size_t{i + 1} * b.state_dim);
      }
      REQUIRE(rows.emplace(b.keys[i], std::move(rec)).second);  // each row written once
    }
  }
  REQUIRE(r == 0);
  if (tombstones != nullptr) std::sort(tombstones->begin(), tombstones->end());
  return rows;
}

// A table's row file, in the layout this version writes.
inline std::string row_file(const std::string& table) {
  return embstore::io::row_file_path(embstore::io::kManifestFormatVersion, table, 0, 1);
}

inline std::string table_file(const std::string& dir, uint64_t version, const std::string& table) {
  return version_dir(dir, version) + "/" + row_file(table);
}

inline void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

inline std::string delta_dir(const std::string& dir, uint64_t version) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020llu.delta", static_cast<unsigned long long>(version));
  return dir + "/" + name;
}

}  // namespace embstore_test::checkpoint
