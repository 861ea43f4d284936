// MANIFEST.json: exact round trips, its own checksum, and every malformed input refused.
#include "io/format/manifest.hpp"

#include <xxhash.h>

#include <catch2/catch.hpp>
#include <cfloat>
#include <cinttypes>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "io/engine/regular_file.hpp"
#include "io/format/chain.hpp"
#include "tests/io/io_fixtures.hpp"

using namespace embstore::io;

namespace {

Manifest sample() {
  Manifest m;
  m.version = std::numeric_limits<uint64_t>::max() - 1;  // above 2^53: exact as an integer
  m.embstore_version = 100;
  m.lineage = 0x8000000000000001ull;
  TableEntry t;
  t.name = "emb.v2-x";
  embstore_table_config_init(&t.config);
  t.config.name = nullptr;
  t.config.dim = 13;
  t.config.optimizer = EMBSTORE_OPT_ADAM;
  t.config.learning_rate = 1.0f / 3.0f;
  t.config.epsilon = std::numeric_limits<float>::denorm_min();
  t.config.beta1 = 0.9f;
  t.config.beta2 = 0.999f;
  t.config.weight_decay = -0.0f;
  t.config.init = EMBSTORE_INIT_NORMAL;
  t.config.init_a = -FLT_MAX;
  t.config.init_b = FLT_MAX;
  t.config.seed = std::numeric_limits<uint64_t>::max();
  t.config.max_capacity = (uint64_t{1} << 60) + 1;
  t.config.admit_after = 4;
  t.config.admit_bloom_bytes = 1024;  // its counts file: the 24-byte header and the filter
  t.state_dim = 28;
  t.state_layout = state_layout(EMBSTORE_OPT_ADAM);
  t.rows = 7;
  t.table_rows = 9;
  t.files.push_back({"tables/emb.v2-x/shard-00000-of-00001.rows", 8192, 7, 0xfedcba9876543210ull});
  t.admission = {FileEntry{"tables/emb.v2-x/admission.counts", 1048, 0, 0x123456789abcdefull}};
  m.tables.push_back(t);
  m.attachments.push_back({"rng", {"attachments/rng", 3, 0, 0x1ull}});
  return m;
}

// sample() as a delta on version 12.
Manifest sample_delta() {
  Manifest d = sample();
  d.full = false;
  d.parent = 12;
  d.parent_xxh3 = 0xabcdef0123456789ull;
  return d;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

std::string parse_error(const std::string& text) {
  Manifest m;
  std::string detail;
  REQUIRE(parse_manifest(text, &m, &detail) == -EBADMSG);
  return detail;
}

// The text with the first `from` replaced by `to`, and its checksum recomputed: what a writer
// with a bug (not a flipped bit) would produce.
std::string edit(const Manifest& m, const std::string& from, const std::string& to) {
  std::string text = format_manifest(m);
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  text.replace(at, from.size(), to);
  auto j = nlohmann::json::parse(text);
  j.erase("manifest_xxh3");
  const std::string body = j.dump();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx",
                static_cast<unsigned long long>(XXH3_64bits(body.data(), body.size())));
  j["manifest_xxh3"] = hex;
  return j.dump(2);
}

}  // namespace

TEST_CASE("manifest: every field round-trips exactly", "[io][manifest]") {
  const Manifest m = sample();
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(format_manifest(m), &back, &detail) == 0);
  REQUIRE(back.version == m.version);
  REQUIRE(back.full);
  REQUIRE_FALSE(back.parent.has_value());
  REQUIRE(back.tables.size() == 1);
  const TableEntry& t = back.tables[0];
  REQUIRE(t.name == "emb.v2-x");
  REQUIRE(std::string(t.config.name) == "emb.v2-x");
  REQUIRE(t.config.dim == 13);
  REQUIRE(t.config.optimizer == EMBSTORE_OPT_ADAM);
  REQUIRE(same_bits(t.config.learning_rate, 1.0f / 3.0f));
  REQUIRE(same_bits(t.config.epsilon, std::numeric_limits<float>::denorm_min()));
  REQUIRE(same_bits(t.config.weight_decay, -0.0f));
  REQUIRE(same_bits(t.config.init_a, -FLT_MAX));
  REQUIRE(same_bits(t.config.init_b, FLT_MAX));
  REQUIRE(t.config.seed == std::numeric_limits<uint64_t>::max());
  REQUIRE(t.config.max_capacity == (uint64_t{1} << 60) + 1);
  REQUIRE(t.files[0].xxh3 == 0xfedcba9876543210ull);
  REQUIRE(t.rows == 7);
  REQUIRE(t.table_rows == 9);
  REQUIRE(t.config.admit_after == 4);
  REQUIRE(t.config.admit_bloom_bytes == 1024);
  REQUIRE(t.admission.size() == 1);
  REQUIRE(t.admission[0].path == "tables/emb.v2-x/admission.counts");
  REQUIRE(t.admission[0].bytes == 1048);
  REQUIRE(t.admission[0].xxh3 == 0x123456789abcdefull);
  // Tables without admission list no file, and read back without one.
  Manifest plain = m;
  plain.tables[0].admission.clear();
  plain.tables[0].config.admit_after = 0;  // a Bloom table always has its counts file
  plain.tables[0].config.admit_bloom_bytes = 0;
  REQUIRE(format_manifest(plain).find("admission.counts") == std::string::npos);
  REQUIRE(parse_manifest(format_manifest(plain), &back, &detail) == 0);
  REQUIRE(back.tables[0].admission.empty());
  REQUIRE(back.attachments.size() == 1);
  REQUIRE(back.attachments[0].file.path == "attachments/rng");
  REQUIRE(back.lineage == 0x8000000000000001ull);
  REQUIRE_FALSE(back.parent_xxh3.has_value());
  uint64_t sum = 0;
  REQUIRE(parse_manifest(format_manifest(m, &sum), &back, &detail) == 0);
  REQUIRE(back.xxh3 == sum);
  REQUIRE(sum != 0);
}

TEST_CASE("manifest: a delta names its parent's version, lineage and manifest checksum",
          "[io][manifest]") {
  Manifest d = sample_delta();
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(format_manifest(d), &back, &detail) == 0);
  REQUIRE(back.parent == std::optional<uint64_t>(12));
  REQUIRE(back.parent_xxh3 == std::optional<uint64_t>(0xabcdef0123456789ull));
  REQUIRE(back.lineage == d.lineage);
  SECTION("a delta without its parent's checksum is refused") {
    REQUIRE(parse_error(edit(d, "\"abcdef0123456789\"", "null")).find("parent_manifest_xxh3") !=
            std::string::npos);
  }
  SECTION("a lineage of 0 is refused") {
    REQUIRE(parse_error(edit(d, "\"8000000000000001\"", "\"0000000000000000\"")).find("lineage") !=
            std::string::npos);
  }
}

TEST_CASE("manifest: format 1 reads without lineage, in its own layout", "[io][manifest]") {
  Manifest m = sample();
  m.format_version = 1;
  m.lineage = 0;
  m.tables[0].files[0].path = "emb.v2-x/shard-00000-of-00001.rows";
  m.tables[0].admission[0].path = "emb.v2-x/admission.counts";
  const std::string text = format_manifest(m);
  REQUIRE(text.find("lineage") == std::string::npos);
  Manifest back;
  std::string detail;
  INFO(detail);
  REQUIRE(parse_manifest(text, &back, &detail) == 0);
  REQUIRE(back.format_version == 1);
  REQUIRE(back.lineage == 0);
  // Format 2's paths are not format 1's.
  Manifest mixed = m;
  mixed.tables[0].files[0].path = "tables/emb.v2-x/shard-00000-of-00001.rows";
  REQUIRE(parse_error(format_manifest(mixed)).find("not one of its") != std::string::npos);
}

TEST_CASE("manifest: a changed byte, a torn file or a bad field is refused", "[io][manifest]") {
  const Manifest m = sample();
  std::string text = format_manifest(m);
  SECTION("a digit changed without the checksum") {
    const auto at = text.find("\"dim\": 13");
    REQUIRE(at != std::string::npos);
    text[at + 8] = '4';
    REQUIRE(parse_error(text).find("checksum") != std::string::npos);
  }
  SECTION("torn") { parse_error(text.substr(0, text.size() / 2)); }
  SECTION("empty") { parse_error(""); }
  SECTION("a future format version") {
    REQUIRE(parse_error(edit(m, "\"format_version\": 3", "\"format_version\": 4"))
                .find("not supported") != std::string::npos);
  }
  SECTION("a path out of the version directory") {
    REQUIRE(parse_error(edit(m, "\"attachments/rng\"", "\"../rng\"")).find("relative path") !=
            std::string::npos);
  }
  SECTION("an admission file out of the version directory") {
    REQUIRE(parse_error(edit(m, "\"tables/emb.v2-x/admission.counts\"", "\"/etc/passwd\""))
                .find("relative path") != std::string::npos);
  }
  SECTION("a table listed twice") {
    Manifest twice = m;
    twice.tables.push_back(twice.tables[0]);
    REQUIRE(parse_error(format_manifest(twice)).find("twice") != std::string::npos);
  }
  SECTION("rows that do not add up") {
    REQUIRE(parse_error(edit(m, "\"rows\": 7", "\"rows\": 8")).find("add up") != std::string::npos);
  }
  SECTION("an unknown optimizer") {
    REQUIRE(parse_error(edit(m, "\"adam\"", "\"lion\"")).find("lion") != std::string::npos);
  }
  SECTION("a missing member") {
    REQUIRE(parse_error(edit(m, "\"seed\"", "\"sead\"")).find("seed") != std::string::npos);
  }
  SECTION("a float beyond float's range") {
    REQUIRE(parse_error(edit(m, "\"learning_rate\": 0.3333333432674408", "\"learning_rate\": 1e39"))
                .find("learning_rate' is out of the range of a float") != std::string::npos);
  }
  SECTION("a negative count") {
    REQUIRE(parse_error(edit(m, "\"bytes\": 3", "\"bytes\": -3")).find("bytes") !=
            std::string::npos);
  }
}

TEST_CASE("manifest: written and read back through a file", "[io][manifest]") {
  embstore_test::TempDir dir;
  Manifest back;
  std::string detail;
  REQUIRE(read_manifest(dir.path(), &back, &detail) == -ENOENT);
  REQUIRE(write_manifest(dir.path(), sample()) == 0);
  REQUIRE(read_manifest(dir.path(), &back, &detail) == 0);
  REQUIRE(back.tables.at(0).rows == 7);
  uint64_t sum = 0, bytes = 0;
  REQUIRE(checksum_file(dir.file(kManifestName), &sum, &bytes) == 0);
  std::string text;
  REQUIRE(read_regular(dir.file(kManifestName), kMaxManifestBytes, &text) == 0);
  REQUIRE(bytes == text.size());
  REQUIRE(sum == XXH3_64bits(text.data(), text.size()));
  REQUIRE(checksum_file(dir.file("missing"), &sum, &bytes) == -ENOENT);
}

// text (a manifest's JSON) edited by edit, with its manifest_xxh3 made right again: what only
// the field checks can refuse.
std::string edited(const std::string& text, const std::function<void(nlohmann::json&)>& edit) {
  nlohmann::json j = nlohmann::json::parse(text);
  edit(j);
  j.erase("manifest_xxh3");
  const std::string body = j.dump();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, XXH3_64bits(body.data(), body.size()));
  j["manifest_xxh3"] = hex;
  return j.dump();
}

TEST_CASE("manifest: rank fields only where several ranks wrote", "[io][manifest]") {
  Manifest m = sample();
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(edited(format_manifest(m), [](nlohmann::json&) {}), &back, &detail) == 0);
  // One rank: an attachment with a "rank", or counts as an array, are refused.
  CHECK(parse_manifest(
            edited(format_manifest(m), [](nlohmann::json& j) { j["attachments"][0]["rank"] = 0; }),
            &back, &detail) == -EBADMSG);
  CHECK(detail.find("has a 'rank' in a checkpoint of one rank") != std::string::npos);
  // Several ranks: "admission" is an array and every attachment has a rank.
  m.world_size = 2;
  m.tables[0].files[0].path = "tables/emb.v2-x/shard-00000-of-00002.rows";
  m.tables[0].admission[0].path = "tables/emb.v2-x/admission-00001-of-00002.counts";
  m.attachments[0].rank = 1;
  m.attachments[0].file.path = "attachments/rank-00001/rng";
  const std::string two = format_manifest(m);
  CHECK(two.find("\"admission\": [") != std::string::npos);
  REQUIRE(parse_manifest(two, &back, &detail) == 0);
  CHECK(back.tables[0].admission.size() == 1);
  CHECK(back.attachments[0].rank == 1);
  CHECK(parse_manifest(edited(two, [](nlohmann::json& j) { j["attachments"][0].erase("rank"); }),
                       &back, &detail) == -EBADMSG);
  CHECK(parse_manifest(edited(two,
                              [](nlohmann::json& j) {
                                j["tables"][0]["admission"] = j["tables"][0]["admission"][0];
                              }),
                       &back, &detail) == -EBADMSG);
  CHECK(detail.find("is not an array") != std::string::npos);
}

TEST_CASE("manifest: a Bloom filter its counts file cannot hold is refused", "[io][manifest]") {
  // A forged manifest must not make a reader allocate a filter (2^40 bytes here) that no file
  // backs: the counts file of a Bloom table is exactly its header and the filter.
  Manifest m = sample();
  m.tables[0].config.admit_bloom_bytes = uint64_t{1} << 40;
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(format_manifest(m), &back, &detail) == -EBADMSG);
  REQUIRE(detail.find("admit_bloom_bytes") != std::string::npos);
  Manifest without = sample();  // a filter and no counts file at all
  without.tables[0].admission.clear();
  REQUIRE(parse_manifest(format_manifest(without), &back, &detail) == -EBADMSG);
  REQUIRE(detail.find("no counts file") != std::string::npos);
  m.tables[0].config.admit_bloom_bytes = 1024;
  REQUIRE(parse_manifest(format_manifest(m), &back, &detail) == 0);
}

TEST_CASE("manifest: codecs round-trip in format 3 and are left out of format 2",
          "[io][manifest]") {
  Manifest m = sample();
  m.format_version = manifest_format_for(m);
  CHECK(m.format_version == kPlainManifestFormatVersion);
  CHECK(format_manifest(m).find("codec") == std::string::npos);

  m.tables[0].config.value_codec = EMBSTORE_CODEC_INT8;
  m.tables[0].config.state_codec = EMBSTORE_CODEC_BF16;
  m.tables[0].files[0].value_codec = Codec::kInt8;
  m.tables[0].files[0].state_codec = Codec::kBf16;
  CHECK(manifest_format_for(m) == kManifestFormatVersion);
  m.format_version = manifest_format_for(m);
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(format_manifest(m), &back, &detail) == 0);
  CHECK(back.format_version == 3);
  CHECK(back.tables[0].config.value_codec == EMBSTORE_CODEC_INT8);
  CHECK(back.tables[0].config.state_codec == EMBSTORE_CODEC_BF16);
  CHECK(back.tables[0].files[0].value_codec == Codec::kInt8);
  CHECK(back.tables[0].files[0].state_codec == Codec::kBf16);
  // Admission counts and attachments have no codecs.
  CHECK(back.tables[0].admission[0].value_codec == Codec::kNone);
  CHECK(back.attachments[0].file.value_codec == Codec::kNone);
  CHECK(format_manifest(back) == format_manifest(m));

  // A file alone with a codec makes it format 3 too (compaction of a table without codecs
  // never writes one, but a reader must not depend on that).
  Manifest file_only = sample();
  file_only.tables[0].files[0].value_codec = Codec::kLossless;
  CHECK(manifest_format_for(file_only) == kManifestFormatVersion);

  SECTION("an unknown codec is refused") {
    CHECK(parse_error(edit(m, "\"value_codec\": \"int8\"", "\"value_codec\": \"int4\""))
              .find("'value_codec' has unknown value 'int4'") != std::string::npos);
  }
  SECTION("optimizer state in int8 is refused, in the config and in a file") {
    CHECK(parse_error(edit(m, "\"state_codec\": \"bf16\"", "\"state_codec\": \"int8\""))
              .find("state_codec 'int8'") != std::string::npos);
    Manifest file_int8 = m;
    file_int8.tables[0].files[0].state_codec = Codec::kInt8;
    CHECK(parse_error(format_manifest(file_int8)).find("optimizer state in int8") !=
          std::string::npos);
  }
}

TEST_CASE("manifest: a delta's values-only files round-trip in format 3, each its row file's copy",
          "[io][manifest]") {
  Manifest d = sample_delta();
  d.tables[0].config.serving_codec = EMBSTORE_CODEC_BF16;
  d.tables[0].serving.push_back(
      {"tables/emb.v2-x/serving-00000-of-00001.rows", 4096, 7, 0x42ull, Codec::kLossless});
  CHECK(manifest_format_for(d) == kManifestFormatVersion);
  d.format_version = manifest_format_for(d);
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(format_manifest(d), &back, &detail) == 0);
  CHECK(back.tables[0].config.serving_codec == EMBSTORE_CODEC_BF16);
  REQUIRE(back.tables[0].serving.size() == 1);
  CHECK(back.tables[0].serving[0].path == "tables/emb.v2-x/serving-00000-of-00001.rows");
  CHECK(back.tables[0].serving[0].rows == 7);
  CHECK(back.tables[0].serving[0].value_codec == Codec::kLossless);
  CHECK(format_manifest(back) == format_manifest(d));
  // A serving codec alone (a full checkpoint of such a table) is format 3 too.
  Manifest codec_only = sample();
  codec_only.tables[0].config.serving_codec = EMBSTORE_CODEC_INT8;
  CHECK(manifest_format_for(codec_only) == kManifestFormatVersion);
  // Format 3 manifests written before values-only deltas have no serving_codec: none.
  {
    Manifest old_style = sample();
    old_style.tables[0].config.value_codec = EMBSTORE_CODEC_LOSSLESS;
    old_style.format_version = manifest_format_for(old_style);
    REQUIRE(parse_manifest(edit(old_style, "\"serving_codec\": \"none\",", ""), &back, &detail) ==
            0);
    CHECK(back.tables[0].config.serving_codec == EMBSTORE_CODEC_NONE);
  }

  SECTION("in a full checkpoint (a policy with a serving_dir publishes fulls too)") {
    Manifest full = d;
    full.full = true;
    full.parent.reset();
    full.parent_xxh3.reset();
    REQUIRE(parse_manifest(format_manifest(full), &back, &detail) == 0);
    CHECK(back.tables[0].serving.size() == 1);
  }
  SECTION("one that is not its row file's copy, or lists other rows") {
    CHECK(parse_error(edit(d, "serving-00000-of-00001", "serving-00001-of-00001"))
              .find("is not the copy of") != std::string::npos);
    CHECK(parse_error(edit(d, "serving-00000-of-00001", "shard-00000-of-00001"))
              .find("is not the copy of") != std::string::npos);
    Manifest rows = d;
    rows.tables[0].serving[0].rows = 6;
    CHECK(parse_error(format_manifest(rows)).find("holds 6 rows, its row file 7") !=
          std::string::npos);
    Manifest two = d;
    two.tables[0].serving.push_back(two.tables[0].serving[0]);
    CHECK(parse_error(format_manifest(two)).find("2 values-only files for 1 row files") !=
          std::string::npos);
  }
  SECTION("with optimizer state, or not an array") {
    Manifest state = d;
    state.tables[0].serving[0].state_codec = Codec::kBf16;
    CHECK(parse_error(format_manifest(state)).find("has a state codec") != std::string::npos);
    CHECK(parse_error(edit(d, "\"serving_files\": [", "\"serving_files\": 5, \"x\": ["))
              .find("is not an array") != std::string::npos);
  }
}

// A serving-only version (the policy's serving_dir): values only, nothing else.
Manifest serving_only_sample() {
  Manifest m = sample_delta();
  m.serving_only = true;
  m.attachments.clear();
  TableEntry& t = m.tables[0];
  t.config.admit_bloom_bytes = 0;  // no counts, so no filter (the publisher drops it)
  t.admission.clear();
  t.state_dim = 0;
  t.state_layout.clear();
  t.files[0].value_codec = Codec::kLossless;
  m.source_xxh3 = 0x0123456789abcdefull;
  m.format_version = manifest_format_for(m);
  return m;
}

TEST_CASE("manifest: a serving-only version round-trips in format 3 and holds values only",
          "[io][manifest]") {
  const Manifest m = serving_only_sample();
  CHECK(m.format_version == kManifestFormatVersion);
  Manifest back;
  std::string detail;
  REQUIRE(parse_manifest(format_manifest(m), &back, &detail) == 0);
  CHECK(back.serving_only);
  CHECK(back.source_xxh3 == 0x0123456789abcdefull);
  CHECK(back.tables[0].state_dim == 0);
  CHECK(parse_error(edit(m, "\"source_manifest_xxh3\"", "\"x\"")).find("source_manifest_xxh3") !=
        std::string::npos);
  CHECK(format_manifest(back) == format_manifest(m));
  // Without the member (every manifest before it): not serving-only.
  REQUIRE(parse_manifest(format_manifest(sample()), &back, &detail) == 0);
  CHECK_FALSE(back.serving_only);
  {
    Manifest two = sample();
    two.format_version = kPlainManifestFormatVersion;
    CHECK(parse_error(edit(two, "\"tables\":", "\"serving_only\": true, \"tables\":"))
              .find("'serving_only' in format 2") != std::string::npos);
  }
  CHECK(parse_error(edit(m, "\"serving_only\": true", "\"serving_only\": 1"))
            .find("'serving_only' is not a boolean") != std::string::npos);

  SECTION("optimizer state, counts, attachments or copies are refused") {
    Manifest state = m;
    state.tables[0].state_dim = 28;
    CHECK(parse_error(format_manifest(state)).find("state_dim 28 in a serving-only version") !=
          std::string::npos);
    Manifest layout = m;
    layout.tables[0].state_layout = state_layout(EMBSTORE_OPT_ADAM);
    CHECK(parse_error(format_manifest(layout)).find("in a serving-only version") !=
          std::string::npos);
    Manifest codec = m;
    codec.tables[0].files[0].state_codec = Codec::kBf16;
    CHECK(parse_error(format_manifest(codec)).find("has a state codec in a serving-only") !=
          std::string::npos);
    Manifest counts = m;
    counts.tables[0].admission = sample().tables[0].admission;
    CHECK(parse_error(format_manifest(counts)).find("admission counts in a serving-only") !=
          std::string::npos);
    Manifest bloom = m;
    bloom.tables[0].config.admit_bloom_bytes = 1024;
    CHECK(parse_error(format_manifest(bloom)).find("admit_bloom_bytes in a serving-only") !=
          std::string::npos);
    Manifest attached = m;
    attached.attachments = sample().attachments;
    CHECK(parse_error(format_manifest(attached)).find("attachments in a serving-only") !=
          std::string::npos);
    Manifest copies = m;
    copies.tables[0].serving.push_back(
        {"tables/emb.v2-x/serving-00000-of-00001.rows", 4096, 7, 0x42ull, Codec::kLossless});
    CHECK(parse_error(format_manifest(copies)).find("values-only copies in a serving-only") !=
          std::string::npos);
  }
  SECTION("a chain does not mix serving-only versions with a checkpoint's") {
    Manifest parent = sample();
    parent.version = 12;
    format_manifest(parent, &parent.xxh3);
    Manifest child = m;
    child.parent_xxh3 = parent.xxh3;
    std::string why;
    CHECK(check_link(child, parent, &why) == -EBADMSG);
    CHECK(why.find("serving-only") != std::string::npos);
    parent.serving_only = true;
    CHECK(check_link(child, parent, &why) == 0);
  }
}

TEST_CASE("manifest: JSON nested deeper than the limit is refused, not a crash", "[io][manifest]") {
  // nlohmann's dump recursed once a level: 100,000 levels overflowed the stack of every reader.
  for (const size_t depth : {size_t{kMaxManifestDepth} + 1, size_t{100000}}) {
    CAPTURE(depth);
    const std::string text = R"({"manifest_xxh3":"0000000000000000","x":)" +
                             std::string(depth, '[') + std::string(depth, ']') + "}";
    Manifest back;
    std::string detail;
    REQUIRE(parse_manifest(text, &back, &detail) == -EBADMSG);
    REQUIRE(detail.find("nested deeper") != std::string::npos);
  }
}
