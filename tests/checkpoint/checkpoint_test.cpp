// Full checkpoints through the C API, on each backend: round trips of every optimizer, training
// that continues after a restore, snapshots taken while training goes on, attachments,
// versions, retention, corruption, crashes and write failures. Links embstore_static for the
// io/ fault hook.
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

#include "io/format/commit.hpp"
#include "io/format/dir_lock.hpp"
#include "io/engine/fault.hpp"
#include "io/format/layout.hpp"
#include "io/format/row_file.hpp"
#include "support/backend.hpp"
#include "support/checkpoint_helpers.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_test;
namespace fs = std::filesystem;

namespace {

using embstore_test::FaultGuard;
using embstore_test::HeldWriter;
using embstore_test::TempDir;

void require_status(embstore_status_t got, embstore_status_t want, const char* mentions = "") {
  INFO("last_error: " << embstore_last_error());
  REQUIRE(std::string(embstore_status_name(got)) == embstore_status_name(want));
  REQUIRE(std::string(embstore_last_error()).find(mentions) != std::string::npos);
}

void ok(embstore_status_t s) { require_status(s, EMBSTORE_OK); }

uint64_t checkpoint_ok(embstore_store_t* store, const std::string& dir) {
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, &version));
  ok(embstore_checkpoint_wait(store, version));
  return version;
}

uint64_t restore_ok(embstore_store_t* store, const std::string& dir, uint64_t version) {
  uint64_t restored = 0;
  ok(embstore_restore(store, dir.c_str(), version, &restored));
  return restored;
}

// A store with a small staging ring (8 chunks of 128 KiB), so that rows of a snapshot are
// still captured, not staged, while its writer is held.
embstore_store_t* small_staging_store() {
  embstore_store_config_t config;
  embstore_store_config_init(&config);
  config.staging_bytes = size_t{1} << 20;
  return make_store(config);
}

embstore_table_config_t config_for(const char* name, uint32_t dim, embstore_optimizer_t opt) {
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
void step_batch(uint64_t step, int64_t keys, size_t batch, uint32_t dim, std::vector<int64_t>* k,
                std::vector<float>* g) {
  std::mt19937_64 rng(step * 7919 + 17);
  k->resize(batch);
  for (auto& x : *k) x = static_cast<int64_t>(rng() % static_cast<uint64_t>(keys)) - keys / 2;
  g->resize(batch * dim);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& x : *g) x = u(rng);
}

// train_step on a HOST store, with host pointers and without Catch: for a forked child, where
// a failed assertion would go on running the test suite. false on any error.
bool host_train_step(embstore_store_t* store, embstore_table_t* t, uint64_t step, int64_t keys,
                     size_t batch) {
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
void train_step(embstore_store_t* store, embstore_table_t* table, uint64_t step, int64_t keys,
                size_t batch = 256) {
  std::vector<int64_t> k;
  std::vector<float> g;
  step_batch(step, keys, batch, embstore_table_dim(table), &k, &g);
  lookup_ok(table, k);
  apply_ok(table, k, g);
  ok(embstore_step(store, step));
}

std::vector<int64_t> key_range(int64_t keys) {
  std::vector<int64_t> k(static_cast<size_t>(keys));
  for (int64_t i = 0; i < keys; ++i) k[static_cast<size_t>(i)] = i - keys / 2;
  return k;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

embstore_table_t* get_table(embstore_store_t* store, const char* name) {
  embstore_table_t* t = nullptr;
  ok(embstore_table_get(store, name, &t));
  return t;
}

std::string version_dir(const std::string& dir, uint64_t version) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020llu.full", static_cast<unsigned long long>(version));
  return dir + "/" + name;
}

// Every row of a row file: key -> value and state, as written.
std::map<int64_t, std::vector<float>> read_rows(const std::string& path) {
  std::unique_ptr<embstore::io::RowFileReader> reader;
  REQUIRE(embstore::io::RowFileReader::open(path, {}, &reader) == 0);
  std::map<int64_t, std::vector<float>> rows;
  embstore::io::RowBlock b;
  int r;
  while ((r = reader->next_block(&b)) == 1) {
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
  return rows;
}

// A table's row file, in the layout this version writes.
std::string row_file(const std::string& table) {
  return embstore::io::row_file_path(embstore::io::kManifestFormatVersion, table, 0, 1);
}

std::string table_file(const std::string& dir, uint64_t version, const std::string& table) {
  return version_dir(dir, version) + "/" + row_file(table);
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f.good());
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  f.read(&c, 1);
  c = static_cast<char>(c ^ 0x5a);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

}  // namespace

TEST_CASE("a full checkpoint round-trips every optimizer bit-exactly and training continues",
          "[checkpoint]") {
  const embstore_optimizer_t opt = GENERATE(EMBSTORE_OPT_SGD, EMBSTORE_OPT_ADAGRAD,
                                            EMBSTORE_OPT_ROWWISE_ADAGRAD, EMBSTORE_OPT_ADAM);
  INFO("optimizer " << opt);
  TempDir dir;
  const int64_t keys = 600;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 13, opt));
  for (uint64_t s = 1; s <= 5; ++s) train_step(a, ta, s, keys);
  const uint64_t version = checkpoint_ok(a, dir.path());
  REQUIRE(version == 5);

  // Into an empty store: the table is created from the manifest, exactly as configured.
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 5);
  embstore_table_t* tb = get_table(b, "emb");
  REQUIRE(embstore_table_dim(tb) == 13);
  REQUIRE(stats(tb).rows == stats(ta).rows);
  REQUIRE(stats(tb).dirty_rows == 0);
  const std::vector<int64_t> all = key_range(keys);
  REQUIRE(same_bits(lookup_ok(ta, all, 0), lookup_ok(tb, all, 0)));

  // Training goes on identically: the optimizer state came back too, bit for bit.
  for (uint64_t s = 6; s <= 9; ++s) {
    train_step(a, ta, s, keys);
    train_step(b, tb, s, keys);
  }
  REQUIRE(same_bits(lookup_ok(ta, all, 0), lookup_ok(tb, all, 0)));
  TempDir da, db;
  checkpoint_ok(a, da.path());
  checkpoint_ok(b, db.path());
  const auto rows_a = read_rows(table_file(da.path(), 9, "emb"));
  const auto rows_b = read_rows(table_file(db.path(), 9, "emb"));
  REQUIRE(rows_a.size() == stats(ta).rows);
  REQUIRE(rows_a == rows_b);  // values and optimizer state
}

TEST_CASE("a checkpoint taken while training goes on holds the rows at its step", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(small_staging_store());
  embstore_table_t* t = make_table(store, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  const int64_t keys = 20000;
  const std::vector<int64_t> all = key_range(keys);
  lookup_ok(t, all);  // every key gets a row
  for (uint64_t s = 1; s <= 3; ++s) train_step(store, t, s, keys, 2000);
  const std::vector<float> at_capture = lookup_ok(t, all, 0);

  HeldWriter held;
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
  REQUIRE(version == 3);
  for (uint64_t s = 4; s <= 6; ++s) train_step(store, t, s, keys + 500, 1000);  // new keys too
  held.release();
  ok(embstore_checkpoint_wait(store, version));

  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.copy_on_write_rows > 0);
  REQUIRE(cs.committed == 1);
  REQUIRE(cs.rows_written == static_cast<uint64_t>(keys));
  REQUIRE(cs.last_version == 3);

  const auto rows = read_rows(table_file(dir.path(), 3, "emb"));
  REQUIRE(rows.size() == static_cast<size_t>(keys));
  for (size_t i = 0; i < all.size(); ++i) {
    auto it = rows.find(all[i]);
    REQUIRE(it != rows.end());
    REQUIRE(std::memcmp(it->second.data(), &at_capture[i * 16], 16 * sizeof(float)) == 0);
  }
  // Training after the capture changed the table, and none of it is in the checkpoint.
  REQUIRE_FALSE(same_bits(lookup_ok(t, all, 0), at_capture));
  StoreGuard fresh(make_store());
  restore_ok(fresh, dir.path(), 3);
  REQUIRE(same_bits(lookup_ok(get_table(fresh, "emb"), all, 0), at_capture));
  REQUIRE(stats(get_table(fresh, "emb")).rows == static_cast<uint64_t>(keys));
}

TEST_CASE("attachments are saved with the next checkpoint and restored", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 4, EMBSTORE_OPT_SGD));
  train_step(store, t, 1, 100);
  const std::string rng = "reader offset 12345, rng state 0xdeadbeef";
  ok(embstore_checkpoint_attach(store, "rng", "stale", 5));
  ok(embstore_checkpoint_attach(store, "rng", rng.data(), rng.size()));  // replaces
  ok(embstore_checkpoint_attach(store, "empty", nullptr, 0));
  checkpoint_ok(store, dir.path());
  train_step(store, t, 2, 100);
  checkpoint_ok(store, dir.path());  // attachments were consumed by the first one

  StoreGuard b(make_store());
  restore_ok(b, dir.path(), 1);
  size_t bytes = 0;
  ok(embstore_restore_attachment(b, "rng", nullptr, 0, &bytes));
  REQUIRE(bytes == rng.size());
  std::vector<char> buf(bytes);
  bytes = 0;
  require_status(embstore_restore_attachment(b, "rng", buf.data(), buf.size() - 1, &bytes),
                 EMBSTORE_INVALID_ARGUMENT, "capacity");
  REQUIRE(bytes == rng.size());
  ok(embstore_restore_attachment(b, "rng", buf.data(), buf.size(), &bytes));
  REQUIRE(std::string(buf.begin(), buf.end()) == rng);
  ok(embstore_restore_attachment(b, "empty", nullptr, 0, &bytes));
  REQUIRE(bytes == 0);
  require_status(embstore_restore_attachment(b, "other", nullptr, 0, &bytes), EMBSTORE_NOT_FOUND,
                 "other");

  restore_ok(b, dir.path(), 2);
  require_status(embstore_restore_attachment(b, "rng", nullptr, 0, &bytes), EMBSTORE_NOT_FOUND,
                 "rng");
}

TEST_CASE("restored rows count as inserted, not as admitted by training", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 4, EMBSTORE_OPT_SGD));
  lookup_ok(t, key_range(100));
  REQUIRE(stats(t).admitted == 100);
  checkpoint_ok(store, dir.path());
  StoreGuard b(make_store());
  restore_ok(b, dir.path(), EMBSTORE_LATEST);
  embstore_table_t* r = get_table(b, "emb");
  REQUIRE(stats(r).inserted == 100);
  REQUIRE(stats(r).admitted == 0);
  lookup_ok(r, {1000, 1001, 1000});
  REQUIRE(stats(r).inserted == 102);
  REQUIRE(stats(r).admitted == 2);
}

TEST_CASE("restore picks the latest or an exact version", "[checkpoint]") {
  TempDir dir;
  const std::string nested = dir.file("a/b/c");  // created with its parents
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  const std::vector<int64_t> all = key_range(200);
  std::map<uint64_t, std::vector<float>> at;
  for (uint64_t s = 10; s <= 30; s += 10) {
    train_step(store, t, s, 200);
    REQUIRE(checkpoint_ok(store, nested) == s);
    at[s] = lookup_ok(t, all, 0);
  }
  // The same step twice is refused; nothing is overwritten.
  uint64_t v = 0;
  require_status(embstore_checkpoint(store, nested.c_str(), EMBSTORE_CKPT_FULL, &v),
                 EMBSTORE_ALREADY_EXISTS, "30");

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, nested, 20) == 20);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at[20]));
  REQUIRE(restore_ok(b, nested, EMBSTORE_LATEST) == 30);  // into the existing table
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at[30]));
  REQUIRE(restore_ok(b, nested, 10) == 10);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at[10]));
  require_status(embstore_restore(b, nested.c_str(), 25, &v), EMBSTORE_NOT_FOUND, "25");
  require_status(embstore_restore(b, dir.file("missing").c_str(), EMBSTORE_LATEST, &v),
                 EMBSTORE_NOT_FOUND, "does not exist");
  require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_NOT_FOUND,
                 "no committed checkpoint");
}

TEST_CASE("restore replaces the rows of an existing table and checks its shape", "[checkpoint]") {
  TempDir dir;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  train_step(a, ta, 1, 100);
  const uint64_t rows = stats(ta).rows;
  checkpoint_ok(a, dir.path());
  const std::vector<int64_t> all = key_range(100);
  const std::vector<float> expected = lookup_ok(ta, all, 0);

  SECTION("rows the checkpoint lacks are gone") {
    StoreGuard b(make_store());
    embstore_table_t* tb = make_table(b, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
    lookup_ok(tb, {1000001, 1000002});
    restore_ok(b, dir.path(), EMBSTORE_LATEST);
    REQUIRE(get_table(b, "emb") == tb);  // the handle stays valid
    REQUIRE(stats(tb).rows == rows);
    REQUIRE(same_bits(lookup_ok(tb, all, 0), expected));
    REQUIRE(lookup_ok(tb, {1000001}, 0) == std::vector<float>(8, 0.0f));
  }
  SECTION("a different dim or optimizer is refused and nothing changes") {
    StoreGuard b(make_store());
    embstore_table_t* tb = make_table(b, config_for("emb", 4, EMBSTORE_OPT_ADAGRAD));
    const std::vector<float> before = lookup_ok(tb, {1, 2, 3});
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v),
                   EMBSTORE_INVALID_ARGUMENT, "dim");
    REQUIRE(same_bits(lookup_ok(tb, {1, 2, 3}, 0), before));
    StoreGuard c(make_store());
    make_table(c, config_for("emb", 8, EMBSTORE_OPT_ADAM));
    require_status(embstore_restore(c, dir.path().c_str(), EMBSTORE_LATEST, &v),
                   EMBSTORE_INVALID_ARGUMENT, "optimizer");
  }
  SECTION("more rows than an existing table's max_capacity") {
    StoreGuard b(make_store());
    embstore_table_config_t c = config_for("emb", 8, EMBSTORE_OPT_ADAGRAD);
    c.max_capacity = rows - 1;
    c.initial_capacity = 16;
    make_table(b, c);
    uint64_t v = 0;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v),
                   EMBSTORE_CAPACITY_EXCEEDED, "max_capacity");
  }
}

TEST_CASE("the policy checkpoints on schedule and keeps the newest full checkpoints",
          "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.full_every_steps = 10;
  p.keep_full = 2;
  ok(embstore_checkpoint_set_policy(store, &p));
  for (uint64_t s = 1; s <= 45; ++s) {
    train_step(store, t, s, 100, 16);
    if (s % 10 == 0) ok(embstore_checkpoint_wait(store, s));  // the policy took it at s
  }
  const uint64_t last = checkpoint_ok(store, dir.path());
  REQUIRE(last == 45);

  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.committed == 5);  // 10, 20, 30, 40 and 45
  REQUIRE(cs.failed == 0);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  REQUIRE(names.size() == 3);
  REQUIRE(names[2] == embstore::io::kLockFileName);  // held by the store
  REQUIRE(names[1] == fs::path(version_dir(dir.path(), 45)).filename().string());
  uint64_t v = 0;
  require_status(embstore_restore(store, dir.path().c_str(), 10, &v), EMBSTORE_NOT_FOUND, "10");

  // A checkpoint due while another is being written is deferred to a later step.
  {
    std::atomic<int> writes{0};
    FaultGuard slow([&](uint64_t, size_t) {
      if (writes.fetch_add(1) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return 0;
    });
    train_step(store, t, 50, 100, 16);  // due: version 50, slow
    train_step(store, t, 60, 100, 16);  // due, but 50 is in flight: deferred
    ok(embstore_checkpoint_wait(store, 50));
    require_status(embstore_checkpoint_wait(store, 60), EMBSTORE_NOT_FOUND, "60");
    train_step(store, t, 61, 100, 16);  // the deferred one
    ok(embstore_checkpoint_wait(store, 61));
  }

  // By time: due once the interval has passed, at the next step.
  TempDir timed;
  p.dir = timed.path().c_str();
  p.full_every_steps = 0;
  p.full_every_seconds = 0.05;
  p.keep_full = 0;
  ok(embstore_checkpoint_set_policy(store, &p));
  train_step(store, t, 62, 100, 16);
  ok(embstore_checkpoint_stats(store, &cs));
  const uint64_t before = cs.committed + cs.in_flight;
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  train_step(store, t, 63, 100, 16);
  ok(embstore_checkpoint_wait(store, 63));
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.committed == before + 1);
  REQUIRE(fs::exists(version_dir(timed.path(), 63)));
}

TEST_CASE("corrupt, truncated and incomplete checkpoints are reported, never loaded",
          "[checkpoint]") {
  TempDir dir;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  train_step(a, ta, 1, 20000, 20000);
  checkpoint_ok(a, dir.path());
  train_step(a, ta, 2, 20000, 20000);
  checkpoint_ok(a, dir.path());
  const std::string file = table_file(dir.path(), 2, "emb");
  const std::string manifest = version_dir(dir.path(), 2) + "/MANIFEST.json";

  StoreGuard b(make_store());
  embstore_table_t* tb = make_table(b, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  const std::vector<float> before = lookup_ok(tb, {1, 2, 3});
  uint64_t v = 0;

  SECTION("a flipped byte in a row file") {
    flip_byte(file, 64 + 8 * 100);  // a key in the first block's payload
    require_status(embstore_restore(b, dir.path().c_str(), 2, &v), EMBSTORE_CORRUPT,
                   "shard-00000-of-00001.rows");
    REQUIRE(std::string(embstore_last_error()).find("offset 0") != std::string::npos);
  }
  SECTION("a flipped byte in a later block") {
    const auto size = fs::file_size(file);
    REQUIRE(size > 1048576 + 4096);  // several blocks
    flip_byte(file, size - 5000);
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT,
                   "offset");
  }
  SECTION("a truncated row file") {
    fs::resize_file(file, fs::file_size(file) - 4096);
    require_status(embstore_restore(b, dir.path().c_str(), 2, &v), EMBSTORE_CORRUPT, "truncated");
  }
  SECTION("a flipped byte in the manifest") {
    std::string text;
    {
      std::ifstream in(manifest);
      text.assign(std::istreambuf_iterator<char>(in), {});
    }
    const auto at = text.find("\"rows\": ");
    REQUIRE(at != std::string::npos);
    text[at + 8] = text[at + 8] == '9' ? '8' : '9';
    std::ofstream(manifest, std::ios::trunc) << text;
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT,
                   "MANIFEST.json");
  }
  SECTION("a missing manifest: not a checkpoint; LATEST falls back") {
    fs::remove(manifest);
    require_status(embstore_restore(b, dir.path().c_str(), 2, &v), EMBSTORE_CORRUPT,
                   "not a committed checkpoint");
    REQUIRE(same_bits(lookup_ok(tb, {1, 2, 3}, 0), before));
    REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 1);
    return;
  }
  // Nothing of the store changed.
  REQUIRE(same_bits(lookup_ok(tb, {1, 2, 3}, 0), before));
  REQUIRE(stats(tb).rows == 3);
  REQUIRE(restore_ok(b, dir.path(), 1) == 1);  // the earlier version is intact
}

TEST_CASE("a failed write fails only that checkpoint, and training and later checkpoints go on",
          "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  const std::vector<int64_t> all = key_range(1000);
  train_step(store, t, 1, 1000, 1000);
  checkpoint_ok(store, dir.path());
  const std::vector<float> at1 = lookup_ok(t, all, 0);
  train_step(store, t, 2, 1000, 1000);
  const uint64_t rows = stats(t).rows;
  {
    const int err = GENERATE(ENOSPC, EIO);
    FaultGuard guard([err](uint64_t, size_t) { return -err; });
    uint64_t version = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
    require_status(embstore_checkpoint_wait(store, version), EMBSTORE_IO_ERROR, std::strerror(err));
  }
  // No trace on disk but the earlier version; every row is dirty again for the next one.
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    if (e.path().filename() == embstore::io::kLockFileName) continue;
    ++entries;
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
  REQUIRE(entries == 1);
  REQUIRE(stats(t).dirty_rows == rows);
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.failed == 1);
  REQUIRE(cs.committed == 1);

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 1);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at1));

  train_step(store, t, 3, 1000, 1000);
  REQUIRE(checkpoint_ok(store, dir.path()) == 3);
  REQUIRE(stats(t).dirty_rows == 0);
}

TEST_CASE("a failed policy checkpoint is reported once by embstore_step", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.full_every_steps = 2;
  ok(embstore_checkpoint_set_policy(store, &p));
  {
    FaultGuard guard([](uint64_t, size_t) { return -EIO; });
    train_step(store, t, 1, 100, 16);
    train_step(store, t, 2, 100, 16);  // due: starts a checkpoint that fails
    embstore_checkpoint_stats_t cs;
    cs.struct_size = sizeof(cs);
    do {  // not embstore_checkpoint_wait: that would report the failure itself
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      ok(embstore_checkpoint_stats(store, &cs));
    } while (cs.in_flight != 0);
    REQUIRE(cs.failed == 1);
  }
  require_status(embstore_step(store, 3), EMBSTORE_IO_ERROR, "checkpoint 2");
  ok(embstore_step(store, 3));  // reported once
}

TEST_CASE("a crash while writing leaves the previous checkpoint to restore", "[checkpoint]") {
  // Crash safety lives in io/ and is the same for every backend; the child runs the host
  // backend, with host memory, because a CUDA context does not survive fork(). Only the
  // restore at the end uses the tested backend.
  TempDir dir;
  auto train = [](embstore_store_t* store, embstore_table_t* t, uint64_t from, uint64_t to) {
    for (uint64_t s = from; s <= to; ++s) {
      if (!host_train_step(store, t, s, 5000, 2000)) return false;
    }
    return true;
  };
  auto host_store = [] {
    embstore_store_config_t c;
    embstore_store_config_init(&c);
    c.backend = EMBSTORE_BACKEND_HOST;
    embstore_store_t* s = nullptr;
    REQUIRE(embstore_store_create(&c, &s) == EMBSTORE_OK);
    return s;
  };
  const pid_t parent = getpid();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    die_with_parent(parent);
    // Child: commit version 10, then start version 20 with slow writes and wait to be killed.
    embstore_store_t* store = host_store();
    embstore_table_t* t = nullptr;
    const embstore_table_config_t c = config_for("emb", 32, EMBSTORE_OPT_ADAM);
    if (embstore_table_create(store, &c, &t) != EMBSTORE_OK || !train(store, t, 1, 10)) _exit(3);
    uint64_t v = 0;
    if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v) != EMBSTORE_OK ||
        embstore_checkpoint_wait(store, v) != EMBSTORE_OK) {
      _exit(4);
    }
    if (!train(store, t, 11, 20)) _exit(6);
    embstore::io::set_fault_injection([](uint64_t, size_t) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      return 0;
    });
    if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v) != EMBSTORE_OK) {
      _exit(5);
    }
    for (;;) pause();
  }
  // Parent: kill the child once the temporary directory of version 20 holds data.
  bool writing = false;
  for (int i = 0; i < 3000 && !writing; ++i) {
    // The child renames and removes directories meanwhile: errors end a scan, not the test.
    std::error_code ec;
    for (fs::recursive_directory_iterator it(dir.path(), ec), end; !ec && it != end;
         it.increment(ec)) {
      const std::string p = it->path().string();
      std::error_code fec;
      if (p.find("/.tmp-20-") != std::string::npos && it->is_regular_file(fec) &&
          it->file_size(fec) > 0 && !fec) {
        writing = true;
      }
    }
    if (!writing) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(writing);
  REQUIRE(WIFSIGNALED(status));

  // The same training in this process gives the rows of version 10 to compare with.
  embstore_store_t* expected_store = host_store();
  StoreGuard expected_guard(expected_store);
  embstore_table_t* te = nullptr;
  const embstore_table_config_t c = config_for("emb", 32, EMBSTORE_OPT_ADAM);
  REQUIRE(embstore_table_create(expected_store, &c, &te) == EMBSTORE_OK);
  REQUIRE(train(expected_store, te, 1, 10));

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 10);
  const std::vector<int64_t> all = key_range(5000);
  std::vector<float> want(all.size() * 32);
  REQUIRE(embstore_lookup(te, all.data(), all.size(), want.data(), 0, nullptr) == EMBSTORE_OK);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), want));

  // The next checkpoint into dir removes the leftover.
  embstore_table_t* tb = get_table(b, "emb");
  train_step(b, tb, 11, 5000, 100);
  checkpoint_ok(b, dir.path());
  for (const auto& e : fs::directory_iterator(dir.path())) {
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
}

TEST_CASE("destroying a store finishes its checkpoint in flight", "[checkpoint]") {
  TempDir dir;
  embstore_store_t* store = make_store();
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  train_step(store, t, 7, 5000, 5000);
  const std::vector<int64_t> all = key_range(5000);
  const std::vector<float> expected = lookup_ok(t, all, 0);
  uint64_t v = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v));
  ok(embstore_store_destroy(store));
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 7);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), expected));
}

TEST_CASE("a checkpoint restores into a store of the other backend", "[checkpoint]") {
  // On a machine with a device this is HOST -> CUDA and CUDA -> HOST; without one, both
  // stores are HOST and the test still checks the round trip.
  TempDir dir;
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config_for("emb", 24, EMBSTORE_OPT_ROWWISE_ADAGRAD));
  for (uint64_t s = 1; s <= 3; ++s) train_step(a, ta, s, 400);
  checkpoint_ok(a, dir.path());
  const std::vector<int64_t> all = key_range(400);
  const std::vector<float> expected = lookup_ok(ta, all, 0);

  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = backend() == EMBSTORE_BACKEND_CUDA ? EMBSTORE_BACKEND_HOST : EMBSTORE_BACKEND_AUTO;
  embstore_store_t* other = nullptr;
  ok(embstore_store_create(&c, &other));
  StoreGuard guard(other);
  REQUIRE(restore_ok(other, dir.path(), EMBSTORE_LATEST) == 3);
  embstore_table_t* to = get_table(other, "emb");
  std::vector<float> got(all.size() * 24);
  if (embstore_store_backend(other) == backend()) {
    got = lookup_ok(to, all, 0);  // same backend: the helper handles device memory
  } else {
    REQUIRE(embstore_store_backend(other) == EMBSTORE_BACKEND_HOST);
    ok(embstore_lookup(to, all.data(), all.size(), got.data(), 0, nullptr));
  }
  REQUIRE(same_bits(got, expected));
}

TEST_CASE("a commit whose last fsync fails leaves no version behind", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  train_step(store, t, 1, 100);
  {
    embstore::io::set_commit_fault_injection(
        [](const char* step) { return std::strcmp(step, "fsync_parent") == 0 ? -EIO : 0; });
    struct Reset {
      ~Reset() { embstore::io::set_commit_fault_injection(nullptr); }
    } reset;
    uint64_t version = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
    require_status(embstore_checkpoint_wait(store, version), EMBSTORE_IO_ERROR, "commit");
  }
  REQUIRE_FALSE(fs::exists(version_dir(dir.path(), 1)));
  uint64_t v = 0;
  require_status(embstore_restore(store, dir.path().c_str(), EMBSTORE_LATEST, &v),
                 EMBSTORE_NOT_FOUND, "no committed checkpoint");
  REQUIRE(checkpoint_ok(store, dir.path()) == 1);  // the same step again, now committed
}

TEST_CASE("retention after a rollback keeps the new checkpoints", "[checkpoint]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.keep_full = 1;
  ok(embstore_checkpoint_set_policy(store, &p));
  for (uint64_t s = 100; s <= 300; s += 100) {
    train_step(store, t, s, 100, 16);
    checkpoint_ok(store, dir.path() + "/");  // another spelling of the policy's dir
  }
  REQUIRE_FALSE(fs::exists(version_dir(dir.path(), 200)));
  REQUIRE(fs::exists(version_dir(dir.path(), 300)));

  // Back to 300, then a checkpoint at an earlier step: it is kept, and 300 is not touched.
  REQUIRE(restore_ok(store, dir.path(), 300) == 300);
  t = get_table(store, "emb");
  train_step(store, t, 250, 100, 16);
  REQUIRE(checkpoint_ok(store, dir.path()) == 250);
  REQUIRE(fs::exists(version_dir(dir.path(), 250)));
  REQUIRE(fs::exists(version_dir(dir.path(), 300)));
}

TEST_CASE("a checkpoint completes while two threads train its table flat out", "[checkpoint]") {
  // Drain gives way to training calls, but only for a while: two trainers keep the table
  // wanted nearly all the time, and the rows they do not touch must still be written.
  TempDir dir;
  StoreGuard store(make_store(1));
  embstore_table_t* t = make_table(store, config_for("emb", 32, EMBSTORE_OPT_ADAGRAD));
  const std::vector<int64_t> all = key_range(50000);
  lookup_ok(t, all);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> calls{0};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto trainer = [&](int64_t base) {
    // Hot keys only: the cold rows are left to the drain.
    std::vector<int64_t> keys(64);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = base + static_cast<int64_t>(i);
    std::vector<float> grads(keys.size() * 32, 0.001f);
    while (!stop.load() && std::chrono::steady_clock::now() < deadline) {
      if (embstore_apply_gradients(t, keys.data(), grads.data(), keys.size(), nullptr) !=
          EMBSTORE_OK) {
        break;
      }
      calls.fetch_add(1);
    }
  };
  if (backend() != EMBSTORE_BACKEND_HOST) return;  // the trainers use host pointers
  std::thread a(trainer, int64_t{-100}), b(trainer, int64_t{100});
  while (calls.load() < 100) std::this_thread::yield();
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_FULL, &version));
  ok(embstore_checkpoint_wait(store, version));
  const bool trainers_were_running = std::chrono::steady_clock::now() < deadline;
  stop.store(true);
  a.join();
  b.join();
  REQUIRE(trainers_were_running);
  REQUIRE(read_rows(table_file(dir.path(), version, "emb")).size() == all.size());
}

namespace {

std::string delta_dir(const std::string& dir, uint64_t version) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020llu.delta", static_cast<unsigned long long>(version));
  return dir + "/" + name;
}

}  // namespace

TEST_CASE("a chain of deltas restores every version exactly", "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAM));
  no_rebaseline(store);
  const std::vector<int64_t> all = key_range(3000);
  std::map<uint64_t, std::vector<float>> at;
  std::map<uint64_t, uint64_t> rows_at;
  // Version 1 is full (no full in dir yet); then deltas, each on a few keys, new keys included.
  for (uint64_t s = 1; s <= 8; ++s) {
    train_step(store, t, s, 1000 + 250 * static_cast<int64_t>(s), 64);
    const uint64_t dirty = stats(t).dirty_rows;
    REQUIRE(incremental_ok(store, dir.path()) == s);
    REQUIRE(stats(t).dirty_rows == 0);
    at[s] = lookup_ok(t, all, 0);
    rows_at[s] = stats(t).rows;
    if (s == 1) {
      REQUIRE(fs::exists(version_dir(dir.path(), 1)));
    } else {
      REQUIRE(fs::exists(delta_dir(dir.path(), s)));
      const std::string file = delta_dir(dir.path(), s) + "/" + row_file("emb");
      REQUIRE(read_rows(file).size() == dirty);  // only what changed
    }
  }
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.committed == 8);
  REQUIRE(cs.deltas_committed == 7);

  for (uint64_t s = 1; s <= 8; ++s) {
    StoreGuard b(make_store());
    REQUIRE(restore_ok(b, dir.path(), s) == s);
    embstore_table_t* tb = get_table(b, "emb");
    REQUIRE(stats(tb).rows == rows_at[s]);
    REQUIRE(same_bits(lookup_ok(tb, all, 0), at[s]));
  }
  // Training goes on from a restored delta and extends the chain, once the store that wrote
  // it has let go of the directory (one writer per directory).
  train_step(store, t, 9, 3000, 64);
  const std::vector<float> at9 = lookup_ok(t, all, 0);
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 8);
  no_rebaseline(b);
  embstore_table_t* tb = get_table(b, "emb");
  train_step(b, tb, 9, 3000, 64);
  uint64_t v = 0;
  REQUIRE(embstore_checkpoint(b, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) ==
          EMBSTORE_BUSY);
  ok(embstore_store_destroy(store.store));
  store.store = nullptr;
  REQUIRE(incremental_ok(b, dir.path()) == 9);
  REQUIRE(fs::exists(delta_dir(dir.path(), 9)));
  StoreGuard c(make_store());
  restore_ok(c, dir.path(), 9);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), at9));
}

TEST_CASE("a broken or corrupt chain is reported, never loaded", "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_ADAGRAD));
  no_rebaseline(store);
  for (uint64_t s = 1; s <= 4; ++s) {
    train_step(store, t, s, 4000, 2000);
    incremental_ok(store, dir.path());
  }
  StoreGuard b(make_store());
  uint64_t v = 0;
  SECTION("a flipped byte in a middle delta") {
    flip_byte(delta_dir(dir.path(), 2) + "/" + row_file("emb"), 200);
    require_status(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &v), EMBSTORE_CORRUPT,
                   ("00000000000000000002.delta/" + row_file("emb")).c_str());
    REQUIRE(restore_ok(b, dir.path(), 1) == 1);  // the full alone is fine
  }
  SECTION("a truncated middle delta") {
    const std::string file = delta_dir(dir.path(), 3) + "/" + row_file("emb");
    fs::resize_file(file, fs::file_size(file) - 4096);
    require_status(embstore_restore(b, dir.path().c_str(), 4, &v), EMBSTORE_CORRUPT, "truncated");
  }
  SECTION("a missing link") {
    fs::remove_all(delta_dir(dir.path(), 2));
    require_status(embstore_restore(b, dir.path().c_str(), 4, &v), EMBSTORE_CORRUPT,
                   "chain is broken");
  }
  REQUIRE(embstore_store_backend(b) == backend());
}

TEST_CASE("incremental checkpoints rebaseline, follow their directory and are deferred",
          "[checkpoint][incremental]") {
  TempDir dir, other;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config_for("emb", 8, EMBSTORE_OPT_SGD));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.max_chain_length = 2;
  p.rebaseline_fraction = 0;
  ok(embstore_checkpoint_set_policy(store, &p));
  for (uint64_t s = 1; s <= 5; ++s) {
    train_step(store, t, s, 100, 16);
    incremental_ok(store, dir.path());
  }
  // 1 full (first), 2 and 3 deltas, 4 full (chain of 2 reached), 5 delta.
  REQUIRE(fs::exists(version_dir(dir.path(), 1)));
  REQUIRE(fs::exists(delta_dir(dir.path(), 3)));
  REQUIRE(fs::exists(version_dir(dir.path(), 4)));
  REQUIRE(fs::exists(delta_dir(dir.path(), 5)));

  // Another directory: its first incremental is a full one, and back in the first directory
  // the chain no longer holds the rows changed meanwhile, so that one is full too.
  train_step(store, t, 6, 100, 16);
  incremental_ok(store, other.path());
  REQUIRE(fs::exists(version_dir(other.path(), 6)));
  train_step(store, t, 7, 100, 16);
  incremental_ok(store, dir.path());
  REQUIRE(fs::exists(version_dir(dir.path(), 7)));

  // The policy: an incremental every 2 steps; one due while another is written is deferred.
  p.max_chain_length = 32;
  p.incremental_every_steps = 2;
  ok(embstore_checkpoint_set_policy(store, &p));
  {
    std::atomic<int> writes{0};
    FaultGuard slow([&](uint64_t, size_t) {
      if (writes.fetch_add(1) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return 0;
    });
    train_step(store, t, 8, 100, 16);   // due: a delta, slow
    train_step(store, t, 10, 100, 16);  // due, deferred
    ok(embstore_checkpoint_wait(store, 8));
    train_step(store, t, 11, 100, 16);  // the deferred one
    ok(embstore_checkpoint_wait(store, 11));
  }
  REQUIRE(fs::exists(delta_dir(dir.path(), 8)));
  REQUIRE(fs::exists(delta_dir(dir.path(), 11)));
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.deferred >= 1);
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 11);
  const std::vector<int64_t> all = key_range(100);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), lookup_ok(t, all, 0)));

  // The default rebaseline by bytes: once the deltas since the full outweigh half of it, the
  // next incremental is full. Every row changes each step here, so that is the second one.
  TempDir third;
  embstore_checkpoint_policy_init(&p);
  ok(embstore_checkpoint_set_policy(store, &p));
  train_step(store, t, 20, 100, 400);
  REQUIRE(incremental_ok(store, third.path()) == 20);  // full: first in dir
  train_step(store, t, 21, 100, 400);
  incremental_ok(store, third.path());
  REQUIRE(fs::exists(delta_dir(third.path(), 21)));
  train_step(store, t, 22, 100, 400);
  incremental_ok(store, third.path());
  REQUIRE(fs::exists(version_dir(third.path(), 22)));
}

TEST_CASE("a delta taken while training goes on holds the rows at its step",
          "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(small_staging_store());
  embstore_table_t* t = make_table(store, config_for("emb", 16, EMBSTORE_OPT_ADAGRAD));
  no_rebaseline(store);
  // Larger than the writer's first block plus the staging ring (about 15k rows of 136 bytes),
  // so rows of the delta are still captured while the writer is held.
  const int64_t keys = 40000;
  const std::vector<int64_t> all = key_range(keys);
  lookup_ok(t, all);
  REQUIRE(incremental_ok(store, dir.path()) == 0);  // the full base
  // Three quarters of the rows change before the delta's capture.
  std::vector<int64_t> half(all.begin(), all.begin() + 3 * keys / 4);
  apply_ok(t, half, std::vector<float>(half.size() * 16, 0.25f));
  ok(embstore_step(store, 1));
  const uint64_t dirty = stats(t).dirty_rows;
  REQUIRE(dirty == half.size());
  const std::vector<float> at_capture = lookup_ok(t, all, 0);

  HeldWriter held;
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &version));
  for (uint64_t s = 2; s <= 4; ++s) train_step(store, t, s, keys + 500, 1000);
  held.release();
  ok(embstore_checkpoint_wait(store, version));
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.copy_on_write_rows > 0);  // training met rows of the delta before they were written
  REQUIRE(fs::exists(delta_dir(dir.path(), 1)));
  const auto rows = read_rows(delta_dir(dir.path(), 1) + "/" + row_file("emb"));
  REQUIRE(rows.size() == dirty);
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), 1) == 1);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at_capture));
  REQUIRE(stats(get_table(b, "emb")).rows == static_cast<uint64_t>(keys));
}

TEST_CASE("a table that doubles twice under a full and a delta in flight restores bit-exactly",
          "[checkpoint][incremental]") {
  TempDir dir;
  StoreGuard store(small_staging_store());
  embstore_table_config_t c = config_for("emb", 16, EMBSTORE_OPT_ADAGRAD);
  c.initial_capacity = 16384;
  embstore_table_t* t = make_table(store, c);
  no_rebaseline(store);
  // Rows of each snapshot are still captured while its writer is held (see the test above),
  // and each growth round inserts three times the rows there were: the table doubles twice.
  int64_t keys = 16000;
  auto grow_and_train = [&](int64_t from, int64_t to, uint64_t step) {
    const uint64_t capacity = stats(t).capacity;
    std::vector<int64_t> fresh(static_cast<size_t>(to - from));
    for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = from + static_cast<int64_t>(i);
    lookup_ok(t, fresh);
    REQUIRE(stats(t).capacity >= 4 * capacity);
    // Captured rows change too: they are copied out before they are updated.
    train_step(store, t, step, 2 * keys, 2000);
  };
  // A checkpoint of `kind` at the current step `version`, held in flight while the table grows.
  auto checkpoint_while_growing = [&](embstore_ckpt_kind_t kind, uint64_t version) {
    HeldWriter held;
    uint64_t got = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), kind, &got));
    REQUIRE(got == version);
    grow_and_train(keys, 4 * keys, version + 1);
    held.release();
    ok(embstore_checkpoint_wait(store, version));
  };

  lookup_ok(t, key_range(keys));
  ok(embstore_step(store, 1));
  const std::vector<float> at_full = lookup_ok(t, key_range(keys), 0);
  checkpoint_while_growing(EMBSTORE_CKPT_FULL, 1);
  keys *= 4;
  train_step(store, t, 3, keys, 4000);
  const uint64_t rows_at_delta = stats(t).rows;
  const std::vector<int64_t> all = key_range(keys);
  const std::vector<float> at_delta = lookup_ok(t, all, 0);
  checkpoint_while_growing(EMBSTORE_CKPT_INCREMENTAL, 3);
  embstore_checkpoint_stats_t cs;
  cs.struct_size = sizeof(cs);
  ok(embstore_checkpoint_stats(store, &cs));
  REQUIRE(cs.copy_on_write_rows > 0);
  REQUIRE(fs::exists(delta_dir(dir.path(), 3)));

  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), 1) == 1);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), key_range(keys / 4), 0), at_full));
  REQUIRE(stats(get_table(b, "emb")).rows == static_cast<uint64_t>(keys / 4));
  REQUIRE(restore_ok(b, dir.path(), 3) == 3);
  REQUIRE(same_bits(lookup_ok(get_table(b, "emb"), all, 0), at_delta));
  REQUIRE(stats(get_table(b, "emb")).rows == rows_at_delta);
}

namespace {

// What the child of the kill test tells its parent through a pipe.
struct ChildNote {
  char tag = 0;  // 'C': the delta is captured (a = version, b = rows captured, c = parent);
                 // 'H': its writer is held at its second write (a = offset, b = bytes)
  uint64_t a = 0, b = 0, c = 0, kind = 0;
};

// Reads one note, waiting at most until deadline; false on EOF, error or timeout.
bool read_note(int fd, ChildNote* note, std::chrono::steady_clock::time_point deadline) {
  char* p = reinterpret_cast<char*>(note);
  size_t got = 0;
  while (got < sizeof(*note)) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd pfd{fd, POLLIN, 0};
    const int r = poll(&pfd, 1, static_cast<int>(left.count()));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    const ssize_t n = read(fd, p + got, sizeof(*note) - got);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    got += static_cast<size_t>(n);
  }
  return true;
}

// The child's record of its table at a committed version: its row count, then the values of
// the keys of key_range(keys).
bool write_state(const std::string& path, embstore_table_t* t, int64_t keys) {
  const std::vector<int64_t> all = key_range(keys);
  std::vector<float> values(all.size() * embstore_table_dim(t));
  embstore_table_stats_t st;
  std::memset(&st, 0, sizeof(st));
  st.struct_size = sizeof(st);
  if (embstore_lookup(t, all.data(), all.size(), values.data(), 0, nullptr) != EMBSTORE_OK ||
      embstore_table_stats(t, &st) != EMBSTORE_OK) {
    return false;
  }
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool written = std::fwrite(&st.rows, sizeof(st.rows), 1, f) == 1 &&
                       std::fwrite(values.data(), sizeof(float), values.size(), f) == values.size();
  return std::fclose(f) == 0 && written;
}

void read_state(const std::string& path, uint64_t* rows, std::vector<float>* values) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in.good());
  in.read(reinterpret_cast<char*>(rows), sizeof(*rows));
  in.read(reinterpret_cast<char*>(values->data()),
          static_cast<std::streamsize>(values->size() * sizeof(float)));
  REQUIRE(in.gcount() == static_cast<std::streamsize>(values->size() * sizeof(float)));
  REQUIRE(in.peek() == std::char_traits<char>::eof());
}

}  // namespace

TEST_CASE("a kill while a delta checkpoint is written leaves the last committed delta to restore",
          "[checkpoint][incremental]") {
  // The child runs the host backend (a CUDA context does not survive fork()) and makes no
  // Catch assertion: it ends with an exit code the parent reports. It commits a full at 10 and
  // deltas at 20 and 30, records its table at each, then starts the delta of 40 and holds its
  // writer at the second write, so that the first block is out and the rest of the delta's
  // rows are in flight, and says so through a pipe. The parent kills it there.
  TempDir dir, notes;
  constexpr uint32_t kDim = 32;
  auto keys_at = [](uint64_t step) { return 3000 + 100 * static_cast<int64_t>(step); };
  const int64_t kAllKeys = keys_at(40);  // every key any step drew, new keys in each delta
  auto state_file = [&](uint64_t v) { return notes.file("at-" + std::to_string(v)); };
  int pipe_fds[2];
  REQUIRE(pipe(pipe_fds) == 0);
  const pid_t parent = getpid();
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    die_with_parent(parent);
    close(pipe_fds[0]);
    const int out = pipe_fds[1];
    embstore_store_config_t sc;
    embstore_store_config_init(&sc);
    sc.backend = EMBSTORE_BACKEND_HOST;
    embstore_store_t* store = nullptr;
    embstore_table_t* t = nullptr;
    const embstore_table_config_t c = config_for("emb", kDim, EMBSTORE_OPT_ADAM);
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.max_chain_length = 0;  // keep the chain: every incremental after the first is a delta
    p.rebaseline_fraction = 0;
    if (embstore_store_create(&sc, &store) != EMBSTORE_OK ||
        embstore_table_create(store, &c, &t) != EMBSTORE_OK ||
        embstore_checkpoint_set_policy(store, &p) != EMBSTORE_OK) {
      _exit(3);
    }
    auto train = [&](uint64_t from, uint64_t to) {
      for (uint64_t s = from; s <= to; ++s) {
        if (!host_train_step(store, t, s, keys_at(s), 2000)) _exit(4);
      }
    };
    for (uint64_t v = 10; v <= 30; v += 10) {
      train(v - 9, v);
      uint64_t got = 0;
      if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &got) !=
              EMBSTORE_OK ||
          got != v || embstore_checkpoint_wait(store, v) != EMBSTORE_OK) {
        _exit(5);
      }
      if (!write_state(state_file(v), t, kAllKeys)) _exit(6);
    }
    train(31, 40);
    embstore::io::set_fault_injection([out](uint64_t offset, size_t bytes) {
      static int writes = 0;  // the hook runs under io/'s lock
      if (++writes == 2) {
        ChildNote n;
        n.tag = 'H';
        n.a = offset;
        n.b = bytes;
        if (write(out, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) _exit(8);
        for (;;) pause();
      }
      return 0;
    });
    uint64_t v = 0;
    if (embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &v) !=
        EMBSTORE_OK) {
      _exit(7);
    }
    embstore_checkpoint_info_t info;
    std::memset(&info, 0, sizeof(info));
    info.struct_size = sizeof(info);
    if (embstore_checkpoint_info(store, v, &info) != EMBSTORE_OK) _exit(7);
    ChildNote n;
    n.tag = 'C';
    n.a = v;
    n.b = info.rows_captured;
    n.c = info.parent;
    n.kind = static_cast<uint64_t>(info.kind);
    if (write(out, &n, sizeof(n)) != static_cast<ssize_t>(sizeof(n))) _exit(8);
    embstore_checkpoint_wait(store, v);  // never returns: the writer is held
    _exit(9);
  }
  close(pipe_fds[1]);
  ChildNote captured, held;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (int i = 0; i < 2; ++i) {
    ChildNote n;
    if (!read_note(pipe_fds[0], &n, deadline)) break;
    (n.tag == 'C' ? captured : held) = n;
  }
  close(pipe_fds[0]);
  kill(child, SIGKILL);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  INFO("child exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1));
  REQUIRE(WIFSIGNALED(status));
  REQUIRE(WTERMSIG(status) == SIGKILL);
  // It died mid-delta: version 40 captured as a delta on 30, its first block submitted.
  REQUIRE(captured.tag == 'C');
  REQUIRE(held.tag == 'H');
  REQUIRE(captured.a == 40);
  REQUIRE(captured.kind == EMBSTORE_CKPT_INCREMENTAL);
  REQUIRE(captured.c == 30);
  REQUIRE(captured.b > 0);
  REQUIRE(held.a > 0);  // a second write: the first block was not all of the delta

  // On disk: 10, 20 and 30, and only a temporary directory of 40 without a manifest.
  std::vector<embstore::io::VersionDir> versions;
  REQUIRE(embstore::io::list_versions(dir.path(), &versions) == 0);
  REQUIRE(versions.size() == 3);
  for (size_t i = 0; i < versions.size(); ++i) {
    REQUIRE(versions[i].version == 10 * (i + 1));
    REQUIRE(versions[i].full == (i == 0));
  }
  size_t leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir.path())) {
    const std::string name = e.path().filename().string();
    if (std::any_of(versions.begin(), versions.end(),
                    [&](const embstore::io::VersionDir& v) { return v.name == name; }) ||
        name == embstore::io::kLockFileName) {
      continue;
    }
    INFO(name);
    REQUIRE(name.rfind(".tmp-40-", 0) == 0);
    REQUIRE(fs::exists(e.path() / row_file("emb")));
    REQUIRE_FALSE(fs::exists(e.path() / "MANIFEST.json"));
    ++leftovers;
  }
  REQUIRE(leftovers == 1);

  // Every committed version restores to what the child had at it; 40 does not exist.
  const std::vector<int64_t> all = key_range(kAllKeys);
  std::map<uint64_t, std::vector<float>> want;
  std::map<uint64_t, uint64_t> want_rows;
  for (uint64_t v = 10; v <= 30; v += 10) {
    want[v].resize(all.size() * kDim);
    read_state(state_file(v), &want_rows[v], &want[v]);
  }
  REQUIRE_FALSE(same_bits(want[20], want[30]));
  REQUIRE(want_rows[20] < want_rows[30]);
  for (uint64_t v = 10; v <= 20; v += 10) {
    StoreGuard s(make_store());
    REQUIRE(restore_ok(s, dir.path(), v) == v);
    REQUIRE(stats(get_table(s, "emb")).rows == want_rows[v]);
    REQUIRE(same_bits(lookup_ok(get_table(s, "emb"), all, 0), want[v]));
  }
  StoreGuard b(make_store());
  REQUIRE(restore_ok(b, dir.path(), EMBSTORE_LATEST) == 30);
  embstore_table_t* tb = get_table(b, "emb");
  REQUIRE(stats(tb).rows == want_rows[30]);
  REQUIRE(same_bits(lookup_ok(tb, all, 0), want[30]));
  uint64_t v = 0;
  require_status(embstore_restore(b, dir.path().c_str(), 40, &v), EMBSTORE_NOT_FOUND, "40");

  // The restored store extends the chain in the same directory: 40 again, as a delta on 30,
  // and the leftover is gone.
  no_rebaseline(b);
  for (uint64_t s = 31; s <= 40; ++s) train_step(b, tb, s, keys_at(s), 2000);
  REQUIRE(incremental_ok(b, dir.path()) == 40);
  embstore_checkpoint_info_t info;
  std::memset(&info, 0, sizeof(info));
  info.struct_size = sizeof(info);
  ok(embstore_checkpoint_info(b, 40, &info));
  REQUIRE(info.kind == EMBSTORE_CKPT_INCREMENTAL);
  REQUIRE(info.parent == 30);
  REQUIRE(info.rows_captured == captured.b);  // the same keys as the killed delta's
  REQUIRE(fs::exists(delta_dir(dir.path(), 40)));
  REQUIRE(embstore::io::list_versions(dir.path(), &versions) == 0);
  REQUIRE(versions.size() == 4);
  for (const auto& e : fs::directory_iterator(dir.path())) {
    REQUIRE(e.path().filename().string().rfind(".tmp-", 0) != 0);
  }
  StoreGuard c(make_store());
  REQUIRE(restore_ok(c, dir.path(), EMBSTORE_LATEST) == 40);
  REQUIRE(stats(get_table(c, "emb")).rows == stats(tb).rows);
  REQUIRE(same_bits(lookup_ok(get_table(c, "emb"), all, 0), lookup_ok(tb, all, 0)));
}

namespace {

// One of the two stores of the two-directory test: its tables, its own key stream and steps.
struct TwinRun {
  std::string dir;
  uint64_t seed = 0;
  uint64_t first_step = 0;
  int64_t key_base = 0;
  std::vector<embstore_table_config_t> configs;  // names are string literals
};

// What a run's thread saw at one of its checkpoints, right after the capture.
struct TwinVersion {
  uint64_t version = 0;
  embstore_ckpt_kind_t kind = EMBSTORE_CKPT_FULL;
  uint32_t in_flight = 0;
  std::vector<std::vector<float>> values;  // per table, of twin_all_keys
  std::vector<uint64_t> rows;              // per table
};

// Rounds of 3 steps, a checkpoint (the first full, then deltas) and a 4th step while it is
// written (none after the last).
constexpr int kTwinRounds = 5;
constexpr size_t kTwinBatch = 512;

// Table i draws keys from [base + 100000 i, + twin_keys(local step)): new keys at every step.
int64_t twin_keys(uint64_t local_step) { return 2000 + 40 * static_cast<int64_t>(local_step); }

// Every key table i of run draws in its steps (and the 2 after), and a few it never draws.
std::vector<int64_t> twin_all_keys(const TwinRun& run, size_t i) {
  const int64_t n = twin_keys(4 * kTwinRounds) + 16;
  std::vector<int64_t> k(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    k[static_cast<size_t>(j)] = run.key_base + 100000 * static_cast<int64_t>(i) + j;
  }
  return k;
}

// The helpers' device copies assert on CUDA, and Catch's assertions are not thread-safe: the
// threads of a test take this around them there. On the host they assert nothing.
std::mutex g_helper_mutex;

std::unique_lock<std::mutex> helper_lock() {
  std::unique_lock<std::mutex> lock(g_helper_mutex, std::defer_lock);
  if (backend() != EMBSTORE_BACKEND_HOST) lock.lock();
  return lock;
}

// One training step of run, for threads: no assertion. Returns the error, or "".
std::string twin_step(const TwinRun& run, embstore_store_t* store,
                      const std::vector<embstore_table_t*>& tables, uint64_t step) {
  const uint64_t local = step - run.first_step;
  for (size_t i = 0; i < tables.size(); ++i) {
    std::mt19937_64 rng(run.seed * 1000003 + step * 7919 + i);
    const uint32_t dim = embstore_table_dim(tables[i]);
    std::vector<int64_t> k(kTwinBatch);
    for (auto& x : k) {
      x = run.key_base + 100000 * static_cast<int64_t>(i) +
          static_cast<int64_t>(rng() % static_cast<uint64_t>(twin_keys(local)));
    }
    std::vector<float> g(k.size() * dim);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& x : g) x = u(rng);
    std::vector<float> out;
    auto lock = helper_lock();
    if (lookup(tables[i], k, EMBSTORE_LOOKUP_INSERT, &out) != EMBSTORE_OK ||
        apply_gradients(tables[i], k, g) != EMBSTORE_OK) {
      return "step " + std::to_string(step) + ": " + embstore_last_error();
    }
  }
  if (embstore_step(store, step) != EMBSTORE_OK) {
    return "embstore_step " + std::to_string(step) + ": " + embstore_last_error();
  }
  return "";
}

}  // namespace

// Under ThreadSanitizer this test can report races inside liburing.h (io_uring_prep_rw,
// __io_uring_peek_cqe) between the two stores' workers. They are not races: liburing 2.3 maps
// its rings with raw syscalls that TSan does not see, so a ring of one store mapped where a
// closed ring of the other was looks like shared memory. Run it with a suppression
// (TSAN_OPTIONS=suppressions=FILE, FILE holding "race:liburing.h").
TEST_CASE("two stores checkpoint into two directories at once and each restores its own",
          "[checkpoint][incremental]") {
  TempDir da, db;
  // Different tables (one name in common, of another shape), seeds, keys and steps.
  std::vector<TwinRun> runs(2);
  runs[0].dir = da.path();
  runs[0].seed = 11;
  runs[0].first_step = 1;
  runs[0].key_base = -500000;
  runs[0].configs = {config_for("alpha", 8, EMBSTORE_OPT_ADAM),
                     config_for("emb", 4, EMBSTORE_OPT_ADAGRAD)};
  runs[1].dir = db.path();
  runs[1].seed = 29;
  runs[1].first_step = 1001;
  runs[1].key_base = 700000;
  runs[1].configs = {config_for("beta", 12, EMBSTORE_OPT_ROWWISE_ADAGRAD),
                     config_for("emb", 6, EMBSTORE_OPT_SGD)};
  for (auto& c : runs[1].configs) c.seed = 99;
  // Shallow writer queues: registering their buffers costs more than these small tables take
  // to write, and this test takes 14 checkpoints and 10 restores.
  auto twin_store = [] {
    embstore_store_config_t c;
    embstore_store_config_init(&c);
    c.io_queue_depth = 2;
    c.staging_bytes = size_t{16} << 20;
    return make_store(c);
  };
  StoreGuard sa(twin_store()), sb(twin_store());
  embstore_store_t* stores[2] = {sa, sb};
  std::vector<embstore_table_t*> tables[2];
  for (size_t r = 0; r < 2; ++r) {
    for (const auto& c : runs[r].configs) tables[r].push_back(make_table(stores[r], c));
    no_rebaseline(stores[r]);
  }

  std::vector<TwinVersion> recorded[2];
  std::mutex errors_mutex;
  std::vector<std::string> errors;
  // The first checkpoints of both stores are held at their first write until both are in
  // flight: the two pipelines run at the same time. (The write hook is global to the process
  // and called under a lock, so one write waits at the gate and the other behind it.)
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool gate_open = false;
  int in_flight = 0;
  bool both_in_flight = false;
  {
    FaultGuard gate([&](uint64_t, size_t) {
      std::unique_lock lock(gate_mutex);
      gate_cv.wait_for(lock, std::chrono::seconds(20), [&] { return gate_open; });
      return 0;
    });
    std::barrier round_start(2);
    auto body = [&](size_t r) {
      const TwinRun& run = runs[r];
      embstore_store_t* store = stores[r];
      for (int round = 0; round < kTwinRounds; ++round) {
        round_start.arrive_and_wait();
        const uint64_t base = run.first_step + 4 * static_cast<uint64_t>(round);
        std::string e;
        for (uint64_t s = base; s < base + 3 && e.empty(); ++s) {
          e = twin_step(run, store, tables[r], s);
        }
        TwinVersion rec;
        if (e.empty() &&
            embstore_checkpoint(store, run.dir.c_str(),
                                round == 0 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL,
                                &rec.version) != EMBSTORE_OK) {
          e = std::string("checkpoint: ") + embstore_last_error();
        }
        if (e.empty()) {
          embstore_checkpoint_info_t info;
          std::memset(&info, 0, sizeof(info));
          info.struct_size = sizeof(info);
          if (embstore_checkpoint_info(store, rec.version, &info) != EMBSTORE_OK) e = "info";
          rec.kind = info.kind;
          rec.in_flight = info.in_flight;
          for (size_t i = 0; i < tables[r].size() && e.empty(); ++i) {
            embstore_table_stats_t st;
            std::memset(&st, 0, sizeof(st));
            st.struct_size = sizeof(st);
            std::vector<float> values;
            auto lock = helper_lock();
            if (lookup(tables[r][i], twin_all_keys(run, i), 0, &values) != EMBSTORE_OK ||
                embstore_table_stats(tables[r][i], &st) != EMBSTORE_OK) {
              e = std::string("lookup: ") + embstore_last_error();
            }
            rec.values.push_back(std::move(values));
            rec.rows.push_back(st.rows);
          }
        }
        if (round == 0) {
          {
            std::lock_guard lock(gate_mutex);
            ++in_flight;
          }
          gate_cv.notify_all();
        }
        // Training goes on while the checkpoint is written.
        if (e.empty() && round + 1 < kTwinRounds) e = twin_step(run, store, tables[r], base + 3);
        if (e.empty() && embstore_checkpoint_wait(store, rec.version) != EMBSTORE_OK) {
          e = "wait " + std::to_string(rec.version) + ": " + embstore_last_error();
        }
        if (!e.empty()) {
          {
            std::lock_guard lock(errors_mutex);
            errors.push_back("store " + std::to_string(r) + ": " + e);
          }
          round_start.arrive_and_drop();
          return;
        }
        recorded[r].push_back(std::move(rec));
      }
    };
    std::thread ta(body, size_t{0}), tb(body, size_t{1});
    {
      std::unique_lock lock(gate_mutex);
      both_in_flight =
          gate_cv.wait_for(lock, std::chrono::seconds(20), [&] { return in_flight == 2; });
      gate_open = true;
    }
    gate_cv.notify_all();
    ta.join();
    tb.join();
  }
  for (const auto& e : errors) UNSCOPED_INFO(e);
  REQUIRE(errors.empty());
  REQUIRE(both_in_flight);

  for (size_t r = 0; r < 2; ++r) {
    const TwinRun& run = runs[r];
    const TwinRun& other = runs[1 - r];
    const std::vector<TwinVersion>& recs = recorded[r];
    INFO("store " << r << ", directory " << run.dir);
    REQUIRE(recs.size() == static_cast<size_t>(kTwinRounds));
    REQUIRE(recs[0].in_flight == 1);  // while the other store's was too
    embstore_checkpoint_stats_t cs;
    cs.struct_size = sizeof(cs);
    ok(embstore_checkpoint_stats(stores[r], &cs));
    REQUIRE(cs.committed == static_cast<uint64_t>(kTwinRounds));
    REQUIRE(cs.deltas_committed == static_cast<uint64_t>(kTwinRounds - 1));
    REQUIRE(cs.failed == 0);

    // The directory holds this store's versions, each with this store's tables, and nothing
    // else: no version, table or leftover of the other store.
    std::vector<embstore::io::VersionDir> versions;
    REQUIRE(embstore::io::list_versions(run.dir, &versions) == 0);
    REQUIRE(versions.size() == recs.size());
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(run.dir)) {
      if (e.path().filename() != embstore::io::kLockFileName) ++entries;  // this store's lock
    }
    REQUIRE(entries == versions.size());
    const std::vector<std::string> want_names = {"MANIFEST.json", "tables"};
    std::vector<std::string> want_tables;
    for (const auto& c : run.configs) want_tables.push_back(c.name);
    std::sort(want_tables.begin(), want_tables.end());
    for (size_t i = 0; i < versions.size(); ++i) {
      REQUIRE(recs[i].version == run.first_step + 4 * i + 2);
      REQUIRE(versions[i].version == recs[i].version);
      REQUIRE(versions[i].full == (i == 0));
      REQUIRE(recs[i].kind == (i == 0 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL));
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(run.dir + "/" + versions[i].name)) {
        names.push_back(e.path().filename().string());
      }
      std::sort(names.begin(), names.end());
      REQUIRE(names == want_names);
      names.clear();
      for (const auto& e : fs::directory_iterator(run.dir + "/" + versions[i].name + "/tables")) {
        names.push_back(e.path().filename().string());
      }
      std::sort(names.begin(), names.end());
      REQUIRE(names == want_tables);
    }

    // Each version restores into a fresh store as this store had it.
    for (size_t k = 0; k < recs.size(); ++k) {
      const TwinVersion& rec = recs[k];
      INFO("version " << rec.version);
      StoreGuard fresh(twin_store());
      REQUIRE(restore_ok(fresh, run.dir, rec.version) == rec.version);
      std::vector<embstore_table_t*> fresh_tables;
      for (size_t i = 0; i < run.configs.size(); ++i) {
        INFO("table " << run.configs[i].name);
        embstore_table_t* t = get_table(fresh, run.configs[i].name);
        fresh_tables.push_back(t);
        REQUIRE(embstore_table_dim(t) == run.configs[i].dim);
        REQUIRE(stats(t).rows == rec.rows[i]);
        REQUIRE(same_bits(lookup_ok(t, twin_all_keys(run, i), 0), rec.values[i]));
        if (k > 0) REQUIRE_FALSE(same_bits(rec.values[i], recs[k - 1].values[i]));
      }
      embstore_table_t* absent = nullptr;
      require_status(embstore_table_get(fresh, other.configs[0].name, &absent), EMBSTORE_NOT_FOUND);
      if (k + 1 < recs.size()) {
        // The optimizer state came back too: the store's steps from here reach its next
        // version exactly.
        const TwinVersion& next = recs[k + 1];
        for (uint64_t s = rec.version + 1; s <= next.version; ++s) {
          REQUIRE(twin_step(run, fresh, fresh_tables, s).empty());
        }
        for (size_t i = 0; i < run.configs.size(); ++i) {
          REQUIRE(stats(fresh_tables[i]).rows == next.rows[i]);
          REQUIRE(same_bits(lookup_ok(fresh_tables[i], twin_all_keys(run, i), 0), next.values[i]));
        }
        continue;
      }
      // The latest is where the store stopped: full checkpoints of both hold the same rows,
      // values and optimizer state, and training goes on identically.
      TempDir of_fresh, of_store;
      REQUIRE(checkpoint_ok(fresh, of_fresh.path()) == rec.version);
      REQUIRE(checkpoint_ok(stores[r], of_store.path()) == rec.version);
      for (const auto& c : run.configs) {
        const auto rows = read_rows(table_file(of_fresh.path(), rec.version, c.name));
        REQUIRE(rows.size() == stats(get_table(fresh, c.name)).rows);
        REQUIRE(rows == read_rows(table_file(of_store.path(), rec.version, c.name)));
      }
      for (uint64_t s = rec.version + 1; s <= rec.version + 2; ++s) {
        REQUIRE(twin_step(run, fresh, fresh_tables, s).empty());
        REQUIRE(twin_step(run, stores[r], tables[r], s).empty());
      }
      for (size_t i = 0; i < run.configs.size(); ++i) {
        const std::vector<int64_t> all = twin_all_keys(run, i);
        const std::vector<float> after = lookup_ok(fresh_tables[i], all, 0);
        REQUIRE_FALSE(same_bits(after, rec.values[i]));
        REQUIRE(same_bits(after, lookup_ok(tables[r][i], all, 0)));
      }
    }
  }
}
