// embstore-ckpt on checkpoints with codecs (issue 35): verify checks encoded files and names a
// corrupt one, inspect shows the codecs and the decoded rows, compact keeps the tables' codecs
// and restores what the chain restores (bit for bit for lossless, within int8's bound where
// int8 values are encoded again), and reshard's files decode.
#include <embstore/embstore.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "io/codec/block_codec.hpp"
#include "io/format/layout.hpp"
#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::tool;
using embstore::io::version_dir_name;

namespace {

constexpr uint32_t kDim = 32;
constexpr int64_t kKeys = 3000;

// A chain (full at 10, delta at 20) of two tables: "coded" (int8 values, bf16 state, values-only
// deltas in bf16) and "exact" (lossless both, values-only deltas as floats), both Adagrad.
// publish: the policy's dir is the chain's, and it publishes to serving() (a serving-only
// directory).
class CodedChain {
 public:
  explicit CodedChain(bool publish = false) {
    dir_ = tmp_.path() + "/ckpt";
    serving_ = tmp_.path() + "/serving";
    embstore_store_config_t sc;
    embstore_store_config_init(&sc);
    sc.backend = EMBSTORE_BACKEND_HOST;
    ok(embstore_store_create(&sc, &store_));
    embstore_checkpoint_policy_t p;
    embstore_checkpoint_policy_init(&p);
    p.max_chain_length = 0;
    p.rebaseline_fraction = 0;
    p.serving_deltas = 1;
    if (publish) {
      p.dir = dir_.c_str();
      p.serving_dir = serving_.c_str();
    }
    ok(embstore_checkpoint_set_policy(store_, &p));
    for (const auto& [name, values, state, serving] :
         {std::tuple{"coded", EMBSTORE_CODEC_INT8, EMBSTORE_CODEC_BF16, EMBSTORE_CODEC_BF16},
          std::tuple{"exact", EMBSTORE_CODEC_LOSSLESS, EMBSTORE_CODEC_LOSSLESS,
                     EMBSTORE_CODEC_NONE}}) {
      embstore_table_config_t c;
      embstore_table_config_init(&c);
      c.name = name;
      c.dim = kDim;
      c.init = EMBSTORE_INIT_NORMAL;
      c.init_a = 0.0f;
      c.init_b = 0.05f;
      c.value_codec = values;
      c.state_codec = state;
      c.serving_codec = serving;
      embstore_table_t* t = nullptr;
      ok(embstore_table_create(store_, &c, &t));
      tables_.push_back(t);
    }
    train(10, kKeys);
    checkpoint(EMBSTORE_CKPT_FULL);
    train(20, kKeys / 10);
    checkpoint(EMBSTORE_CKPT_INCREMENTAL);
  }
  ~CodedChain() { embstore_store_destroy(store_); }

  const std::string& dir() const { return dir_; }
  const std::string& serving() const { return serving_; }

 private:
  void train(uint64_t step, int64_t keys) {
    std::vector<int64_t> k(static_cast<size_t>(keys));
    for (int64_t i = 0; i < keys; ++i)
      k[static_cast<size_t>(i)] = i * 3 + static_cast<int64_t>(step);
    std::vector<float> out(k.size() * kDim), g(k.size() * kDim);
    for (size_t i = 0; i < g.size(); ++i)
      g[i] = static_cast<float>((i * 2654435761u) % 1000) / 500 - 1;
    for (embstore_table_t* t : tables_) {
      ok(embstore_lookup(t, k.data(), k.size(), out.data(), EMBSTORE_LOOKUP_INSERT, nullptr));
      ok(embstore_apply_gradients(t, k.data(), g.data(), k.size(), nullptr));
    }
    ok(embstore_step(store_, step));
  }
  void checkpoint(embstore_ckpt_kind_t kind) {
    uint64_t v = 0;
    ok(embstore_checkpoint(store_, dir_.c_str(), kind, &v));
    ok(embstore_checkpoint_wait(store_, v));
  }

  TempDir tmp_;
  std::string dir_, serving_;
  embstore_store_t* store_ = nullptr;
  std::vector<embstore_table_t*> tables_;
};

// Every key's values as a restore of dir's latest version gives them, for table.
std::vector<float> restored_values(const std::string& dir, const char* table,
                                   const std::vector<int64_t>& keys) {
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  embstore_store_t* store = nullptr;
  ok(embstore_store_create(&sc, &store));
  uint64_t v = 0;
  ok(embstore_restore(store, dir.c_str(), EMBSTORE_LATEST, &v));
  embstore_table_t* t = nullptr;
  ok(embstore_table_get(store, table, &t));
  std::vector<float> out(keys.size() * kDim);
  ok(embstore_lookup(t, keys.data(), keys.size(), out.data(), 0, nullptr));
  embstore_store_destroy(store);
  return out;
}

std::vector<int64_t> all_keys() {
  std::vector<int64_t> k;
  for (int64_t i = 0; i < kKeys + 20; ++i) k.push_back(i * 3 + 10);
  return k;
}

}  // namespace

TEST_CASE("embstore-ckpt verifies and inspects encoded checkpoints, naming a corrupt file") {
  CodedChain c;
  const Result v = run_tool({"verify", c.dir()});
  INFO(describe(v));
  CHECK(v.status == 0);

  const Result r = run_tool({"inspect", c.dir(), "--version", "latest", "--table", "coded"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(line_starting(r.out, "codecs") == "codecs       values int8, state bf16");
  const Result j =
      run_tool({"inspect", c.dir(), "--version", "latest", "--table", "exact", "--json"});
  INFO(describe(j));
  REQUIRE(j.status == 0);
  CHECK(contains(j.out, "\"value_codec\": \"lossless\""));

  const std::string file = c.dir() + "/" + version_dir_name(10, true) + "/" + row_rel("coded");
  std::vector<char> bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  REQUIRE(bytes.size() > 8192);
  bytes[5000] ^= 0x01;
  {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const Result bad = run_tool({"verify", c.dir()});
  INFO(describe(bad));
  CHECK(bad.status == 1);
  CHECK(contains(bad.out + bad.err, row_rel("coded")));
}

TEST_CASE("embstore-ckpt compact keeps the tables' codecs and restores what the chain does") {
  CodedChain c;
  TempDir tmp;
  const std::string out = tmp.path() + "/compacted";
  const Result r = run_tool({"compact", c.dir(), "--version", "latest", "--out", out});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(out + "/" + version_dir_name(20, true), &m, &detail) == 0);
  CHECK(m.format_version == embstore::io::kManifestFormatVersion);
  for (const embstore::io::TableEntry& e : m.tables) {
    const bool coded = e.name == "coded";
    CHECK(e.config.value_codec == (coded ? EMBSTORE_CODEC_INT8 : EMBSTORE_CODEC_LOSSLESS));
    REQUIRE(e.files.size() == 1);
    CHECK(e.files[0].value_codec ==
          (coded ? embstore::io::Codec::kInt8 : embstore::io::Codec::kLossless));
  }
  const std::vector<int64_t> keys = all_keys();
  CHECK(restored_values(out, "exact", keys) == restored_values(c.dir(), "exact", keys));
  const std::vector<float> chain = restored_values(c.dir(), "coded", keys);
  const std::vector<float> compacted = restored_values(out, "coded", keys);
  REQUIRE(chain.size() == compacted.size());
  CHECK(embstore::io::within_bound(embstore::io::Codec::kInt8, chain.data(), compacted.data(),
                                   keys.size(), kDim));
  // A full checkpoint: the delta's values-only files are not carried over.
  for (const embstore::io::TableEntry& e : m.tables) CHECK(e.serving.empty());
  const Result v = run_tool({"verify", out});
  CHECK(v.status == 0);
}

TEST_CASE(
    "embstore-ckpt checks a delta's values-only files: a bad one is a warning, not a failure") {
  CodedChain c;
  const std::string delta = c.dir() + "/" + version_dir_name(20, false);
  const Result ok_run = run_tool({"verify", c.dir()});
  INFO(describe(ok_run));
  REQUIRE(ok_run.status == 0);
  CHECK(!contains(ok_run.out, "WARNING"));
  const Result r = run_tool({"inspect", c.dir(), "--version", "latest", "--table", "coded"});
  INFO(describe(r));
  CHECK(line_starting(r.out, "serving") == "serving      values-only files in bf16");
  CHECK(contains(line_starting(r.out, "rows"), "and 1 values-only file for followers"));

  const std::string rel =
      embstore::io::serving_file_path(embstore::io::kManifestFormatVersion, "coded", 0, 1);
  SECTION("corrupt") {
    std::fstream io(delta + "/" + rel, std::ios::in | std::ios::out | std::ios::binary);
    REQUIRE(io.good());
    io.seekp(100);
    io.put('\x42');
  }
  SECTION("missing") { REQUIRE(std::remove((delta + "/" + rel).c_str()) == 0); }
  const Result warned = run_tool({"verify", c.dir()});
  INFO(describe(warned));
  CHECK(warned.status == 0);  // a restore never reads it
  CHECK(contains(warned.out, "WARNING " + version_dir_name(20, false) + ": values-only file"));
  CHECK(contains(warned.out, rel));
  const Result json = run_tool({"verify", c.dir(), "--json"});
  CHECK(json.status == 0);
  CHECK(contains(json.out, "\"serving_problems\""));
}

TEST_CASE("embstore-ckpt verify warns of a values-only file whose values are not its row file's") {
  CodedChain c;
  const std::string delta = c.dir() + "/" + version_dir_name(20, false);
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(delta, &m, &detail) == 0);
  embstore::io::TableEntry* exact = nullptr;
  const embstore::io::TableEntry* coded = nullptr;
  for (embstore::io::TableEntry& t : m.tables) {
    if (t.name == "exact") exact = &t;
    if (t.name == "coded") coded = &t;
  }
  REQUIRE(exact != nullptr);
  REQUIRE(coded != nullptr);
  // "coded"'s copy (the same keys, its values rounded to bf16) in place of "exact"'s, with a
  // manifest that lists it: every checksum holds, the values do not.
  const std::string path = exact->serving[0].path;
  std::filesystem::copy_file(delta + "/" + coded->serving[0].path, delta + "/" + path,
                             std::filesystem::copy_options::overwrite_existing);
  exact->serving[0] = coded->serving[0];
  exact->serving[0].path = path;
  REQUIRE(embstore::io::write_manifest(delta, m) == 0);
  const Result warned = run_tool({"verify", c.dir()});
  INFO(describe(warned));
  CHECK(warned.status == 0);
  CHECK(contains(warned.out, "WARNING " + version_dir_name(20, false)));
  CHECK(contains(warned.out, "values from row 0 on differ"));
}

TEST_CASE("embstore-ckpt reads a serving-only directory as one: listed, verified, compacted") {
  CodedChain c(/*publish=*/true);
  const Result listed = run_tool({"ls", c.serving()});
  INFO(describe(listed));
  REQUIRE(listed.status == 0);
  CHECK(columns(line_starting(listed.out, version_dir_name(20, false)))[9] == "serving-only");
  // Restore refuses it, so verify fails it unless asked to check it as followers read it.
  const Result refused = run_tool({"verify", c.serving()});
  CHECK(refused.status == 1);
  CHECK(contains(refused.err, "restore would return EMBSTORE_INVALID_ARGUMENT: a serving-only"));
  const Result verified = run_tool({"verify", c.serving(), "--serving"});
  INFO(describe(verified));
  CHECK(verified.status == 0);
  CHECK(contains(line_starting(verified.out, "OK " + version_dir_name(20, false)),
                 "serves 6600 rows with 1 older version  serving-only"));
  const Result inspected =
      run_tool({"inspect", c.serving(), "--version", "latest", "--table", "coded"});
  CHECK(contains(line_starting(inspected.out, "version"), "serving-only"));
  CHECK(line_starting(inspected.out, "state") == "state        state_dim 0  (no state)");
  // A compacted serving chain is a serving-only full: followers read it, restores refuse it.
  TempDir tmp;
  const std::string out = tmp.path() + "/compacted";
  const Result r = run_tool({"compact", c.serving(), "--version", "latest", "--out", out});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(out + "/" + version_dir_name(20, true), &m, &detail) == 0);
  CHECK(m.serving_only);
  for (const embstore::io::TableEntry& e : m.tables) {
    // In the serving codec (coded: bf16, stored as rounded floats), not the checkpoint's.
    CHECK(e.files[0].value_codec ==
          (e.name == "coded" ? embstore::io::Codec::kLossless : embstore::io::Codec::kNone));
    CHECK(e.files[0].state_codec == embstore::io::Codec::kNone);
  }
  CHECK(run_tool({"verify", out, "--serving"}).status == 0);
  CHECK(!restores(out, 20));
  // export writes no state file for it.
  const std::string prefix = tmp.path() + "/exported";
  const Result e =
      run_tool({"export", c.serving(), "--version", "latest", "--table", "exact", "--out", prefix});
  INFO(describe(e));
  CHECK(e.status == 0);
  CHECK(std::filesystem::exists(prefix + ".values.npy"));
  CHECK(!std::filesystem::exists(prefix + ".state.npy"));
}
