// Values-only deltas (embstore_checkpoint_policy_t::serving_deltas, issue 35): each delta gets a
// copy of every row file without optimizer state, in the table's serving_codec; followers read
// it instead of the whole delta and serve the same rows (within the codec's bound), fall back to
// the whole delta when a copy does not read, and restores never need it.
#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "io/codec/block_codec.hpp"
#include "io/format/chain.hpp"
#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"
#include "shard/thread_group.hpp"
#include "tests/serving/follower_fixtures.hpp"

namespace {

using namespace embstore_test::serving;
using embstore::io::Codec;

constexpr const char* kDelta3 = "/00000000000000000003.delta";

std::string serving_path(const std::string& dir, const char* table) {
  return dir + kDelta3 + "/" +
         embstore::io::serving_file_path(embstore::io::kManifestFormatVersion, table, 0, 1);
}

TEST_CASE("Followers read values-only deltas and serve what a restore holds, within the codec",
          "[serving][serving_deltas]") {
  const auto [api_codec, codec] = GENERATE(std::pair{EMBSTORE_CODEC_NONE, Codec::kNone},
                                           std::pair{EMBSTORE_CODEC_LOSSLESS, Codec::kLossless},
                                           std::pair{EMBSTORE_CODEC_BF16, Codec::kBf16},
                                           std::pair{EMBSTORE_CODEC_INT8, Codec::kInt8});
  CAPTURE(embstore::io::codec_name(codec));
  Run run(/*serving_deltas=*/true, api_codec);
  const std::string& dir = run.dir;
  embstore_follower_t* f = follow(dir);
  uint64_t v = 0, serving_bytes = 0, whole_bytes = 0;
  for (uint64_t s = 2; s <= 4; ++s) {
    run.trainer.step(s);
    run.trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
    REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
    REQUIRE(v == s);
    check_equals_restore(f, dir, s, 0, 1, codec);
    char name[64];
    std::snprintf(name, sizeof name, "/%020llu.delta", static_cast<unsigned long long>(s));
    const embstore::io::Manifest m = manifest_of(dir + name);
    CHECK(m.format_version == embstore::io::kManifestFormatVersion);
    for (const embstore::io::TableEntry& t : m.tables) {
      INFO("table " << t.name);
      REQUIRE(t.serving.size() == 1);
      CHECK(t.serving[0].rows == t.files[0].rows);
      CHECK(t.config.serving_codec == api_codec);
      // bf16 is stored as its rounded floats, losslessly.
      CHECK(t.serving[0].value_codec == (codec == Codec::kBf16 ? Codec::kLossless : codec));
      CHECK(t.serving[0].bytes <= t.files[0].bytes);
      serving_bytes += t.serving[0].bytes;
      whole_bytes += t.files[0].bytes;
    }
  }
  const embstore_follower_stats_t st = stats_of(f);
  CHECK(st.serving_files_read == 6);  // 3 deltas x 2 tables
  CHECK(st.serving_fallbacks == 0);
  CHECK(st.delta_bytes_read == serving_bytes);
  CHECK(serving_bytes < whole_bytes);
  embstore_follower_destroy(f);
  // The full checkpoint has none; a restore of the chain is exact (it never reads them).
  CHECK(manifest_of(dir + "/00000000000000000001.full").tables[0].serving.empty());
}

TEST_CASE("A follower reads the whole delta when a values-only file is corrupt or missing",
          "[serving][serving_deltas]") {
  const bool remove = GENERATE(false, true);
  CAPTURE(remove);
  Run run(/*serving_deltas=*/true);
  const std::string& dir = run.dir;
  run.trainer.step(2);
  run.trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  embstore_follower_t* f = follow(dir);
  run.trainer.step(3);
  run.trainer.checkpoint(dir, EMBSTORE_CKPT_INCREMENTAL);
  const std::string file = serving_path(dir, "items");
  if (remove) {
    REQUIRE(std::filesystem::remove(file));
  } else {
    std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(io.good());
    io.seekp(100);  // in the first block's keys
    io.put('\x42');
  }
  uint64_t v = 0;
  REQUIRE(embstore_follower_poll(f, &v) == EMBSTORE_OK);
  CHECK(v == 3);
  check_equals_restore(f, dir, 3);  // exact: the whole delta's rows
  const embstore_follower_stats_t st = stats_of(f);
  CHECK(st.serving_fallbacks == 1);
  CHECK(st.serving_files_read == 1);  // "counted"'s
  // The bytes of the files applied: "counted"'s copy and "items"'s whole file.
  const embstore::io::Manifest m = manifest_of(dir + kDelta3);
  uint64_t applied = 0;
  for (const embstore::io::TableEntry& t : m.tables) {
    applied += t.name == "items" ? t.files[0].bytes : t.serving[0].bytes;
  }
  CHECK(st.delta_bytes_read == applied);
  // A restore of the version never needed it.
  embstore_store_t* restored = host_store();
  CHECK(embstore_restore(restored, dir.c_str(), 3, nullptr) == EMBSTORE_OK);
  embstore_store_destroy(restored);
  embstore_follower_destroy(f);
}

TEST_CASE("Values-only deltas follow the policy: only deltas, only when asked, checked",
          "[serving][serving_deltas]") {
  SECTION("without serving_deltas a delta has none") {
    Run run(/*serving_deltas=*/false, EMBSTORE_CODEC_BF16);
    run.trainer.step(2);
    run.trainer.checkpoint(run.dir, EMBSTORE_CKPT_INCREMENTAL);
    const embstore::io::Manifest m = manifest_of(run.dir + "/00000000000000000002.delta");
    for (const embstore::io::TableEntry& t : m.tables) CHECK(t.serving.empty());
    CHECK(!std::filesystem::exists(
        run.dir + "/00000000000000000002.delta/" +
        embstore::io::serving_file_path(embstore::io::kManifestFormatVersion, "items", 0, 1)));
  }
  SECTION("the policy's checks") {
    embstore_store_t* s = host_store();
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    CHECK(p.serving_deltas == 0);
    p.serving_deltas = 2;
    CHECK(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_INVALID_ARGUMENT);
    CHECK(std::string(embstore_last_error()).find("serving_deltas") != std::string::npos);
    // A caller built before the field: serving_deltas off.
    p.struct_size = offsetof(embstore_checkpoint_policy_t, serving_deltas);
    CHECK(embstore_checkpoint_set_policy(s, &p) == EMBSTORE_OK);
    embstore_table_config_t c;
    embstore_table_config_init(&c);
    CHECK(c.serving_codec == EMBSTORE_CODEC_NONE);
    c.name = "t";
    c.dim = 4;
    c.serving_codec = static_cast<embstore_codec_t>(9);
    embstore_table_t* t = nullptr;
    CHECK(embstore_table_create(s, &c, &t) == EMBSTORE_INVALID_ARGUMENT);
    CHECK(std::string(embstore_last_error()).find("serving_codec") != std::string::npos);
    embstore_store_destroy(s);
  }
  SECTION("a restore creates tables with their serving codec") {
    Run run(/*serving_deltas=*/true, EMBSTORE_CODEC_INT8);
    run.trainer.step(2);
    run.trainer.checkpoint(run.dir, EMBSTORE_CKPT_INCREMENTAL);
    embstore_store_t* restored = host_store();
    REQUIRE(embstore_restore(restored, run.dir.c_str(), EMBSTORE_LATEST, nullptr) == EMBSTORE_OK);
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.serving_deltas = 1;
    REQUIRE(embstore_checkpoint_set_policy(restored, &p) == EMBSTORE_OK);
    // The trainer holds run.dir's writer lock: a chain of the restored store's own.
    const std::string dir = run.tmp.path() + "/again";
    uint64_t v = 0;
    for (const auto& [step, kind] :
         {std::pair{5, EMBSTORE_CKPT_FULL}, std::pair{6, EMBSTORE_CKPT_INCREMENTAL}}) {
      REQUIRE(embstore_step(restored, step) == EMBSTORE_OK);
      REQUIRE(embstore_checkpoint(restored, dir.c_str(), kind, &v) == EMBSTORE_OK);
      REQUIRE(embstore_checkpoint_wait(restored, v) == EMBSTORE_OK);
    }
    const embstore::io::Manifest m = manifest_of(dir + "/00000000000000000006.delta");
    for (const embstore::io::TableEntry& t : m.tables) {
      CHECK(t.config.serving_codec == EMBSTORE_CODEC_INT8);
      CHECK(t.serving.size() == 1);
    }
    embstore_store_destroy(restored);
  }
}

TEST_CASE(
    "Every rank of a collective checkpoint writes values-only files when rank 0's policy asks",
    "[serving][serving_deltas]") {
  for (const int asking : {0, 1}) {
    CAPTURE(asking);
    embstore_test::TempDir tmp;
    const std::string dir = tmp.path() + "/ckpt";
    REQUIRE(embstore_test::threads::write_checkpoint(3, dir, asking) == "");
    for (const char* version : {"00000000000000000004.delta", "00000000000000000006.delta"}) {
      const std::string vdir = dir + "/" + version;
      const embstore::io::Manifest m = manifest_of(vdir);
      for (const embstore::io::TableEntry& t : m.tables) {
        INFO(version << ", table " << t.name);
        if (asking != 0) {  // another rank's policy does not decide
          CHECK(t.serving.empty());
          continue;
        }
        REQUIRE(t.serving.size() == 3);
        for (size_t k = 0; k < t.serving.size(); ++k) {
          std::vector<int64_t> want, got;
          std::string detail;
          const auto keys_into = [](std::vector<int64_t>* keys) {
            return [keys](const embstore::io::RowBlock& b, std::string*) {
              keys->insert(keys->end(), b.keys, b.keys + b.rows);
              return 0;
            };
          };
          REQUIRE(embstore::io::read_row_file(vdir + "/" + t.files[k].path, t.files[k], t, false,
                                              keys_into(&want), &detail) == 0);
          INFO(detail);
          REQUIRE(embstore::io::read_serving_file(vdir + "/" + t.serving[k].path, t.serving[k], t,
                                                  keys_into(&got), &detail) == 0);
          CHECK(got == want);
        }
      }
    }
    // A follower loads the chain (its whole files: values-only ones serve polls only).
    embstore_follower_t* f = follow(dir);
    uint64_t served = 0;
    REQUIRE(embstore_follower_version(f, &served) == EMBSTORE_OK);
    CHECK(served == 6);
    embstore_follower_destroy(f);
  }
}

}  // namespace
