// The follower's row store (host/serving/served_rows.hpp): after every apply it serves exactly
// the rows of that version (against a plain map), across index growth, tombstones and rows
// reused; and readers on other threads never see two versions in one batch while the writer
// applies versions as fast as it can.
#include "host/serving/served_rows.hpp"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <map>
#include <random>
#include <thread>
#include <vector>

namespace {

using embstore::serving::ServedRows;
using embstore::serving::TableChanges;

TEST_CASE("Served rows equal a plain map of each version", "[serving]") {
  constexpr uint32_t kDim = 3;
  ServedRows served({{"t", kDim}, {"other", 2}});
  std::map<int64_t, std::vector<float>> reference;
  std::mt19937_64 rng(7);
  for (uint64_t version = 1; version <= 40; ++version) {
    TableChanges c;
    // Mostly new keys (the index grows past its first 1024), some updates and tombstones.
    for (int i = 0; i < 300; ++i) {
      const int64_t key = static_cast<int64_t>(rng() % 20000) - 10000;
      if (rng() % 5 == 0) {
        if (std::find(c.keys.begin(), c.keys.end(), key) == c.keys.end()) {
          c.tombstones.push_back(key);
        }
        continue;
      }
      if (std::find(c.keys.begin(), c.keys.end(), key) != c.keys.end() ||
          std::find(c.tombstones.begin(), c.tombstones.end(), key) != c.tombstones.end()) {
        continue;
      }
      c.keys.push_back(key);
      for (uint32_t d = 0; d < kDim; ++d) c.values.push_back(static_cast<float>(version * 10 + d));
    }
    for (int64_t k : c.tombstones) reference.erase(k);
    for (size_t i = 0; i < c.keys.size(); ++i) {
      reference[c.keys[i]].assign(c.values.begin() + i * kDim, c.values.begin() + (i + 1) * kDim);
    }
    served.apply(version, {{"t", c}});
    REQUIRE(served.version() == version);
    REQUIRE(served.rows("t") == reference.size());
    std::vector<int64_t> keys;
    for (int64_t k = -10000; k < 10000; ++k) keys.push_back(k);
    std::vector<float> out(keys.size() * kDim);
    uint64_t read = 0;
    REQUIRE(served.lookup(
        "t", keys.data(), keys.size(), out.data(),
        [](int64_t key, float* row) {
          for (uint32_t d = 0; d < kDim; ++d) row[d] = -1.0f - key;
        },
        &read));
    REQUIRE(read == version);
    for (size_t i = 0; i < keys.size(); ++i) {
      const auto it = reference.find(keys[i]);
      for (uint32_t d = 0; d < kDim; ++d) {
        const float want = it == reference.end() ? -1.0f - keys[i] : it->second[d];
        INFO("version " << version << " key " << keys[i]);
        REQUIRE(out[i * kDim + d] == want);
      }
    }
  }
  REQUIRE(served.rows("other") == 0);
  float row[2];
  const int64_t key = 5;
  REQUIRE_FALSE(served.lookup("missing", &key, 1, row, {}, nullptr));
}

TEST_CASE("Readers never see two versions in one batch while versions are applied", "[serving]") {
  // Version v changes a tenth of the old keys (each to (v, k), or a tombstone where (k + v) % 7
  // is 0) and adds 300 new keys, so readers read the base while it is merged into and while its
  // index grows. expected[v][k]: the version whose row key k has at v, 0 for none.
  constexpr int64_t kOld = 3000, kNewPerVersion = 300;
  constexpr uint64_t kVersions = 50;
  constexpr int64_t kAll = kOld + kNewPerVersion * static_cast<int64_t>(kVersions);
  const auto changes = [](uint64_t v, int64_t k) {
    const bool fresh = k >= kOld + kNewPerVersion * static_cast<int64_t>(v - 1) &&
                       k < kOld + kNewPerVersion * static_cast<int64_t>(v);
    const bool old_changed = k < kOld && (static_cast<uint64_t>(k) * 2654435761u + v) % 10 == 0;
    return v == 1 ? k < kOld || fresh : fresh || old_changed;
  };
  std::vector<std::vector<int32_t>> expected(kVersions + 1, std::vector<int32_t>(kAll, 0));
  std::vector<TableChanges> per_version(kVersions + 1);
  for (uint64_t v = 1; v <= kVersions; ++v) {
    expected[v] = expected[v - 1];
    TableChanges& c = per_version[v];
    for (int64_t k = 0; k < kAll; ++k) {
      if (!changes(v, k)) continue;
      if (v > 1 && k < kOld && (k + static_cast<int64_t>(v)) % 7 == 0) {
        c.tombstones.push_back(k);
        expected[v][k] = 0;
      } else {
        c.keys.push_back(k);
        c.values.push_back(static_cast<float>(v));
        c.values.push_back(static_cast<float>(k));
        expected[v][k] = static_cast<int32_t>(v);
      }
    }
  }
  ServedRows served({{"t", 2}});
  served.apply(1, {{"t", per_version[1]}});
  std::atomic<bool> done{false};
  std::atomic<long> batches{0}, mixed{0};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      std::mt19937_64 rng(static_cast<uint64_t>(r));
      std::vector<int64_t> keys(256);
      std::vector<float> out(keys.size() * 2);
      while (!done.load()) {
        for (int64_t& k : keys) k = static_cast<int64_t>(rng() % kAll);
        uint64_t v = 0;
        served.lookup("t", keys.data(), keys.size(), out.data(), {}, &v);
        for (size_t i = 0; i < keys.size(); ++i) {
          const int32_t has = expected[v][static_cast<size_t>(keys[i])];
          const float want_v = static_cast<float>(has);
          const float want_k = has == 0 ? 0.0f : static_cast<float>(keys[i]);
          if (out[2 * i] != want_v || out[2 * i + 1] != want_k) {
            ++mixed;
            break;
          }
        }
        ++batches;
      }
    });
  }
  for (uint64_t v = 2; v <= kVersions; ++v) {
    served.apply(v, {{"t", per_version[v]}});
    std::this_thread::yield();
  }
  // Let the readers see the last version too.
  const long seen = batches.load();
  while (batches.load() < seen + 100) std::this_thread::yield();
  done = true;
  for (std::thread& t : readers) t.join();
  INFO(batches.load() << " batches");
  CHECK(batches.load() > 0);
  CHECK(mixed.load() == 0);
  CHECK(served.version() == kVersions);
  CHECK(served.rows("t") ==
        static_cast<uint64_t>(std::count_if(expected[kVersions].begin(), expected[kVersions].end(),
                                            [](int32_t x) { return x != 0; })));
}

}  // namespace
