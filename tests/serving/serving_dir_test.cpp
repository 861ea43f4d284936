// A serving-only directory (embstore_checkpoint_policy_t::serving_dir, issue 35): every version
// the policy's dir commits is published there with values only, in each table's serving codec;
// followers of it serve what a restore of the checkpoint holds (within the codec), restores
// refuse it, a values-only warm start reads it, and a failed publication never fails a
// checkpoint nor leaves a broken chain.
#include <embstore/embstore.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "host/checkpoint/publish.hpp"
#include "io/codec/block_codec.hpp"
#include "io/format/commit.hpp"
#include "io/format/manifest.hpp"
#include "shard/thread_group.hpp"
#include "tests/serving/follower_fixtures.hpp"

namespace {

using namespace embstore_test::serving;
using embstore::io::Codec;

std::string version_name(uint64_t v, bool full) { return embstore::io::version_dir_name(v, full); }

embstore_checkpoint_stats_t checkpoint_stats(embstore_store_t* s) {
  embstore_checkpoint_stats_t st{};
  st.struct_size = sizeof st;
  REQUIRE(embstore_checkpoint_stats(s, &st) == EMBSTORE_OK);
  return st;
}

// A trainer whose policy's dir publishes to a serving directory (no schedule: the test calls
// embstore_checkpoint into the policy's dir).
struct Publishing {
  embstore_test::TempDir tmp;
  std::string dir = tmp.path() + "/ckpt", serving = tmp.path() + "/serving";
  Trainer trainer;
  explicit Publishing(embstore_codec_t serving_codec = EMBSTORE_CODEC_NONE, uint32_t keep_full = 0,
                      const std::string& serving_dir = "")
      : trainer(false, serving_codec) {
    if (!serving_dir.empty()) serving = serving_dir;
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.dir = dir.c_str();
    p.serving_dir = serving.c_str();
    p.keep_full = keep_full;
    p.max_chain_length = 0;
    p.rebaseline_fraction = 0;
    REQUIRE(embstore_checkpoint_set_policy(trainer.store, &p) == EMBSTORE_OK);
  }
  uint64_t step_and_checkpoint(uint64_t s, embstore_ckpt_kind_t kind) {
    trainer.step(s);
    return trainer.checkpoint(dir, kind);
  }
};

TEST_CASE("A serving-only directory gets every version, values only, and followers serve it",
          "[serving][serving_dir]") {
  const auto [api_codec, codec] = GENERATE(std::pair{EMBSTORE_CODEC_NONE, Codec::kNone},
                                           std::pair{EMBSTORE_CODEC_BF16, Codec::kBf16},
                                           std::pair{EMBSTORE_CODEC_INT8, Codec::kInt8});
  CAPTURE(embstore::io::codec_name(codec));
  Publishing run(api_codec);
  REQUIRE(embstore_checkpoint_attach(run.trainer.store, "rng", "abc", 3) == EMBSTORE_OK);
  run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
  embstore_follower_t* f = follow(run.serving);
  check_equals_restore(f, run.dir, 1, 0, 1, codec);
  uint64_t v = 0, serving_bytes = 0, checkpoint_bytes = 0;
  for (uint64_t s = 1; s <= 4; ++s) {
    if (s > 1) {
      run.step_and_checkpoint(s, EMBSTORE_CKPT_INCREMENTAL);
      REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
      REQUIRE(v == s);
      check_equals_restore(f, run.dir, s, 0, 1, codec);
    }
    const std::string name = version_name(s, s == 1);
    const embstore::io::Manifest ckpt = manifest_of(run.dir + "/" + name);
    const embstore::io::Manifest m = manifest_of(run.serving + "/" + name);
    CHECK(m.serving_only);
    CHECK(m.lineage == ckpt.lineage);
    CHECK(m.parent == ckpt.parent);
    CHECK(m.attachments.empty());
    REQUIRE(m.tables.size() == ckpt.tables.size());
    for (size_t i = 0; i < m.tables.size(); ++i) {
      const embstore::io::TableEntry& t = m.tables[i];
      const embstore::io::TableEntry& c = ckpt.tables[i];
      INFO("version " << s << ", table " << t.name);
      CHECK(t.state_dim == 0);
      CHECK(t.admission.empty());
      CHECK(t.serving.empty());
      CHECK(t.table_rows == c.table_rows);
      REQUIRE(t.files.size() == 1);
      REQUIRE(c.serving.size() == 1);
      // The checkpoint's values-only copy, under the row file's name, linked (one file system).
      CHECK(t.files[0].path == c.files[0].path);
      CHECK(t.files[0].xxh3 == c.serving[0].xxh3);
      struct stat st {};
      REQUIRE(::stat((run.serving + "/" + name + "/" + t.files[0].path).c_str(), &st) == 0);
      CHECK(st.st_nlink == 2);
      CHECK(t.files[0].bytes <= c.files[0].bytes);
      serving_bytes += t.files[0].bytes;
      checkpoint_bytes += c.files[0].bytes;
    }
  }
  // items is Adagrad (as many state floats as values); counted is SGD (values only anyway).
  CHECK(serving_bytes < checkpoint_bytes);
  const embstore_checkpoint_stats_t st = checkpoint_stats(run.trainer.store);
  CHECK(st.serving_published == 4);
  CHECK(st.serving_skipped == 0);
  embstore_follower_destroy(f);
}

TEST_CASE("A serving-only directory on another file system gets copies of the files",
          "[serving][serving_dir]") {
  // /dev/shm: a tmpfs where Linux has one, so link() across to it fails with EXDEV.
  struct stat shm {
  }, tmp{};
  embstore_test::TempDir probe;
  if (::stat("/dev/shm", &shm) != 0 || ::stat(probe.path().c_str(), &tmp) != 0 ||
      shm.st_dev == tmp.st_dev || ::access("/dev/shm", W_OK) != 0) {
    WARN("no writable /dev/shm on another file system: the copy is not exercised");
    return;
  }
  const std::string serving = "/dev/shm/embstore-serving-" + std::to_string(::getpid());
  std::filesystem::remove_all(serving);
  {
    Publishing run(EMBSTORE_CODEC_BF16, 0, serving);
    run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
    run.step_and_checkpoint(2, EMBSTORE_CKPT_INCREMENTAL);
    const std::string name = version_name(2, false);
    const embstore::io::Manifest m = manifest_of(serving + "/" + name);
    const embstore::io::Manifest c = manifest_of(run.dir + "/" + name);
    for (size_t i = 0; i < m.tables.size(); ++i) {
      struct stat st {};
      REQUIRE(::stat((serving + "/" + name + "/" + m.tables[i].files[0].path).c_str(), &st) == 0);
      CHECK(st.st_nlink == 1);  // a copy
      CHECK(static_cast<uint64_t>(st.st_size) == c.tables[i].serving[0].bytes);
      CHECK(m.tables[i].files[0].xxh3 == c.tables[i].serving[0].xxh3);
    }
    check_new_follower(serving, run.dir, 2, Codec::kBf16);
    CHECK(checkpoint_stats(run.trainer.store).serving_published == 2);
  }
  std::filesystem::remove_all(serving);
}

TEST_CASE("Restores refuse a serving-only directory; a values-only warm start reads it",
          "[serving][serving_dir]") {
  Publishing run;
  run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
  run.step_and_checkpoint(2, EMBSTORE_CKPT_INCREMENTAL);
  embstore_store_t* s = host_store();
  CHECK(embstore_restore(s, run.serving.c_str(), EMBSTORE_LATEST, nullptr) ==
        EMBSTORE_INVALID_ARGUMENT);
  CHECK(std::string(embstore_last_error()).find("serving-only") != std::string::npos);
  embstore_warm_start_source_t src;
  embstore_warm_start_source_init(&src);
  src.dir = run.serving.c_str();
  CHECK(embstore_warm_start(s, &src, 1) == EMBSTORE_INVALID_ARGUMENT);
  CHECK(std::string(embstore_last_error()).find("EMBSTORE_WARM_START_VALUES_ONLY") !=
        std::string::npos);
  src.flags = EMBSTORE_WARM_START_VALUES_ONLY;
  INFO(embstore_last_error());
  REQUIRE(embstore_warm_start(s, &src, 1) == EMBSTORE_OK);
  // The values equal those of a restore of the checkpoint (serving codec NONE: exact).
  embstore_store_t* restored = host_store();
  REQUIRE(embstore_restore(restored, run.dir.c_str(), 2, nullptr) == EMBSTORE_OK);
  for (const char* name : {"items", "counted"}) {
    embstore_table_t *a = nullptr, *b = nullptr;
    REQUIRE(embstore_table_get(s, name, &a) == EMBSTORE_OK);
    REQUIRE(embstore_table_get(restored, name, &b) == EMBSTORE_OK);
    std::vector<int64_t> keys;
    for (int64_t k = -kKeys; k < kKeys; ++k) keys.push_back(k);
    const uint32_t dim = embstore_table_dim(a);
    std::vector<float> got(keys.size() * dim), want(keys.size() * dim);
    REQUIRE(embstore_lookup(a, keys.data(), keys.size(), got.data(), 0, nullptr) == EMBSTORE_OK);
    REQUIRE(embstore_lookup(b, keys.data(), keys.size(), want.data(), 0, nullptr) == EMBSTORE_OK);
    INFO("table " << name);
    CHECK(got == want);
  }
  embstore_store_destroy(restored);
  embstore_store_destroy(s);
}

TEST_CASE("A failed publication never fails the checkpoint; the next full publishes again",
          "[serving][serving_dir]") {
  Publishing run;
  run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
  SECTION("a delta whose parent the serving directory lost") {
    REQUIRE(std::filesystem::remove_all(run.serving + "/" + version_name(1, true)) > 0);
    run.step_and_checkpoint(2, EMBSTORE_CKPT_INCREMENTAL);  // committed all the same
    CHECK(!std::filesystem::exists(run.serving + "/" + version_name(2, false)));
  }
  SECTION("a publication whose commit fails") {
    int renames = 0;
    embstore::io::set_commit_fault_injection([&](const char* step) {
      // The checkpoint's own commit renames first, the publication second.
      return std::string(step) == "rename" && ++renames == 2 ? -EIO : 0;
    });
    run.step_and_checkpoint(2, EMBSTORE_CKPT_INCREMENTAL);
    embstore::io::set_commit_fault_injection({});
    CHECK(renames == 2);
    CHECK(!std::filesystem::exists(run.serving + "/" + version_name(2, false)));
    // Nothing half-written is left in it.
    for (const auto& e : std::filesystem::directory_iterator(run.serving)) {
      CHECK(e.path().filename().string().rfind(".tmp-", 0) != 0);
    }
  }
  embstore_checkpoint_stats_t st = checkpoint_stats(run.trainer.store);
  CHECK(st.committed == 2);
  CHECK(st.serving_published == 1);
  CHECK(st.serving_skipped == 1);
  // Not published: the chain is broken there until the next full checkpoint.
  run.step_and_checkpoint(3, EMBSTORE_CKPT_INCREMENTAL);
  CHECK(!std::filesystem::exists(run.serving + "/" + version_name(3, false)));
  run.step_and_checkpoint(4, EMBSTORE_CKPT_FULL);
  run.step_and_checkpoint(5, EMBSTORE_CKPT_INCREMENTAL);
  st = checkpoint_stats(run.trainer.store);
  CHECK(st.serving_published == 3);
  CHECK(st.serving_skipped == 2);
  check_new_follower(run.serving, run.dir, 5);
}

TEST_CASE("After a restore of an older version, the abandoned run leaves the serving directory",
          "[serving][serving_dir]") {
  Publishing run;
  run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
  for (uint64_t s = 2; s <= 4; ++s) run.step_and_checkpoint(s, EMBSTORE_CKPT_INCREMENTAL);
  embstore_follower_t* f = follow(run.serving);
  REQUIRE(embstore_restore(run.trainer.store, run.dir.c_str(), 2, nullptr) == EMBSTORE_OK);
  // The trainer's directory: the abandoned versions go by hand (embstore.h, restore).
  for (uint64_t s : {3, 4}) {
    REQUIRE(std::filesystem::remove_all(run.dir + "/" + version_name(s, false)) > 0);
  }
  run.step_and_checkpoint(3, EMBSTORE_CKPT_INCREMENTAL);
  // Published on version 2, and the abandoned 4 is gone: followers see the new run's 3.
  CHECK(!std::filesystem::exists(run.serving + "/" + version_name(4, false)));
  uint64_t v = 0;
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  CHECK(v == 3);
  check_equals_restore(f, run.dir, 3);
  run.step_and_checkpoint(4, EMBSTORE_CKPT_INCREMENTAL);
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  CHECK(v == 4);
  check_equals_restore(f, run.dir, 4);
  embstore_follower_destroy(f);
  CHECK(checkpoint_stats(run.trainer.store).serving_skipped == 0);
}

TEST_CASE("Retention after a restore never takes the chain of the version just published",
          "[serving][serving_dir]") {
  Publishing run(EMBSTORE_CODEC_NONE, /*keep_full=*/1);
  run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
  run.step_and_checkpoint(2, EMBSTORE_CKPT_INCREMENTAL);
  run.step_and_checkpoint(3, EMBSTORE_CKPT_FULL);  // retention: 1 and 2 go from both
  REQUIRE(embstore_restore(run.trainer.store, run.dir.c_str(), 3, nullptr) == EMBSTORE_OK);
  run.step_and_checkpoint(4, EMBSTORE_CKPT_INCREMENTAL);
  run.step_and_checkpoint(5, EMBSTORE_CKPT_FULL);
  run.step_and_checkpoint(6, EMBSTORE_CKPT_INCREMENTAL);
  // Back to 5, whose newer version the trainer's directory loses by hand; the next delta (at
  // step 8: steps may skip) applies on 5. The serving directory's abandoned 6 must go before it
  // counts, and 5, its parent, stays.
  REQUIRE(embstore_restore(run.trainer.store, run.dir.c_str(), 5, nullptr) == EMBSTORE_OK);
  REQUIRE(std::filesystem::remove_all(run.dir + "/" + version_name(6, false)) > 0);
  run.step_and_checkpoint(8, EMBSTORE_CKPT_INCREMENTAL);
  std::vector<embstore::io::VersionDir> versions;
  REQUIRE(embstore::io::list_versions(run.serving, &versions) == 0);
  std::vector<std::string> names;
  for (const auto& v : versions) names.push_back(v.name);
  CHECK(names == std::vector<std::string>{version_name(5, true), version_name(8, false)});
  check_new_follower(run.serving, run.dir, 8);
}

TEST_CASE("A delta is published only on the serving version of its own parent",
          "[serving][serving_dir]") {
  Publishing run;
  run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
  run.step_and_checkpoint(2, EMBSTORE_CKPT_INCREMENTAL);
  // Serving version 1 claims another source (as one of another run of the same lineage would).
  const std::string v1 = run.serving + "/" + version_name(1, true);
  embstore::io::Manifest m = manifest_of(v1);
  m.source_xxh3 ^= 1;
  REQUIRE(embstore::io::write_manifest(v1, m) == 0);
  const std::string v2 = version_name(2, false);
  REQUIRE(embstore::io::retire_version(run.serving, v2) == 0);
  std::string detail;
  CHECK(embstore::checkpoint::publish_serving(run.dir + "/" + v2, run.serving, &detail) == -ENOENT);
  CHECK(detail.find("is not the serving-only version its delta applies on") != std::string::npos);
  CHECK(!std::filesystem::exists(run.serving + "/" + v2));
  // Its own source: published.
  m.source_xxh3 ^= 1;
  REQUIRE(embstore::io::write_manifest(v1, m) == 0);
  INFO(detail);
  CHECK(embstore::checkpoint::publish_serving(run.dir + "/" + v2, run.serving, &detail) == 0);
  CHECK(manifest_of(run.serving + "/" + v2).source_xxh3 == manifest_of(run.dir + "/" + v2).xxh3);
}

TEST_CASE("A serving-only directory keeps keep_full chains, and the policy checks it",
          "[serving][serving_dir]") {
  SECTION("retention") {
    Publishing run(EMBSTORE_CODEC_NONE, /*keep_full=*/1);
    run.step_and_checkpoint(1, EMBSTORE_CKPT_FULL);
    run.step_and_checkpoint(2, EMBSTORE_CKPT_INCREMENTAL);
    run.step_and_checkpoint(3, EMBSTORE_CKPT_FULL);
    std::vector<embstore::io::VersionDir> versions;
    REQUIRE(embstore::io::list_versions(run.serving, &versions) == 0);
    REQUIRE(versions.size() == 1);
    CHECK(versions[0].version == 3);
    REQUIRE(embstore::io::list_versions(run.dir, &versions) == 0);
    CHECK(versions.size() == 1);
  }
  SECTION("a crash's leftovers go at the next publication") {
    embstore_test::TempDir tmp;
    const std::string dir = tmp.path() + "/ckpt", serving = tmp.path() + "/serving";
    for (const char* left : {"/.tmp-00000000000000000007-0123456789abcdef",
                             "/.tmp-retired-00000000000000000003.full-0123456789abcdef"}) {
      REQUIRE(std::filesystem::create_directories(serving + left + "/tables"));
    }
    Trainer trainer;
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.dir = dir.c_str();
    p.serving_dir = serving.c_str();
    REQUIRE(embstore_checkpoint_set_policy(trainer.store, &p) == EMBSTORE_OK);
    trainer.step(1);
    trainer.checkpoint(dir, EMBSTORE_CKPT_FULL);
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(serving)) {
      names.push_back(e.path().filename().string());
    }
    CHECK(std::count_if(names.begin(), names.end(),
                        [](const std::string& n) { return n.rfind(".tmp-", 0) == 0; }) == 0);
    CHECK(std::count(names.begin(), names.end(), version_name(1, true)) == 1);
  }
  SECTION("a checkpoint directory is refused as a serving_dir") {
    embstore_test::TempDir tmp;
    const std::string checkpoints = tmp.path() + "/ckpt", dir = tmp.path() + "/other";
    {
      Trainer trainer;  // writes version 1 there, and lets go of its lock
      trainer.step(1);
      trainer.checkpoint(checkpoints, EMBSTORE_CKPT_FULL);
    }
    embstore_store_t* s = host_store();
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.dir = dir.c_str();
    p.serving_dir = checkpoints.c_str();
    CHECK(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_INVALID_ARGUMENT);
    CHECK(std::string(embstore_last_error()).find("not serving-only") != std::string::npos);
    embstore_store_destroy(s);
  }
  SECTION("the policy's checks") {
    embstore_test::TempDir tmp;
    const std::string dir = tmp.path() + "/ckpt";
    embstore_store_t* s = host_store();
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    CHECK(p.serving_dir == nullptr);
    p.serving_dir = dir.c_str();
    CHECK(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_INVALID_ARGUMENT);  // no dir
    p.dir = dir.c_str();
    const std::string same = dir + "/";
    p.serving_dir = same.c_str();
    CHECK(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_INVALID_ARGUMENT);
    CHECK(std::string(embstore_last_error()).find("serving_dir") != std::string::npos);
    const std::string file = tmp.path() + "/a-file";
    REQUIRE(embstore::io::write_whole_file(file, "x", 1) == 0);
    p.serving_dir = file.c_str();
    CHECK(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_IO_ERROR);
    CHECK(std::string(embstore_last_error()).find(file) != std::string::npos);
    // A caller built before the field: none.
    p.struct_size = offsetof(embstore_checkpoint_policy_t, serving_dir);
    CHECK(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_OK);
    // Stats of a caller built before the serving counters: filled up to its size.
    embstore_checkpoint_stats_t st;
    std::memset(&st, 0xab, sizeof st);
    st.struct_size = offsetof(embstore_checkpoint_stats_t, serving_published);
    REQUIRE(embstore_checkpoint_stats(s, &st) == EMBSTORE_OK);
    CHECK(st.committed == 0);
    CHECK(st.serving_published == 0xababababababababull);  // untouched
    st.struct_size = offsetof(embstore_checkpoint_stats_t, deferred);
    CHECK(embstore_checkpoint_stats(s, &st) == EMBSTORE_INVALID_ARGUMENT);
    embstore_store_destroy(s);
  }
}

TEST_CASE("Rank 0 publishes every rank's values of a collective checkpoint",
          "[serving][serving_dir]") {
  embstore_test::TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt", serving = tmp.path() + "/serving";
  REQUIRE(embstore_test::threads::write_checkpoint(3, dir, -1, serving) == "");
  std::vector<embstore::io::VersionDir> written, published;
  REQUIRE(embstore::io::list_versions(dir, &written) == 0);
  REQUIRE(embstore::io::list_versions(serving, &published) == 0);
  REQUIRE(published.size() == written.size());
  REQUIRE(!written.empty());
  for (size_t i = 0; i < written.size(); ++i) {
    CHECK(published[i].name == written[i].name);
    const embstore::io::Manifest c = manifest_of(dir + "/" + written[i].name);
    const embstore::io::Manifest m = manifest_of(serving + "/" + published[i].name);
    CHECK(m.serving_only);
    CHECK(m.world_size == 3);
    REQUIRE(m.tables.size() == c.tables.size());
    for (size_t t = 0; t < m.tables.size(); ++t) {
      INFO(written[i].name << ", table " << m.tables[t].name);
      REQUIRE(m.tables[t].files.size() == 3);
      REQUIRE(c.tables[t].serving.size() == 3);
      for (size_t k = 0; k < 3; ++k)
        CHECK(m.tables[t].files[k].xxh3 == c.tables[t].serving[k].xxh3);
    }
  }
  embstore_follower_t* f = follow(serving);
  uint64_t served = 0;
  REQUIRE(embstore_follower_version(f, &served) == EMBSTORE_OK);
  CHECK(served == written.back().version);
  embstore_follower_destroy(f);
}

}  // namespace
