// The invariant of the checkpoint API: embstore_checkpoint_wait returns OK only for a version
// that embstore_restore loads, with the tables as they were at its step. The four ways it was
// broken (issue 13), each reproduced, then a random walk of steps (forwards and backwards),
// checkpoints of both kinds, attachments and restores that restores every version reported OK.
#include <embstore/embstore.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "io/format/dir_lock.hpp"
#include "support/backend.hpp"
#include "support/checkpoint_helpers.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_test;
namespace fs = std::filesystem;

namespace {

void require_status(embstore_status_t got, embstore_status_t want, const std::string& mentions) {
  INFO("last_error: " << embstore_last_error());
  REQUIRE(std::string(embstore_status_name(got)) == embstore_status_name(want));
  REQUIRE(std::string(embstore_last_error()).find(mentions) != std::string::npos);
}

std::vector<int64_t> keys_upto(int64_t n) {
  std::vector<int64_t> k(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) k[static_cast<size_t>(i)] = i;
  return k;
}

// Inserts and updates keys [0, keys) with gradients drawn from seed.
void train(embstore_table_t* t, uint64_t seed, int64_t keys) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> k = keys_upto(keys);
  std::shuffle(k.begin(), k.end(), rng);
  k.resize(static_cast<size_t>(keys / 2 + 1));
  lookup_ok(t, k);
  std::vector<float> g(k.size() * embstore_table_dim(t));
  std::uniform_real_distribution<float> u(-1, 1);
  for (float& x : g) x = u(rng);
  apply_ok(t, k, g);
}

uint64_t checkpoint_ok(embstore_store_t* s, const std::string& dir, embstore_ckpt_kind_t kind) {
  uint64_t v = 0;
  require_ok(embstore_checkpoint(s, dir.c_str(), kind, &v));
  require_ok(embstore_checkpoint_wait(s, v));
  return v;
}

embstore_ckpt_kind_t kind_of(embstore_store_t* s, uint64_t version) {
  embstore_checkpoint_info_t info;
  info.struct_size = sizeof info;
  require_ok(embstore_checkpoint_info(s, version, &info));
  return info.kind;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The values of keys [0, keys) of table name after restoring version from dir.
std::vector<float> restored_values(const std::string& dir, uint64_t version, const char* name,
                                   int64_t keys) {
  StoreGuard s(make_store());
  uint64_t got = 0;
  require_ok(embstore_restore(s, dir.c_str(), version, &got));
  REQUIRE(got == version);
  embstore_table_t* t = nullptr;
  require_ok(embstore_table_get(s, name, &t));
  return lookup_ok(t, keys_upto(keys), 0);
}

}  // namespace

TEST_CASE("two stores of one process cannot write one directory", "[checkpoint][invariant]") {
  TempDir dir;
  StoreGuard x(make_store()), y(make_store());
  embstore_table_t* tx = make_table(x, table_config("emb", 4));
  embstore_table_t* ty = make_table(y, table_config("emb", 4));
  train(tx, 1, 100);
  train(ty, 2, 100);
  require_ok(embstore_step(x, 10));
  require_ok(embstore_step(y, 10));
  const std::vector<float> x_at_10 = lookup_ok(tx, keys_upto(100), 0);
  REQUIRE(checkpoint_ok(x, dir.path(), EMBSTORE_CKPT_FULL) == 10);
  // The second writer is refused before it touches anything, with the owner named.
  uint64_t v = 0;
  require_status(embstore_checkpoint(y, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v), EMBSTORE_BUSY,
                 "is locked by another writer: pid " + std::to_string(::getpid()));
  embstore_checkpoint_policy_t p;
  embstore_checkpoint_policy_init(&p);
  p.dir = dir.path().c_str();
  p.full_every_steps = 1;
  require_status(embstore_checkpoint_set_policy(y, &p), EMBSTORE_BUSY, "one writer per directory");
  // X's version is intact and restores as X had it.
  REQUIRE(same_bits(restored_values(dir.path(), 10, "emb", 100), x_at_10));
  // X goes on writing; Y may write once X has let go.
  require_ok(embstore_step(x, 11));
  REQUIRE(checkpoint_ok(x, dir.path(), EMBSTORE_CKPT_INCREMENTAL) == 11);
  require_ok(embstore_store_destroy(x.store));
  x.store = nullptr;
  require_ok(embstore_step(y, 12));
  REQUIRE(checkpoint_ok(y, dir.path(), EMBSTORE_CKPT_INCREMENTAL) == 12);
  REQUIRE(kind_of(y, 12) == EMBSTORE_CKPT_FULL);  // Y's chain is not in dir
  REQUIRE(same_bits(restored_values(dir.path(), 10, "emb", 100), x_at_10));
  REQUIRE(same_bits(restored_values(dir.path(), 12, "emb", 100), lookup_ok(ty, keys_upto(100), 0)));
}

TEST_CASE("another process's directory is refused until it dies", "[checkpoint][invariant]") {
  // The child runs the host backend (a CUDA context does not survive fork()).
  TempDir dir;
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  const pid_t parent = ::getpid();
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    die_with_parent(parent);
    ::close(ready[0]);
    embstore_store_config_t c;
    embstore_store_config_init(&c);
    c.backend = EMBSTORE_BACKEND_HOST;
    embstore_store_t* s = nullptr;
    embstore_table_config_t tc = table_config("emb", 4);
    embstore_table_t* t = nullptr;
    uint64_t v = 0;
    const int64_t key = 1;
    float value[4];
    const bool ok =
        embstore_store_create(&c, &s) == EMBSTORE_OK &&
        embstore_table_create(s, &tc, &t) == EMBSTORE_OK &&
        embstore_lookup(t, &key, 1, value, EMBSTORE_LOOKUP_INSERT, nullptr) == EMBSTORE_OK &&
        embstore_step(s, 5) == EMBSTORE_OK &&
        embstore_checkpoint(s, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v) == EMBSTORE_OK &&
        embstore_checkpoint_wait(s, v) == EMBSTORE_OK;
    const char said = ok ? 'y' : 'n';
    if (::write(ready[1], &said, 1) != 1) ::_exit(2);
    for (;;) ::pause();  // holds the directory until killed
  }
  ::close(ready[1]);
  char said = 0;
  REQUIRE(::read(ready[0], &said, 1) == 1);
  ::close(ready[0]);
  REQUIRE(said == 'y');

  StoreGuard s(make_store());
  embstore_table_t* t = make_table(s, table_config("emb", 4));
  train(t, 3, 50);
  require_ok(embstore_step(s, 6));
  uint64_t v = 0;
  require_status(embstore_checkpoint(s, dir.path().c_str(), EMBSTORE_CKPT_FULL, &v), EMBSTORE_BUSY,
                 "pid " + std::to_string(child));
  ::kill(child, SIGKILL);  // a crash: the kernel lets go of its lock
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  REQUIRE(checkpoint_ok(s, dir.path(), EMBSTORE_CKPT_FULL) == 6);
  REQUIRE(restored_values(dir.path(), 5, "emb", 1).size() == 4);  // the child's version too
  REQUIRE(same_bits(restored_values(dir.path(), 6, "emb", 50), lookup_ok(t, keys_upto(50), 0)));
}

TEST_CASE("a step that went backwards takes a delta as a full checkpoint",
          "[checkpoint][invariant]") {
  TempDir dir;
  StoreGuard s(make_store());
  no_rebaseline(s);
  embstore_table_t* t = make_table(s, table_config("emb", 4));
  train(t, 1, 100);
  require_ok(embstore_step(s, 10));
  REQUIRE(checkpoint_ok(s, dir.path(), EMBSTORE_CKPT_FULL) == 10);
  require_ok(embstore_step(s, 5));
  train(t, 2, 100);
  REQUIRE(checkpoint_ok(s, dir.path(), EMBSTORE_CKPT_INCREMENTAL) == 5);
  embstore_checkpoint_info_t info;
  info.struct_size = sizeof info;
  require_ok(embstore_checkpoint_info(s, 5, &info));
  REQUIRE(info.kind == EMBSTORE_CKPT_FULL);
  REQUIRE(info.parent == EMBSTORE_LATEST);
  const std::vector<float> at5 = lookup_ok(t, keys_upto(100), 0);
  REQUIRE(same_bits(restored_values(dir.path(), 5, "emb", 100), at5));
  // The chain goes on from 5.
  require_ok(embstore_step(s, 7));
  train(t, 3, 100);
  REQUIRE(checkpoint_ok(s, dir.path(), EMBSTORE_CKPT_INCREMENTAL) == 7);
  require_ok(embstore_checkpoint_info(s, 7, &info));
  REQUIRE(info.kind == EMBSTORE_CKPT_INCREMENTAL);
  REQUIRE(info.parent == 5);
  REQUIRE(same_bits(restored_values(dir.path(), 7, "emb", 100), lookup_ok(t, keys_upto(100), 0)));
}

TEST_CASE("table and attachment names that collided in format 1 restore apart",
          "[checkpoint][invariant]") {
  TempDir dir;
  StoreGuard s(make_store());
  embstore_table_t* a = make_table(s, table_config("attachments", 4));
  embstore_table_t* m = make_table(s, table_config("MANIFEST.json", 3));
  embstore_table_t* t = make_table(s, table_config("tables", 2));
  train(a, 1, 64);
  train(m, 2, 64);
  train(t, 3, 64);
  const std::string blob(5000, 'z');
  require_ok(embstore_checkpoint_attach(s, "shard-00000-of-00001.rows", blob.data(), blob.size()));
  require_ok(embstore_checkpoint_attach(s, "MANIFEST.json", "m", 1));
  require_ok(embstore_checkpoint_attach(s, "admission.counts", "c", 1));
  require_ok(embstore_step(s, 3));
  REQUIRE(checkpoint_ok(s, dir.path(), EMBSTORE_CKPT_FULL) == 3);
  StoreGuard r(make_store());
  uint64_t got = 0;
  require_ok(embstore_restore(r, dir.path().c_str(), 3, &got));
  for (auto [name, table] : {std::pair<const char*, embstore_table_t*>{"attachments", a},
                             {"MANIFEST.json", m},
                             {"tables", t}}) {
    INFO(name);
    embstore_table_t* back = nullptr;
    require_ok(embstore_table_get(r, name, &back));
    REQUIRE(same_bits(lookup_ok(back, keys_upto(64), 0), lookup_ok(table, keys_upto(64), 0)));
  }
  std::string data(blob.size(), '\0');
  size_t bytes = 0;
  require_ok(embstore_restore_attachment(r, "shard-00000-of-00001.rows", data.data(), data.size(),
                                         &bytes));
  REQUIRE(data == blob);
  char c = 0;
  require_ok(embstore_restore_attachment(r, "MANIFEST.json", &c, 1, &bytes));
  REQUIRE(c == 'm');
}

TEST_CASE("every version reported OK restores as it was, whatever the steps do",
          "[checkpoint][invariant]") {
  // A random walk: steps forwards and backwards, full and incremental checkpoints, attachments,
  // restores of earlier versions that training then goes on from. Every version whose wait
  // returned OK is restored at the end and compared with the tables at its step.
  TempDir dir;
  const int64_t keys = 300;
  std::mt19937_64 rng(GENERATE(1u, 2u, 3u));
  StoreGuard holder(make_store());
  embstore_store_t* s = holder.store;
  no_rebaseline(s);
  embstore_table_t* t = make_table(s, table_config("emb", 4));
  std::map<uint64_t, std::vector<float>> committed;
  std::map<uint64_t, std::string> attached;
  uint64_t step = 0;
  for (int round = 0; round < 40; ++round) {
    const int move = static_cast<int>(rng() % 10);
    if (move < 2 && step > 3) {
      step -= 1 + rng() % 3;  // backwards
    } else {
      step += 1 + rng() % 3;
    }
    require_ok(embstore_step(s, step));
    train(t, rng(), keys);
    if (committed.count(step) != 0) continue;  // a version is written once
    const std::string note = "round " + std::to_string(round);
    if (rng() % 2 == 0) require_ok(embstore_checkpoint_attach(s, "note", note.data(), note.size()));
    const auto kind = rng() % 3 == 0 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
    uint64_t v = 0;
    require_ok(embstore_checkpoint(s, dir.path().c_str(), kind, &v));
    REQUIRE(v == step);
    require_ok(embstore_checkpoint_wait(s, v));
    committed[v] = lookup_ok(t, keys_upto(keys), 0);
    if (rng() % 8 == 0) {
      // Go back to an earlier version, in a new store (the old one lets go of the directory).
      auto it = committed.begin();
      std::advance(it, static_cast<long>(rng() % committed.size()));
      require_ok(embstore_store_destroy(holder.store));
      holder.store = s = make_store();
      no_rebaseline(s);
      uint64_t got = 0;
      require_ok(embstore_restore(s, dir.path().c_str(), it->first, &got));
      require_ok(embstore_table_get(s, "emb", &t));
      step = got;
    }
  }
  REQUIRE(committed.size() >= 10);
  for (const auto& [version, values] : committed) {
    INFO("version " << version);
    REQUIRE(same_bits(restored_values(dir.path(), version, "emb", keys), values));
  }
}
