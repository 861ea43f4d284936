// Codecs through the public API (issue 35): a table's value_codec and state_codec are checked
// at creation, recorded in the manifest, and every checkpoint file of the table is encoded with
// them; restore, deltas, warm start and followers decode. Each case trains a table with codecs
// beside a twin without (the same config and batches, so the same rows), and holds what a
// restore gives back against the twin: bit for bit for lossless, within the codec's bound for
// bf16 and int8.
#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>
#include <vector>

#include "checkpoint_fixtures.hpp"
#include "io/codec/block_codec.hpp"
#include "io/format/manifest.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

namespace {

constexpr int64_t kKeys = 400;
constexpr uint32_t kDim = 16;

embstore_table_config_t coded_config(const char* name, embstore_codec_t values,
                                     embstore_codec_t state) {
  embstore_table_config_t c = config_for(name, kDim, EMBSTORE_OPT_ADAGRAD);
  c.value_codec = values;
  c.state_codec = state;
  return c;
}

// Whether got is what codec may make of want (rows of kDim floats or of width floats).
bool within(embstore_codec_t codec, const std::vector<float>& want, const std::vector<float>& got,
            uint32_t width) {
  return want.size() == got.size() &&
         embstore::io::within_bound(static_cast<embstore::io::Codec>(codec), want.data(),
                                    got.data(), width == 0 ? 0 : want.size() / width, width);
}

// A row file's rows split into values and state, as read_rows decodes them.
struct Split {
  std::vector<int64_t> keys;
  std::vector<float> values, state;
};
Split split(const std::map<int64_t, std::vector<float>>& rows) {
  Split s;
  for (const auto& [key, rec] : rows) {
    s.keys.push_back(key);
    s.values.insert(s.values.end(), rec.begin(), rec.begin() + kDim);
    s.state.insert(s.state.end(), rec.begin() + kDim, rec.end());
  }
  return s;
}

struct Pair {
  embstore_codec_t values, state;
};

// One step of the same batch on each table (train_step's batches: drawn from the step alone).
void train_all(embstore_store_t* store, std::initializer_list<embstore_table_t*> tables,
               uint64_t step, int64_t keys, size_t batch) {
  std::vector<int64_t> k;
  std::vector<float> g;
  step_batch(step, keys, batch, kDim, &k, &g);
  for (embstore_table_t* t : tables) {
    lookup_ok(t, k);
    apply_ok(t, k, g);
  }
  ok(embstore_step(store, step));
}

}  // namespace

TEST_CASE("codecs: refused when unknown, and state in int8 is refused", "[checkpoint][codec]") {
  embstore_store_t* store = make_store();
  embstore_table_t* t = nullptr;
  embstore_table_config_t c = coded_config("t", EMBSTORE_CODEC_NONE, EMBSTORE_CODEC_NONE);
  c.value_codec = static_cast<embstore_codec_t>(4);
  require_status(embstore_table_create(store, &c, &t), EMBSTORE_INVALID_ARGUMENT,
                 "unknown value_codec 4");
  c.value_codec = EMBSTORE_CODEC_NONE;
  c.state_codec = static_cast<embstore_codec_t>(-1);
  require_status(embstore_table_create(store, &c, &t), EMBSTORE_INVALID_ARGUMENT,
                 "unknown state_codec -1");
  c.state_codec = EMBSTORE_CODEC_INT8;
  require_status(embstore_table_create(store, &c, &t), EMBSTORE_INVALID_ARGUMENT,
                 "state_codec INT8 is refused");
  // A caller built before codecs (a struct without them) gets none.
  c.struct_size = offsetof(embstore_table_config_t, value_codec);
  ok(embstore_table_create(store, &c, &t));
  embstore_store_destroy(store);
}

TEST_CASE("codecs: full and delta checkpoints restore within each codec's bound",
          "[checkpoint][codec]") {
  const Pair pair = GENERATE(Pair{EMBSTORE_CODEC_LOSSLESS, EMBSTORE_CODEC_LOSSLESS},
                             Pair{EMBSTORE_CODEC_BF16, EMBSTORE_CODEC_LOSSLESS},
                             Pair{EMBSTORE_CODEC_INT8, EMBSTORE_CODEC_BF16});
  INFO("value_codec " << pair.values << ", state_codec " << pair.state);
  TempDir dir;
  embstore_store_t* store = make_store();
  embstore_table_t* coded = make_table(store, coded_config("coded", pair.values, pair.state));
  embstore_table_t* plain =
      make_table(store, coded_config("plain", EMBSTORE_CODEC_NONE, EMBSTORE_CODEC_NONE));
  no_rebaseline(store);
  for (uint64_t step = 1; step <= 5; ++step) train_all(store, {coded, plain}, step, kKeys, 256);
  const uint64_t full = checkpoint_ok(store, dir.path());
  // A few rows: a small delta.
  for (uint64_t step = 6; step <= 7; ++step) train_all(store, {coded, plain}, step, kKeys / 8, 64);
  const uint64_t delta = incremental_ok(store, dir.path());
  REQUIRE(delta > full);

  // The files: the manifest records the codecs (format 3), and the coded table's rows decode
  // within the bound of the twin's, in fewer bytes.
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(version_dir(dir.path(), full), &m, &detail) == 0);
  CHECK(m.format_version == embstore::io::kManifestFormatVersion);
  for (const embstore::io::TableEntry& e : m.tables) {
    const bool is_coded = e.name == "coded";
    CHECK(e.config.value_codec == (is_coded ? pair.values : EMBSTORE_CODEC_NONE));
    CHECK(e.config.state_codec == (is_coded ? pair.state : EMBSTORE_CODEC_NONE));
    REQUIRE(e.files.size() == 1);
    CHECK(static_cast<int>(e.files[0].value_codec) == (is_coded ? pair.values : 0));
  }
  const Split coded_rows = split(read_rows(table_file(dir.path(), full, "coded")));
  const Split plain_rows = split(read_rows(table_file(dir.path(), full, "plain")));
  REQUIRE(coded_rows.keys == plain_rows.keys);
  CHECK(within(pair.values, plain_rows.values, coded_rows.values, kDim));
  CHECK(within(pair.state, plain_rows.state, coded_rows.state, kDim));
  CHECK(std::filesystem::file_size(table_file(dir.path(), full, "coded")) <
        std::filesystem::file_size(table_file(dir.path(), full, "plain")));

  // Restored into a fresh store, the tables come from the manifest with their codecs, and
  // their rows are within the bound of the twin's at the delta's step.
  const std::vector<int64_t> keys = key_range(kKeys);
  const std::vector<float> want = lookup_ok(plain, keys, 0);
  embstore_store_t* back = make_store();
  CHECK(restore_ok(back, dir.path(), EMBSTORE_LATEST) == delta);
  embstore_table_t* restored = get_table(back, "coded");
  const std::vector<float> got = lookup_ok(restored, keys, 0);
  CHECK(within(pair.values, want, got, kDim));
  CHECK(same_bits(lookup_ok(get_table(back, "plain"), keys, 0), want));

  // A checkpoint of the restored store keeps the codecs it read.
  TempDir again;
  const uint64_t v = checkpoint_ok(back, again.path());
  embstore::io::Manifest m2;
  REQUIRE(embstore::io::read_manifest(version_dir(again.path(), v), &m2, &detail) == 0);
  for (const embstore::io::TableEntry& e : m2.tables) {
    if (e.name == "coded") {
      CHECK(e.config.value_codec == pair.values);
      CHECK(e.config.state_codec == pair.state);
    }
  }

  // Lossless all through: training goes on from the restore exactly as from the twin.
  if (pair.values == EMBSTORE_CODEC_LOSSLESS && pair.state == EMBSTORE_CODEC_LOSSLESS) {
    for (uint64_t step = 8; step <= 9; ++step) train_all(back, {restored}, step, kKeys, 256);
    for (uint64_t step = 8; step <= 9; ++step) train_all(store, {plain}, step, kKeys, 256);
    CHECK(same_bits(lookup_ok(restored, keys, 0), lookup_ok(plain, keys, 0)));
  }
  embstore_store_destroy(back);
  embstore_store_destroy(store);
}

TEST_CASE("codecs: warm start and followers read encoded checkpoints", "[checkpoint][codec]") {
  TempDir dir;
  embstore_store_t* store = make_store();
  embstore_table_t* t =
      make_table(store, coded_config("coded", EMBSTORE_CODEC_INT8, EMBSTORE_CODEC_BF16));
  for (uint64_t step = 1; step <= 3; ++step) train_step(store, t, step, kKeys);
  checkpoint_ok(store, dir.path());
  const std::vector<int64_t> keys = key_range(kKeys);

  embstore_store_t* restored = make_store();
  restore_ok(restored, dir.path(), EMBSTORE_LATEST);
  const std::vector<float> want = lookup_ok(get_table(restored, "coded"), keys, 0);

  embstore_follower_config_t fc;
  embstore_follower_config_init(&fc);
  fc.dir = dir.path().c_str();
  fc.backend = backend();  // follower_lookup passes device pointers on CUDA
  embstore_follower_t* follower = nullptr;
  ok(embstore_follower_create(&fc, &follower));
  std::vector<float> served;
  ok(follower_lookup(follower, "coded", keys, kDim, &served));
  CHECK(same_bits(served, want));  // the same decoding of the same file
  embstore_follower_destroy(follower);

  embstore_store_t* warm = make_store();
  embstore_table_t* wt =
      make_table(warm, coded_config("coded", EMBSTORE_CODEC_NONE, EMBSTORE_CODEC_NONE));
  embstore_warm_start_source_t src;
  embstore_warm_start_source_init(&src);
  src.dir = dir.path().c_str();
  ok(embstore_warm_start(warm, &src, 1));
  CHECK(same_bits(lookup_ok(wt, keys, 0), want));

  embstore_store_destroy(warm);
  embstore_store_destroy(restored);
  embstore_store_destroy(store);
}

TEST_CASE("codecs: a corrupt encoded block fails the restore, naming the file",
          "[checkpoint][codec]") {
  TempDir dir;
  embstore_store_t* store = make_store();
  embstore_table_t* t =
      make_table(store, coded_config("coded", EMBSTORE_CODEC_LOSSLESS, EMBSTORE_CODEC_LOSSLESS));
  for (uint64_t step = 1; step <= 3; ++step) train_step(store, t, step, kKeys);
  const uint64_t v = checkpoint_ok(store, dir.path());
  flip_byte(table_file(dir.path(), v, "coded"), 64 + kKeys * 8 + 100);  // in a zstd frame
  embstore_store_t* back = make_store();
  uint64_t restored = 0;
  require_status(embstore_restore(back, dir.path().c_str(), EMBSTORE_LATEST, &restored),
                 EMBSTORE_CORRUPT, "shard-00000-of-00001.rows");
  embstore_store_destroy(back);
  embstore_store_destroy(store);
}
