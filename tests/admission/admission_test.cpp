// Feature admission through the C API: thresholds 1, 2 and 5, duplicates in one call, pending
// keys read their initial values and skip their gradients, lookups without insert count
// nothing, a refused insert keeps the counts, idle counts are forgotten; the counting Bloom
// filter against its documented false-admission bound; counts saved in full checkpoints and
// restored (and a restore that continues training equals a replay). Also the admission file's
// parser on bad bytes (host/admission/, white-box: links embstore_static). On the CUDA backend,
// admission is refused at table creation in this version (tested here too).
#include "host/admission/admission.hpp"

#include <embstore/embstore.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "cuda/row/admission.h"
#include "host/admission/delta_generations.hpp"
#include "host/error.hpp"
#include "host/table/table.hpp"
#include "io/format/admission_file.hpp"
#include "io/format/layout.hpp"
#include "support/backend.hpp"
#include "support/checkpoint_helpers.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore_test;
using embstore_test::FaultGuard;
namespace fs = std::filesystem;

namespace {

void ok(embstore_status_t s) { require_ok(s); }

embstore_table_config_t config(const char* name, uint32_t admit_after, uint64_t bloom = 0) {
  embstore_table_config_t c = table_config(name, 4);
  c.init = EMBSTORE_INIT_UNIFORM;
  c.init_a = -0.5f;
  c.init_b = 0.5f;
  c.learning_rate = 0.1f;
  c.initial_capacity = 64;
  c.seed = 7;
  c.admit_after = admit_after;
  c.admit_bloom_bytes = bloom;
  return c;
}

// Whether key has a row: a lookup without insert reads zeros only for a key without one (these
// tables' values are uniform in [-0.5, 0.5), never all zero).
bool has_row(embstore_table_t* t, int64_t key) {
  const std::vector<float> v = lookup_ok(t, {key}, 0);
  return std::any_of(v.begin(), v.end(), [](float x) { return x != 0; });
}

std::vector<int64_t> keys_from(int64_t first, size_t n) {
  std::vector<int64_t> k(n);
  for (size_t i = 0; i < n; ++i) k[i] = first + static_cast<int64_t>(i);
  return k;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

uint64_t full_ok(embstore_store_t* store, const std::string& dir) {
  uint64_t version = 0;
  ok(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, &version));
  ok(embstore_checkpoint_wait(store, version));
  return version;
}

embstore_table_t* get_table(embstore_store_t* store, const char* name) {
  embstore_table_t* t = nullptr;
  ok(embstore_table_get(store, name, &t));
  return t;
}

std::string admission_file(const std::string& dir, uint64_t version, const char* table) {
  char name[64];
  std::snprintf(name, sizeof(name), "%020llu.full", static_cast<unsigned long long>(version));
  return dir + "/" + name + "/" +
         embstore::io::admission_file_path(embstore::io::kManifestFormatVersion, table);
}

}  // namespace

TEST_CASE("a key gets its row at its N-th occurrence", "[admission]") {
  const uint32_t n = GENERATE(1u, 2u, 5u);
  INFO("admit_after " << n);
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config("t", n));
  const int64_t key = 42;
  std::vector<float> pending_value;
  for (uint32_t i = 1; i < n; ++i) {
    ok(embstore_step(store, i));
    const std::vector<float> v = lookup_ok(t, {key});
    if (i > 1) REQUIRE(same_bits(v, pending_value));  // the same initial values each time
    pending_value = v;
    REQUIRE_FALSE(has_row(t, key));
    const embstore_table_stats_t s = stats(t);
    REQUIRE(s.rows == 0);
    REQUIRE(s.pending_admission == 1);
    REQUIRE(s.admitted == 0);
    REQUIRE(s.dirty_rows == 0);
  }
  ok(embstore_step(store, n));
  const std::vector<float> admitted = lookup_ok(t, {key});
  REQUIRE(has_row(t, key));
  // A pending key read what its row starts with.
  if (n > 1) REQUIRE(same_bits(admitted, pending_value));
  REQUIRE(std::any_of(admitted.begin(), admitted.end(), [](float x) { return x != 0; }));
  const embstore_table_stats_t s = stats(t);
  REQUIRE(s.rows == 1);
  REQUIRE(s.admitted == 1);
  REQUIRE(s.inserted == 1);
  REQUIRE(s.pending_admission == 0);
  REQUIRE(s.dirty_rows == 1);
}

TEST_CASE("occurrences in one call count one by one", "[admission]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config("t", 3));
  // 7 three times: admitted at the third, and every position reads the new row.
  const std::vector<float> v = lookup_ok(t, {7, 8, 7, 7, 8});
  REQUIRE(has_row(t, 7));
  REQUIRE_FALSE(has_row(t, 8));
  const std::vector<float> row = lookup_ok(t, {7}, 0);
  for (size_t pos : {0u, 2u, 3u}) {
    REQUIRE(std::memcmp(&v[pos * 4], row.data(), 4 * sizeof(float)) == 0);
  }
  // 8 was seen twice: once more admits it.
  REQUIRE(stats(t).pending_admission == 1);
  const std::vector<float> eight = lookup_ok(t, {8});
  REQUIRE(has_row(t, 8));
  REQUIRE(std::memcmp(&v[4 * 4], eight.data(), 4 * sizeof(float)) == 0);
  REQUIRE(stats(t).rows == 2);
  REQUIRE(stats(t).admitted == 2);
}

TEST_CASE("gradients of pending keys are skipped and counted", "[admission]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config("t", 2));
  const std::vector<float> before = lookup_ok(t, {1, 2});  // both pending
  apply_ok(t, {1, 2, 1}, std::vector<float>(12, 1.0f));
  REQUIRE(stats(t).skipped_keys == 3);
  REQUIRE(stats(t).rows == 0);
  // Admitted, key 1 starts from its initial values: the skipped gradients left no trace.
  REQUIRE(same_bits(lookup_ok(t, {1}), std::vector<float>(before.begin(), before.begin() + 4)));
  apply_ok(t, {1}, std::vector<float>(4, 1.0f));
  REQUIRE(stats(t).skipped_keys == 3);
  REQUIRE_FALSE(
      same_bits(lookup_ok(t, {1}, 0), std::vector<float>(before.begin(), before.begin() + 4)));
}

TEST_CASE("lookups without insert count nothing", "[admission]") {
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config("t", 2));
  for (int i = 0; i < 5; ++i) REQUIRE(lookup_ok(t, {5}, 0) == std::vector<float>(4, 0.0f));
  REQUIRE(stats(t).pending_admission == 0);
  lookup_ok(t, {5});
  REQUIRE_FALSE(has_row(t, 5));
  lookup_ok(t, {5});
  REQUIRE(has_row(t, 5));
}

TEST_CASE("an insert refused at max_capacity keeps the table and the counts", "[admission]") {
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t", 2);
  c.initial_capacity = 4;
  c.max_capacity = 4;
  embstore_table_t* t = make_table(store, c);
  const std::vector<int64_t> full = {1, 2, 3, 4};
  lookup_ok(t, full);
  lookup_ok(t, full);
  const std::vector<float> rows = lookup_ok(t, full, 0);
  REQUIRE(stats(t).rows == 4);
  lookup_ok(t, {9});  // pending, no row needed: fine at the limit
  REQUIRE(stats(t).pending_admission == 1);
  std::vector<float> out;
  REQUIRE(lookup(t, {9}, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
  REQUIRE(stats(t).rows == 4);
  REQUIRE(same_bits(lookup_ok(t, full, 0), rows));
  // Still counted: the key is admitted as soon as there is room.
  REQUIRE(stats(t).pending_admission == 1);
  REQUIRE(lookup(t, {9}, EMBSTORE_LOOKUP_INSERT, &out) == EMBSTORE_CAPACITY_EXCEEDED);
}

TEST_CASE("an idle rule forgets the counts of keys not seen for as long", "[admission]") {
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t", 3);
  c.evict_idle_steps = 8;
  embstore_table_t* t = make_table(store, c);
  ok(embstore_step(store, 1));
  lookup_ok(t, {10, 10});  // count 2 of 3
  ok(embstore_step(store, 5));
  lookup_ok(t, {11});  // seen later
  REQUIRE(stats(t).pending_admission == 2);
  ok(embstore_step(store, 12));              // an idle pass (due every step): cutoff 12 - 8 = 4
  REQUIRE(stats(t).pending_admission == 1);  // 10 forgotten, 11 kept
  lookup_ok(t, {10});
  REQUIRE_FALSE(has_row(t, 10));  // counts from 0 again
  lookup_ok(t, {11, 11});
  REQUIRE(has_row(t, 11));
}

TEST_CASE("counting Bloom filter: never late, early within its documented bound", "[admission]") {
  constexpr uint64_t kCells = 1 << 16;
  StoreGuard store(make_store());
  embstore_table_config_t c = config("t", 2, kCells);
  c.dim = 1;
  embstore_table_t* t = make_table(store, c);
  uint64_t counted = 0;
  // Two loads: n = m/16 and n = m/2 distinct keys seen once each, then probes of fresh keys,
  // seen once: those admitted are admitted early.
  for (const uint64_t load : {kCells / 16, kCells / 2}) {
    const std::vector<int64_t> noise =
        keys_from(static_cast<int64_t>(counted) * 3 + 1000000, load - counted);
    const uint64_t rows_before = stats(t).rows;
    lookup_ok(t, noise);
    counted = load;
    const uint64_t early_noise = stats(t).rows - rows_before;

    const size_t probes = 4000;
    const std::vector<int64_t> probe = keys_from(-static_cast<int64_t>(counted) * 100, probes);
    const uint64_t before = stats(t).rows;
    lookup_ok(t, probe);
    const uint64_t early = stats(t).rows - before;
    counted += probes;
    const double n = static_cast<double>(counted);
    const double bound = std::pow(1.0 - std::exp(-4.0 * n / kCells), 4.0);
    const double rate = static_cast<double>(early) / probes;
    INFO("n " << n << ": " << early << " of " << probes << " admitted early (rate " << rate
              << "), bound " << bound << "; noise admitted early: " << early_noise);
    // Three standard deviations of the probe sample above the bound.
    REQUIRE(rate <= bound + 3 * std::sqrt(bound * (1 - bound) / probes));
    if (load == kCells / 2) REQUIRE(early > 0);  // a filter this full does admit early
    // pending_admission estimates the distinct keys counted.
    const double estimate = static_cast<double>(stats(t).pending_admission);
    REQUIRE(std::abs(estimate - n) < 0.05 * n);

    // Never late: the second occurrence admits every probe.
    lookup_ok(t, probe);
    REQUIRE(stats(t).rows == before + probes);
  }
}

TEST_CASE("admission counts are saved in full checkpoints and restored", "[admission]") {
  const uint64_t bloom = GENERATE(uint64_t{0}, uint64_t{4096});
  INFO((bloom ? "Bloom filter" : "exact counting"));
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config("t", 3, bloom));
  ok(embstore_step(store, 1));
  lookup_ok(t, {1, 1, 2, 3, 3, 3});  // 1: count 2, 2: count 1, 3: admitted
  const uint64_t pending = stats(t).pending_admission;
  if (bloom == 0) REQUIRE(pending == 2);
  const uint64_t v = full_ok(store, dir.path());
  REQUIRE(fs::exists(admission_file(dir.path(), v, "t")));

  StoreGuard fresh(make_store());
  embstore_table_t* r = nullptr;
  {
    // The table as configured in the checkpoint; counts restored.
    uint64_t restored = 0;
    ok(embstore_restore(fresh, dir.path().c_str(), EMBSTORE_LATEST, &restored));
    r = get_table(fresh, "t");
  }
  REQUIRE(stats(r).rows == 1);
  REQUIRE(stats(r).pending_admission == pending);
  lookup_ok(r, {1});  // its third occurrence
  REQUIRE(has_row(r, 1));
  lookup_ok(r, {2});
  REQUIRE_FALSE(has_row(r, 2));
  lookup_ok(r, {2});
  REQUIRE(has_row(r, 2));
}

TEST_CASE("deltas carry the counts' changes, and a failed delta leaves them to the next",
          "[admission]") {
  TempDir dir;
  StoreGuard store(make_store());
  no_rebaseline(store);
  embstore_table_t* t = make_table(store, config("t", 3));
  ok(embstore_step(store, 1));
  lookup_ok(t, {1, 1, 2, 2, 3});  // 1, 2 at 2 of 3; 3 at 1
  full_ok(store, dir.path());
  ok(embstore_step(store, 2));
  lookup_ok(t, {1, 4});  // 1 admitted (its count removed); 4 counted after the full
  {
    FaultGuard enospc([](uint64_t, size_t) { return -ENOSPC; });
    uint64_t v = 0;
    ok(embstore_checkpoint(store, dir.path().c_str(), EMBSTORE_CKPT_INCREMENTAL, &v));
    REQUIRE(embstore_checkpoint_wait(store, v) == EMBSTORE_IO_ERROR);
  }
  ok(embstore_step(store, 3));
  lookup_ok(t, {5, 3});  // 3 at 2 of 3, 5 at 1
  REQUIRE(incremental_ok(store, dir.path()) == 3);
  ok(embstore_step(store, 4));
  lookup_ok(t, {6});
  REQUIRE(incremental_ok(store, dir.path()) == 4);

  for (const uint64_t version : {uint64_t{3}, uint64_t{4}}) {
    INFO("restored version " << version);
    StoreGuard fresh(make_store());
    uint64_t restored = 0;
    ok(embstore_restore(fresh, dir.path().c_str(), version, &restored));
    embstore_table_t* r = get_table(fresh, "t");
    REQUIRE(has_row(r, 1));
    // Pending at version 3: 2 (2 of 3), 3 (2 of 3), 4 (1), 5 (1); and 6 (1) at 4.
    REQUIRE(stats(r).pending_admission == (version == 3 ? 4u : 5u));
    lookup_ok(r, {2, 3, 4, 5});
    REQUIRE(has_row(r, 2));
    REQUIRE(has_row(r, 3));
    REQUIRE_FALSE(has_row(r, 4));
    REQUIRE_FALSE(has_row(r, 5));
    lookup_ok(r, {4, 6});
    REQUIRE(has_row(r, 4));
    REQUIRE_FALSE(has_row(r, 6));
    REQUIRE(stats(r).pending_admission == 2);  // 5 and 6
  }
}

TEST_CASE("a damaged admission file fails the restore", "[admission]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config("t", 3));
  lookup_ok(t, {1, 2, 3});
  const uint64_t v = full_ok(store, dir.path());
  const std::string path = admission_file(dir.path(), v, "t");
  {
    std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(30);
    f.put('\x55');
  }
  StoreGuard fresh(make_store());
  uint64_t restored = 0;
  REQUIRE(embstore_restore(fresh, dir.path().c_str(), EMBSTORE_LATEST, &restored) ==
          EMBSTORE_CORRUPT);
  REQUIRE(std::string(embstore_last_error()).find("admission.counts") != std::string::npos);
  embstore_table_t* none = nullptr;
  REQUIRE(embstore_table_get(fresh, "t", &none) == EMBSTORE_NOT_FOUND);
  fs::remove(path);
  REQUIRE(embstore_restore(fresh, dir.path().c_str(), EMBSTORE_LATEST, &restored) ==
          EMBSTORE_CORRUPT);
  REQUIRE(std::string(embstore_last_error()).find("missing") != std::string::npos);
}

TEST_CASE("counts of another kind of counting are left out of a restore", "[admission]") {
  TempDir dir;
  StoreGuard store(make_store());
  embstore_table_t* t = make_table(store, config("t", 2));
  lookup_ok(t, {1, 2, 2});
  full_ok(store, dir.path());

  StoreGuard other(make_store());
  embstore_table_t* bloom = make_table(other, config("t", 2, 4096));
  uint64_t restored = 0;
  ok(embstore_restore(other, dir.path().c_str(), EMBSTORE_LATEST, &restored));
  REQUIRE(get_table(other, "t") == bloom);
  REQUIRE(has_row(bloom, 2));
  REQUIRE(stats(bloom).pending_admission == 0);  // the exact counts did not fill the filter
  lookup_ok(bloom, {1});
  REQUIRE_FALSE(has_row(bloom, 1));
}

TEST_CASE("training restored from a chain goes on as if uninterrupted", "[admission]") {
  const uint64_t bloom = GENERATE(uint64_t{0}, uint64_t{1024});
  INFO((bloom ? "Bloom filter" : "exact counting"));
  TempDir dir;
  // Zipf-like keys: a few frequent, many rare, so some are admitted and some stay pending.
  auto batch = [](uint64_t step) {
    std::vector<int64_t> k(64);
    uint64_t x = step * 0x9E3779B97F4A7C15ull;
    for (auto& key : k) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(x >> 11) / 9007199254740992.0;
      key = static_cast<int64_t>(std::pow(400.0, u));
    }
    return k;
  };
  auto train = [&](embstore_store_t* s, embstore_table_t* t, uint64_t from, uint64_t to) {
    for (uint64_t step = from; step <= to; ++step) {
      ok(embstore_step(s, step));
      const std::vector<int64_t> k = batch(step);
      lookup_ok(t, k);
      std::vector<float> g(k.size() * 4);
      for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 37 + step) % 17) - 8;
      apply_ok(t, k, g);
    }
  };
  const std::vector<int64_t> all = keys_from(0, 401);
  StoreGuard a(make_store());
  embstore_table_t* ta = make_table(a, config("t", 4, bloom));
  no_rebaseline(a);
  train(a, ta, 1, 10);
  full_ok(a, dir.path());
  train(a, ta, 11, 15);
  incremental_ok(a, dir.path());
  train(a, ta, 16, 20);
  incremental_ok(a, dir.path());
  train(a, ta, 21, 40);

  StoreGuard b(make_store());
  uint64_t restored = 0;
  ok(embstore_restore(b, dir.path().c_str(), EMBSTORE_LATEST, &restored));
  REQUIRE(restored == 20);
  embstore_table_t* tb = get_table(b, "t");
  train(b, tb, 21, 40);
  const embstore_table_stats_t sa = stats(ta), sb = stats(tb);
  REQUIRE(sa.pending_admission > 0);
  REQUIRE(sa.skipped_keys > 0);
  REQUIRE(sb.rows == sa.rows);
  REQUIRE(sb.pending_admission == sa.pending_admission);
  REQUIRE(same_bits(lookup_ok(tb, all, 0), lookup_ok(ta, all, 0)));
}

// Counts as their file's bytes, and back.
std::string file_bytes(const embstore::io::AdmissionFile& f) {
  const std::vector<char> bytes = embstore::io::format_admission_file(f);
  return std::string(bytes.begin(), bytes.end());
}
embstore::io::AdmissionFile parsed(const std::string& bytes) {
  embstore::io::AdmissionFile f;
  std::string why;
  INFO(why);
  REQUIRE(embstore::io::parse_admission_file(bytes, &f, &why) == 0);
  return f;
}

std::unique_ptr<embstore::AdmissionCounter> counter(uint32_t admit_after, uint64_t bloom = 0) {
  embstore::TableSpec spec;
  spec.name = "t";
  spec.admit_after = admit_after;
  spec.admit_bloom_bytes = bloom;
  return embstore::AdmissionCounter::make(spec);
}

TEST_CASE("the admission file's parser refuses bad bytes", "[admission]") {
  auto exact = counter(3);
  auto bloom = counter(3, 256);
  REQUIRE(counter(1) == nullptr);

  for (int64_t k = 0; k < 100; ++k) exact->count(k * 1000003, 1);
  const std::string good = file_bytes(exact->save());
  auto corrupt = [&](const std::string& bytes, const char* why) {
    embstore::io::AdmissionFile f;
    std::string reason;
    REQUIRE(embstore::io::parse_admission_file(bytes, &f, &reason) == -EBADMSG);
    INFO(reason);
    REQUIRE(reason.find(why) != std::string::npos);
  };
  corrupt("", "header");
  corrupt(good.substr(0, good.size() - 1), "entries need");
  std::string twice = good;
  std::memcpy(&twice[24 + 24], &twice[24], 8);  // the second entry's key = the first's
  corrupt(twice, "twice");
  std::string format = good;
  format[12] = 9;
  corrupt(format, "format");
  std::string reserved = good;
  reserved[24 + 12] = 1;  // the first entry's reserved field
  corrupt(reserved, "reserved");

  // A good load replaces the counts; the other kind is left with a reason.
  auto copy = counter(3);
  std::string reason;
  REQUIRE(copy->load(parsed(good), &reason));
  REQUIRE(copy->pending() == 100);
  REQUIRE(file_bytes(copy->save()) == good);
  REQUIRE_FALSE(bloom->load(parsed(good), &reason));
  REQUIRE(reason.find("exactly") != std::string::npos);
  const std::string filter = file_bytes(bloom->save());
  REQUIRE_FALSE(exact->load(parsed(filter), &reason));
  REQUIRE(reason.find("Bloom") != std::string::npos);
  auto smaller = counter(3, 128);
  REQUIRE_FALSE(smaller->load(parsed(filter), &reason));
  REQUIRE(reason.find("256") != std::string::npos);
  corrupt(filter.substr(0, filter.size() - 1), "counters needs");
}

TEST_CASE("frozen counts stay as they were while counting goes on", "[admission]") {
  for (const uint64_t bloom : {uint64_t{0}, uint64_t{1} << 20}) {
    INFO((bloom ? "Bloom filter" : "exact counting"));
    auto c = counter(3, bloom);
    for (int64_t k = 0; k < 20000; ++k) c->count(k * 7919, 1);  // many pieces
    const std::string before = file_bytes(c->save());
    auto frozen = c->freeze(true);
    // Counting that changes most pieces, admissions (erases) and growth (a rehash).
    for (int64_t k = 0; k < 20000; k += 2) c->count(k * 7919, 2);
    for (int64_t k = 0; k < 2000; ++k) c->admitted(k * 7919);
    for (int64_t k = 0; k < 40000; ++k) c->count(-k - 1, 3);
    REQUIRE(file_bytes(frozen->counts()) == before);
    REQUIRE(file_bytes(c->save()) != before);
    // And the live counts are right: a frozen piece was copied, not shared, when it changed.
    auto copy = counter(3, bloom);
    std::string why;
    REQUIRE(copy->load(c->save(), &why));
    REQUIRE(copy->count(2004 * 7919, 4));  // seen twice (+1): admitted
    if (bloom == 0) {
      REQUIRE(c->pending() == 20000 - 2000 + 40000);
      REQUIRE_FALSE(copy->count(2003 * 7919, 4));  // seen once (+1): 2 of 3
      REQUIRE_FALSE(copy->count(4 * 7919, 4));     // admitted, then counted anew
    }
  }
}

// A stack of tables at its row limit asks before a call how many keys the call admits
// (StackedTable::choose_victims): the answer must be what counting then admits, and asking must
// change nothing, with a filter so crowded that keys share most counters.
TEST_CASE("would_admit tells what counting a batch admits, changing nothing", "[admission]") {
  for (const uint64_t bloom : {uint64_t{0}, uint64_t{64}, uint64_t{4096}}) {
    INFO((bloom ? "Bloom filter of " : "exact counting") << bloom);
    auto c = counter(3, bloom);
    uint64_t seed = 7;
    const auto next = [&] { return seed = seed * 6364136223846793005ull + 1442695040888963407ull; };
    uint64_t admitted_in_all = 0;
    for (int call = 0; call < 60; ++call) {
      std::vector<int64_t> keys(1 + next() % 40);
      for (int64_t& k : keys) k = static_cast<int64_t>(next() >> 33) % 300;
      const std::string before = file_bytes(c->save());
      const uint64_t told = c->would_admit(keys.data(), keys.size());
      REQUIRE(file_bytes(c->save()) == before);
      std::vector<int64_t> admitted;
      for (const int64_t k : keys) {
        if (c->count(k, 1)) admitted.push_back(k);
      }
      std::sort(admitted.begin(), admitted.end());
      admitted.erase(std::unique(admitted.begin(), admitted.end()), admitted.end());
      INFO("call " << call);
      REQUIRE(told == admitted.size());
      admitted_in_all += told;
      // A third of them get no row (as after a refused call): counted to the threshold, each is
      // admitted at its next occurrence.
      for (const int64_t k : admitted) {
        if (k % 3 != 0) c->admitted(k);
      }
    }
    REQUIRE(admitted_in_all > 0);
    REQUIRE(c->would_admit(nullptr, 0) == 0);
  }
}

TEST_CASE("admission files of a chain merge into the counts at its newest version", "[admission]") {
  auto c = counter(3);
  c->count(1, 1);
  c->count(2, 1);
  const std::string full = file_bytes(c->freeze(true)->counts());
  c->end_freeze(true);
  c->admitted(1);
  c->count(2, 5);
  c->count(3, 5);
  auto frozen = c->freeze(false);
  const std::string delta = file_bytes(frozen->counts());
  c->end_freeze(true);
  c->count(4, 6);  // after the delta's capture: not in it

  embstore::io::AdmissionFile merged, sorted_twice;
  std::string why;
  REQUIRE(embstore::io::merge_admission_files({full, delta}, &merged, &why) == 0);
  const embstore::io::AdmissionFile f = parsed(file_bytes(merged));
  REQUIRE(f.kind == embstore::io::AdmissionKind::kExact);
  REQUIRE(f.entries.size() == 2);
  REQUIRE(f.entries[0].key == 2);
  REQUIRE(f.entries[0].count == 2);
  REQUIRE(f.entries[0].step == 5);
  REQUIRE(f.entries[1].key == 3);
  REQUIRE(f.entries[1].count == 1);
  // The merged counts load; a delta alone does not.
  auto loaded = counter(3);
  REQUIRE(loaded->load(merged, &why));
  REQUIRE(loaded->pending() == 2);
  REQUIRE_FALSE(loaded->load(parsed(delta), &why));
  REQUIRE(why.find("delta") != std::string::npos);
  REQUIRE(loaded->pending() == 2);

  // Applied from the newest whole file on: older files do not matter, whatever their kind.
  const std::string bloom = file_bytes(counter(3, 64)->save());
  REQUIRE(embstore::io::merge_admission_files({delta}, &merged, &why) == -EBADMSG);
  REQUIRE(why.find("start with a delta") != std::string::npos);
  REQUIRE(embstore::io::merge_admission_files({bloom, delta}, &merged, &why) == -EBADMSG);
  REQUIRE(why.find("Bloom") != std::string::npos);
  REQUIRE(embstore::io::merge_admission_files({full, bloom}, &merged, &why) == 0);
  REQUIRE(file_bytes(merged) == bloom);
  REQUIRE(embstore::io::merge_admission_files({bloom, full, delta, delta}, &merged, &why) == 0);
  REQUIRE(embstore::io::merge_admission_files({full, delta}, &sorted_twice, &why) == 0);
  REQUIRE(file_bytes(merged) == file_bytes(sorted_twice));
  REQUIRE(embstore::io::merge_admission_files({bloom, bloom}, &merged, &why) == 0);
  REQUIRE(file_bytes(merged).size() == 24 + 64);
}

TEST_CASE("counts with no committed base go whole into a delta", "[admission]") {
  auto c = counter(2);
  for (int64_t k = 0; k < 100; ++k) c->count(k, 1);
  for (int64_t k = 0; k < 50; ++k) c->count(k, 1);  // admits 0..49
  for (int64_t k = 0; k < 50; ++k) c->admitted(k);
  std::string why;
  for (const bool committed : {false, true}) {
    const auto frozen = c->freeze(false);  // a delta, but nothing committed yet
    const std::string bytes = file_bytes(frozen->counts());
    c->end_freeze(committed);
    const embstore::io::AdmissionFile f = parsed(bytes);
    REQUIRE(f.kind == embstore::io::AdmissionKind::kExact);
    REQUIRE(f.entries.size() == 50);
    REQUIRE(f.removed.empty());
  }
  // Committed: now deltas hold changes only.
  c->admitted(60);
  c->count(200, 2);
  const std::string bytes = file_bytes(c->freeze(false)->counts());
  c->end_freeze(true);
  const embstore::io::AdmissionFile f = parsed(bytes);
  REQUIRE(f.kind == embstore::io::AdmissionKind::kExactDelta);
  REQUIRE(f.removed == std::vector<int64_t>{60});
  REQUIRE(f.entries.size() == 1);
  REQUIRE(f.entries[0].key == 200);
  // A delta alone does not load.
  auto fresh = counter(2);
  REQUIRE_FALSE(fresh->load(parsed(bytes), &why));
  REQUIRE(why.find("delta") != std::string::npos);
}

TEST_CASE("a count dropped while the first checkpoint is in flight is removed by the next delta",
          "[admission]") {
  // The first checkpoint becomes the base when it commits: counts dropped meanwhile must be
  // the next delta's removals, or a restore of the chain brings them back.
  for (const bool first_commits : {true, false}) {
    CAPTURE(first_commits);
    auto c = counter(3);
    c->count(1, 1);
    c->count(2, 1);
    c->count(3, 1);
    const auto first = c->freeze(true);
    c->admitted(1);                     // dropped while the first is in flight
    REQUIRE(c->forget_before(2) == 2);  // 2 and 3: idle
    c->count(3, 4);                     // counted again: a change too
    c->end_freeze(first_commits);
    const std::string bytes = file_bytes(c->freeze(false)->counts());
    c->end_freeze(true);
    const embstore::io::AdmissionFile f = parsed(bytes);
    if (!first_commits) {  // no base yet: the counts go whole
      REQUIRE(f.kind == embstore::io::AdmissionKind::kExact);
      REQUIRE(f.entries.size() == 1);
      continue;
    }
    REQUIRE(f.kind == embstore::io::AdmissionKind::kExactDelta);
    REQUIRE(f.removed == std::vector<int64_t>{1, 2, 3});
    REQUIRE(f.entries.size() == 1);
    REQUIRE(f.entries[0].key == 3);
    REQUIRE(f.entries[0].step == 4);
    // The chain merges into the live counts.
    embstore::io::AdmissionFile merged;
    std::string why;
    REQUIRE(embstore::io::merge_admission_files({file_bytes(first->counts()), bytes}, &merged,
                                                &why) == 0);
    auto restored = counter(3);
    REQUIRE(restored->load(merged, &why));
    REQUIRE(restored->pending() == c->pending());
    REQUIRE(restored->pending() == 1);
  }
}

TEST_CASE("removals learned late go into the delta that must carry them", "[admission]") {
  // DeltaGenerations::note_removed_at: a CUDA table learns of a gone slot's removal only when a
  // rebuild sheds it, with the generation it was stamped with.
  embstore::DeltaGenerations g;
  // removals_after() is the filter a device applies before offering removals: whatever it
  // leaves out, note_removed_at would have dropped.
  auto offered = [&](int64_t key, uint32_t gen) {
    uint32_t after = 0;
    if (g.removals_after(&after) && gen > after) g.note_removed_at(key, gen);
  };
  uint32_t after = 0;
  REQUIRE_FALSE(g.removals_after(&after));
  g.note_removed_at(1, g.current());  // no base, nothing in flight: the next checkpoint is full
  REQUIRE(g.view(false).whole);
  REQUIRE(g.view(false).removed.empty());

  g.freeze();  // the first checkpoint: generation 1
  REQUIRE(g.removals_after(&after));
  REQUIRE(after == 1);
  offered(2, 1);            // before it: in its (whole) view
  offered(3, g.current());  // after it: the next delta's
  g.end_freeze(true);
  auto next = g.view(false);
  REQUIRE_FALSE(next.whole);
  REQUIRE(next.base == 1);
  REQUIRE(next.removed == std::vector<int64_t>{3});

  for (const bool commits : {false, true}) {
    CAPTURE(commits);
    g.freeze();  // a delta in flight, its base as before
    const uint32_t frozen = g.current() - 1;
    REQUIRE(g.removals_after(&after));
    REQUIRE(after == frozen - 1);  // the base
    offered(9, after);             // in the base: never needed again
    offered(10, frozen);           // in that delta's view: needed again only if it fails
    offered(11, g.current());      // after it
    g.end_freeze(commits);
    std::vector<int64_t> removed = g.view(false).removed;
    std::sort(removed.begin(), removed.end());
    if (commits) {
      REQUIRE(removed == std::vector<int64_t>{11});
    } else {
      REQUIRE(removed == std::vector<int64_t>{3, 10, 11});
    }
    g.freeze();
    g.end_freeze(true);  // a clean base for the next round
  }
}

TEST_CASE("exact counts saturate at 2^32 - 3, loaded ones too", "[admission]") {
  // As on the device, whose slot states take the two values above (cuda/row/admission.h).
  embstore::io::AdmissionFile f;
  f.kind = embstore::io::AdmissionKind::kExact;
  f.entries.push_back({7, 0xFFFFFFFFu, 0, 1});  // a count 0.4.0 could save
  f.entries.push_back({8, 0xFFFFFFFCu, 0, 1});
  auto c = counter(0xFFFFFFFFu);
  std::string why;
  REQUIRE(c->load(parsed(file_bytes(f)), &why));
  for (int i = 0; i < 3; ++i) {
    REQUIRE_FALSE(c->count(7, 2));
    REQUIRE_FALSE(c->count(8, 2));
  }
  for (const embstore::io::AdmissionEntry& e : c->save().entries) {
    REQUIRE(e.count == embstore::row::kAdmitMaxCount);
  }
}

TEST_CASE("a table created after the chain's full checkpoint restores its counts", "[admission]") {
  TempDir dir;
  StoreGuard store(make_store());
  no_rebaseline(store);
  embstore_table_t* plain = make_table(store, config("plain", 1));
  lookup_ok(plain, {1});
  full_ok(store, dir.path());
  embstore_table_t* t = make_table(store, config("late", 3));
  ok(embstore_step(store, 1));
  lookup_ok(t, {7, 7, 8});
  REQUIRE(incremental_ok(store, dir.path()) == 1);
  StoreGuard fresh(make_store());
  uint64_t restored = 0;
  ok(embstore_restore(fresh, dir.path().c_str(), EMBSTORE_LATEST, &restored));
  embstore_table_t* r = get_table(fresh, "late");
  REQUIRE(stats(r).pending_admission == 2);
  lookup_ok(r, {7});
  REQUIRE(has_row(r, 7));
}
