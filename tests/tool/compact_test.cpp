// embstore-ckpt compact: a chain with tombstones and admission counts merged into one full
// checkpoint that restores it exactly; corrupt chains and an --out that holds the version are
// refused and leave nothing behind.
#include <catch2/catch.hpp>

#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test::tool;
using embstore_test::TempDir;

namespace {

// Every row of a version directory's row files: table -> key -> the bits of its value, then
// of its optimizer state.
using TableRows = std::map<int64_t, std::vector<uint32_t>>;
using Rows = std::map<std::string, TableRows>;

std::vector<uint32_t> row_bits(const float* value, uint32_t dim, const float* state,
                               uint32_t state_dim) {
  std::vector<uint32_t> bits(dim + state_dim);
  std::memcpy(bits.data(), value, dim * sizeof(float));
  if (state_dim > 0) std::memcpy(bits.data() + dim, state, state_dim * sizeof(float));
  return bits;
}

Rows rows_of(const std::string& vdir) {
  embstore::io::Manifest m;
  std::string detail;
  const int rc = embstore::io::read_manifest(vdir, &m, &detail);
  INFO(vdir << ": " << detail);
  REQUIRE(rc == 0);
  Rows rows;
  for (const embstore::io::TableEntry& t : m.tables) {
    TableRows& out = rows[t.name];
    for (const embstore::io::FileEntry& f : t.files) {
      std::unique_ptr<embstore::io::RowFileReader> reader;
      REQUIRE(embstore::io::RowFileReader::open(vdir + "/" + f.path, {}, &reader) == 0);
      embstore::io::RowBlock b;
      int r;
      while ((r = reader->next_block(&b)) == 1) {
        REQUIRE(b.kind == embstore::io::RowBlockKind::kUpserts);
        for (uint32_t i = 0; i < b.rows; ++i) {
          const bool inserted =
              out.emplace(b.keys[i], row_bits(b.values + size_t{i} * b.dim, b.dim,
                                              b.state + size_t{i} * b.state_dim, b.state_dim))
                  .second;
          REQUIRE(inserted);  // each key once
        }
      }
      REQUIRE(r == 0);
    }
  }
  return rows;
}

// "" when a and b hold the same rows bit for bit, else the first difference.
std::string first_difference(const Rows& a, const Rows& b) {
  for (const auto& [table, rows] : a) {
    auto other = b.find(table);
    if (other == b.end()) return "table " + table + " only in the first";
    if (rows.size() != other->second.size()) {
      return "table " + table + ": " + std::to_string(rows.size()) + " rows and " +
             std::to_string(other->second.size());
    }
    for (const auto& [key, bits] : rows) {
      auto it = other->second.find(key);
      if (it == other->second.end()) return "table " + table + ": key " + std::to_string(key);
      if (it->second != bits) return "table " + table + ": key " + std::to_string(key) + " differs";
    }
  }
  if (a.size() != b.size()) return "a table only in the second";
  return "";
}

struct StoreDestroy {
  void operator()(embstore_store_t* s) const { embstore_store_destroy(s); }
};

// The rows a fresh store holds after embstore_restore(dir, version), written out as a full
// checkpoint and read back, and the restored version's attachment `name` (when given).
Rows restored_rows(const std::string& dir, uint64_t version, const char* name = nullptr,
                   std::string* attachment = nullptr) {
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  sc.host_threads = 2;
  embstore_store_t* raw = nullptr;
  ok(embstore_store_create(&sc, &raw));
  std::unique_ptr<embstore_store_t, StoreDestroy> store(raw);
  uint64_t got = 0;
  ok(embstore_restore(raw, dir.c_str(), version, &got));
  REQUIRE(got == version);
  if (name != nullptr) {
    size_t bytes = 0;
    ok(embstore_restore_attachment(raw, name, nullptr, 0, &bytes));
    attachment->assign(bytes, '\0');
    ok(embstore_restore_attachment(raw, name, attachment->data(), bytes, &bytes));
  }
  TempDir out;
  uint64_t written = 0;
  ok(embstore_checkpoint(raw, out.path().c_str(), EMBSTORE_CKPT_FULL, &written));
  ok(embstore_checkpoint_wait(raw, written));
  REQUIRE(written == version);
  return rows_of(out.path() + "/" + version_dir_name(version, true));
}

// The value and state the hand-written deltas give key.
std::vector<float> crafted(int64_t key, uint32_t n, float base) {
  std::vector<float> v(n);
  for (uint32_t j = 0; j < n; ++j) v[j] = base + 0.001f * static_cast<float>(key % 1000) + j;
  return v;
}

std::vector<uint32_t> crafted_bits(int64_t key, uint32_t dim, uint32_t state_dim) {
  const std::vector<float> value = crafted(key, dim, 0.5f), state = crafted(key, state_dim, 2.0f);
  return row_bits(value.data(), dim, state.data(), state_dim);
}

struct DeltaTable {
  std::vector<int64_t> upserts, tombstones;
  int64_t rows_change = 0;  // of the table's rows
};

// A delta written with the io/ layer (the store writes no tombstones yet) on the version in
// parent_dir: each table of the parent, with the upserts (crafted rows) and tombstones given,
// and one attachment.
void write_delta(const std::string& dir, uint64_t version, const std::string& parent_dir,
                 const std::map<std::string, DeltaTable>& tables, const std::string& attachment) {
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(parent_dir, &m, &detail) == 0);
  const std::string vdir = dir + "/" + version_dir_name(version, false);
  m.parent_xxh3 = m.xxh3;
  m.parent = m.version;
  m.full = false;
  m.version = version;
  for (embstore::io::TableEntry& t : m.tables) {
    REQUIRE(embstore::io::create_directories(vdir + "/" + table_rel(t.name)) == 0);
    const std::string rel = row_rel(t.name);
    std::unique_ptr<embstore::io::RowFileWriter> w;
    REQUIRE(embstore::io::RowFileWriter::open(vdir + "/" + rel, t.config.dim, t.state_dim, {},
                                              &w) == 0);
    auto it = tables.find(t.name);
    if (it != tables.end()) {
      for (int64_t key : it->second.upserts) {
        const std::vector<float> value = crafted(key, t.config.dim, 0.5f),
                                 state = crafted(key, t.state_dim, 2.0f);
        REQUIRE(w->add(key, value.data(), state.data()) == 0);
      }
      for (int64_t key : it->second.tombstones) REQUIRE(w->add_tombstone(key) == 0);
      t.table_rows =
          static_cast<uint64_t>(static_cast<int64_t>(t.table_rows) + it->second.rows_change);
    }
    REQUIRE(w->finish() == 0);
    t.rows = w->rows();
    t.files = {{rel, w->bytes(), w->rows(), w->checksum()}};
  }
  REQUIRE(embstore::io::create_directories(vdir + "/attachments") == 0);
  const std::string rel = "attachments/reader.offsets";
  REQUIRE(embstore::io::write_whole_file(vdir + "/" + rel, attachment.data(), attachment.size()) ==
          0);
  uint64_t xxh3 = 0, bytes = 0;
  REQUIRE(embstore::io::checksum_file(vdir + "/" + rel, &xxh3, &bytes) == 0);
  m.attachments = {{"reader.offsets", {rel, bytes, 0, xxh3}}};
  REQUIRE(embstore::io::write_manifest(vdir, m) == 0);
}

constexpr int64_t kUser = 1000000;  // the first key of users

// Versions 50 and 60 on make_chain's, with tombstones: of a key of the full checkpoint (then
// inserted again), of keys inserted by deltas, and of a key inserted by a delta before.
void add_tombstone_deltas(Checkpoints& c) {
  write_delta(c.dir(), 50, c.delta_dir(40),
              {{"users", {{kUser + 1, kUser + 20000}, {kUser, kUser + 5001, kUser + 7600}, -2}}},
              "offsets at 50");
  write_delta(c.dir(), 60, c.delta_dir(50),
              {{"users", {{kUser}, {kUser + 20000}, 0}}, {"bias", {{}, {42}, -1}}},
              "offsets at 60");
}

// The compacted version's manifest against its source's: a full checkpoint of the same
// version and tables (whole configuration and state layout), each table's rows in one file,
// and the source's attachments.
void check_manifest(const std::string& vdir, const std::string& source_vdir) {
  embstore::io::Manifest m, s;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(vdir, &m, &detail) == 0);
  REQUIRE(embstore::io::read_manifest(source_vdir, &s, &detail) == 0);
  CHECK(m.full);
  CHECK_FALSE(m.parent.has_value());
  CHECK(m.version == s.version);
  CHECK(m.world_size == 1);
  REQUIRE(m.tables.size() == s.tables.size());
  for (size_t i = 0; i < m.tables.size(); ++i) {
    embstore::io::TableEntry a = m.tables[i], b = s.tables[i];
    INFO("table " << a.name);
    CHECK(a.name == b.name);
    CHECK(a.table_rows == b.table_rows);
    CHECK(a.rows == a.table_rows);
    REQUIRE(a.files.size() == 1);
    CHECK(a.files[0].path == row_rel(a.name));
    CHECK(a.files[0].rows == a.rows);
    CHECK(a.files[0].bytes == fs::file_size(vdir + "/" + a.files[0].path));
    // The rest formats alike: configuration, state_dim and layout.
    a.files.clear();
    b.files.clear();
    a.rows = b.rows = a.table_rows = b.table_rows = 0;
    embstore::io::Manifest ma, mb;
    ma.tables = {a};
    mb.tables = {b};
    CHECK(embstore::io::format_manifest(ma) == embstore::io::format_manifest(mb));
  }
  REQUIRE(m.attachments.size() == s.attachments.size());
  for (size_t i = 0; i < m.attachments.size(); ++i) {
    CHECK(m.attachments[i].name == s.attachments[i].name);
    CHECK(m.attachments[i].file.path == s.attachments[i].file.path);
    CHECK(m.attachments[i].file.xxh3 == s.attachments[i].file.xxh3);
    CHECK(read_file(vdir + "/" + m.attachments[i].file.path) ==
          read_file(source_vdir + "/" + s.attachments[i].file.path));
  }
  const Result v = run_tool({"verify", vdir.substr(0, vdir.rfind('/'))});
  INFO(describe(v));
  CHECK(v.status == 0);
}

}  // namespace

TEST_CASE("compact merges a chain with tombstones into one full checkpoint that restores it") {
  Checkpoints c(Checkpoints::kChain);
  make_chain(c);
  add_tombstone_deltas(c);
  // What restoring the chain gives: the reference, bit for bit.
  std::string offsets;
  const Rows expect = restored_rows(c.dir(), 60, "reader.offsets", &offsets);
  REQUIRE(offsets == "offsets at 60");
  const TableRows& users = expect.at("users");
  REQUIRE(users.size() == 4 * 2500 - 2);
  for (int64_t gone : {kUser + 5001, kUser + 7600, kUser + 20000}) REQUIRE(users.count(gone) == 0);
  REQUIRE(users.at(kUser) == crafted_bits(kUser, 64, 64));  // tombstoned, then inserted again
  REQUIRE(users.at(kUser + 1) == crafted_bits(kUser + 1, 64, 64));
  REQUIRE(expect.at("bias").size() == 4 * 10 - 1);
  REQUIRE(expect.at("bias").count(42) == 0);
  REQUIRE(expect.at("items").size() == 4 * 30);

  TempDir tmp;
  const std::string out = tmp.path() + "/compacted";  // created by compact
  const Result r = run_tool({"compact", c.dir(), "--version", "latest", "--out", out});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::string vdir = out + "/" + version_dir_name(60, true);
  CHECK(contains(r.out, c.delta_dir(60) + " (1 full, 5 deltas) into " + vdir + " (3 tables, " +
                            std::to_string(users.size() + 39 + 120) + " rows, "));
  CHECK(entries(out) == std::vector<std::string>{version_dir_name(60, true)});
  check_manifest(vdir, c.delta_dir(60));
  CHECK(first_difference(rows_of(vdir), expect) == "");
  std::string restored_offsets;
  CHECK(first_difference(restored_rows(out, 60, "reader.offsets", &restored_offsets), expect) ==
        "");
  CHECK(restored_offsets == offsets);
  const Result ls = run_tool({"ls", out});
  INFO(describe(ls));
  CHECK(columns(line_starting(ls.out, version_dir_name(60, true))).at(9) == "yes");
}

TEST_CASE("compact merges the chain's admission counts, and verify checks them") {
  TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt", out = tmp.path() + "/compacted";
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  embstore_store_t* store = nullptr;
  ok(embstore_store_create(&sc, &store));
  embstore_checkpoint_policy_t policy;
  embstore_checkpoint_policy_init(&policy);
  policy.max_chain_length = 0;
  policy.rebaseline_fraction = 0;
  ok(embstore_checkpoint_set_policy(store, &policy));
  embstore_table_config_t tc;
  embstore_table_config_init(&tc);
  tc.name = "ids";
  tc.dim = 2;
  tc.admit_after = 3;
  embstore_table_t* t = nullptr;
  ok(embstore_table_create(store, &tc, &t));
  float values[2 * 4];
  const int64_t seen_twice[4] = {5, 5, 6, 6};
  ok(embstore_lookup(t, seen_twice, 4, values, EMBSTORE_LOOKUP_INSERT, nullptr));
  ok(embstore_step(store, 10));
  uint64_t v = 0;
  ok(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_FULL, &v));
  ok(embstore_checkpoint_wait(store, v));
  const int64_t third[1] = {5};
  ok(embstore_lookup(t, third, 1, values, EMBSTORE_LOOKUP_INSERT, nullptr));
  ok(embstore_step(store, 20));
  ok(embstore_checkpoint(store, dir.c_str(), EMBSTORE_CKPT_INCREMENTAL, &v));
  ok(embstore_checkpoint_wait(store, v));
  embstore_store_destroy(store);
  const std::string counts =
      embstore::io::admission_file_path(embstore::io::kManifestFormatVersion, "ids");
  const std::string full_counts = dir + "/" + version_dir_name(10, true) + "/" + counts;
  REQUIRE(fs::exists(full_counts));
  REQUIRE(fs::exists(dir + "/" + version_dir_name(20, false) + "/" + counts));

  const Result r = run_tool({"compact", dir, "--version", "latest", "--out", out});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::string vdir = out + "/" + version_dir_name(20, true);
  // The full's counts (5 and 6 at 2) and the delta's change (5 admitted): 6 at 2.
  embstore::io::AdmissionFile merged;
  std::string why;
  REQUIRE(embstore::io::parse_admission_file(read_file(vdir + "/" + counts), &merged, &why) == 0);
  CHECK(merged.kind == embstore::io::AdmissionKind::kExact);
  REQUIRE(merged.entries.size() == 1);
  CHECK(merged.entries[0].key == 6);
  CHECK(merged.entries[0].count == 2);
  CHECK(merged.entries[0].step == 0);
  const Result verified = run_tool({"verify", out});
  INFO(describe(verified));
  CHECK(verified.status == 0);
  CHECK(contains(verified.out, "2 files"));
  // Restored from the compacted version: 5 has its row and drops its count, 6 keeps its 2.
  embstore_store_t* restored = nullptr;
  ok(embstore_store_create(&sc, &restored));
  uint64_t got = 0;
  ok(embstore_restore(restored, out.c_str(), EMBSTORE_LATEST, &got));
  embstore_table_t* r_ids = nullptr;
  ok(embstore_table_get(restored, "ids", &r_ids));
  embstore_table_stats_t st;
  st.struct_size = sizeof(st);
  ok(embstore_table_stats(r_ids, &st));
  CHECK(st.rows == 1);
  CHECK(st.pending_admission == 1);
  const int64_t six[1] = {6};
  ok(embstore_lookup(r_ids, six, 1, values, EMBSTORE_LOOKUP_INSERT, nullptr));
  ok(embstore_table_stats(r_ids, &st));
  CHECK(st.rows == 2);
  embstore_store_destroy(restored);

  // A damaged counts file fails verify, named.
  {
    std::fstream f(vdir + "/" + counts, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(28);
    f.put('\x7f');
  }
  const Result bad = run_tool({"verify", out});
  INFO(describe(bad));
  CHECK(bad.status != 0);
  CHECK(contains(bad.out + bad.err, counts));
}

TEST_CASE("compact of a full-only version rewrites it") {
  Checkpoints c(Checkpoints::kChain);
  const Rows source = rows_of(c.vdir(10));
  for (const std::string& v : {std::string("10"), version_dir_name(10, true)}) {
    TempDir out;
    const Result r = run_tool({"compact", c.dir(), "--version", v, "--out", out.path()});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, " (1 full, 0 deltas) into "));
    const std::string vdir = out.path() + "/" + version_dir_name(10, true);
    CHECK(entries(out.path()) == std::vector<std::string>{version_dir_name(10, true)});
    check_manifest(vdir, c.vdir(10));
    CHECK(first_difference(rows_of(vdir), source) == "");
    std::string offsets;
    CHECK(first_difference(restored_rows(out.path(), 10, "reader.offsets", &offsets), source) ==
          "");
    CHECK(offsets == "0123456789");
  }
}

TEST_CASE("compact of an older version in a chain leaves the newer deltas out") {
  Checkpoints c(Checkpoints::kChain);
  make_chain(c);
  const Rows expect = restored_rows(c.dir(), 30);
  REQUIRE(first_difference(expect, restored_rows(c.dir(), 40)) != "");
  for (const std::string& v : {std::string("30"), version_dir_name(30, false)}) {
    TempDir out;
    const Result r = run_tool({"compact", c.dir(), "--version", v, "--out", out.path()});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(contains(r.out, c.delta_dir(30) + " (1 full, 2 deltas) into "));
    const std::string vdir = out.path() + "/" + version_dir_name(30, true);
    CHECK(entries(out.path()) == std::vector<std::string>{version_dir_name(30, true)});
    check_manifest(vdir, c.delta_dir(30));
    CHECK(first_difference(rows_of(vdir), expect) == "");
    CHECK(first_difference(restored_rows(out.path(), 30), expect) == "");
  }
  // A version that is not there, in either form.
  TempDir out;
  for (const std::string& v : {std::string("35"), version_dir_name(30, true)}) {
    const Result r = run_tool({"compact", c.dir(), "--version", v, "--out", out.path()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, "no version " + v + " in " + c.dir()));  // as every subcommand says
  }
}

TEST_CASE("compact of a corrupt chain fails naming the file and leaves no version") {
  Checkpoints c(Checkpoints::kChain);
  make_chain(c);
  std::string expect;
  SECTION("a flipped byte in a middle delta's second block") {
    const std::string path = c.delta_dir(20) + "/" + row_rel("users");
    const std::vector<uint64_t> blocks = block_offsets(path);
    REQUIRE(blocks.size() >= 2);
    flip_byte(path, blocks[1] + embstore::io::kRowBlockHeaderBytes + 2 * 8 + 3);
    expect =
        path + ": block at offset " + std::to_string(blocks[1]) + ": payload checksum mismatch";
  }
  SECTION("a row file whose checksum is not the manifest's") {
    // Blocks intact, the manifest itself valid: only the whole file's XXH3 tells.
    embstore::io::Manifest m;
    std::string detail;
    // The newest version's: a middle one rewritten would no longer be the one its child names.
    REQUIRE(embstore::io::read_manifest(c.delta_dir(40), &m, &detail) == 0);
    auto items = std::find_if(m.tables.begin(), m.tables.end(),
                              [](const embstore::io::TableEntry& t) { return t.name == "items"; });
    REQUIRE(items != m.tables.end());
    items->files.at(0).xxh3 ^= 1;
    REQUIRE(embstore::io::write_manifest(c.delta_dir(40), m) == 0);
    REQUIRE_FALSE(restores(c.dir(), 40));  // restore hashes every file as it reads it
    expect = c.delta_dir(40) + "/" + row_rel("items") + ": XXH3 checksum mismatch";
  }
  SECTION("a missing middle delta") {
    fs::remove_all(c.delta_dir(20));
    expect = c.delta_dir(30) + ": its parent version 20 is not in '" + c.dir() +
             "': the chain is broken";
  }
  SECTION("a corrupt middle manifest") {
    const std::string manifest = c.delta_dir(30) + "/MANIFEST.json";
    change_seed(manifest);
    expect = manifest + ": checksum mismatch (manifest_xxh3)";
  }
  TempDir out;
  const Result r = run_tool({"compact", c.dir(), "--version", "40", "--out", out.path()});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(contains(r.err, "embstore-ckpt compact: " + expect));
  CHECK(entries(out.path()).empty());  // no version, no staging directory
}

TEST_CASE("compact refuses an --out that already holds the version") {
  Checkpoints c(Checkpoints::kChain);
  TempDir out;
  REQUIRE(run_tool({"compact", c.dir(), "--version", "20", "--out", out.path()}).status == 0);
  const std::string manifest = out.path() + "/" + version_dir_name(20, true) + "/MANIFEST.json";
  const std::string before = read_file(manifest);
  SECTION("as a full checkpoint") {
    const Result r = run_tool({"compact", c.dir(), "--version", "latest", "--out", out.path()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err,
                   out.path() + " already holds version 20 (" + version_dir_name(20, true) + ")"));
    CHECK(entries(out.path()) == std::vector<std::string>{version_dir_name(20, true)});
    CHECK(read_file(manifest) == before);
    // Another version goes in beside it.
    CHECK(run_tool({"compact", c.dir(), "--version", "10", "--out", out.path()}).status == 0);
    CHECK(entries(out.path()).size() == 2);
  }
  SECTION("as a delta: the source directory itself, while its store writes there") {
    const std::vector<std::string> source = entries(c.dir());
    const Result r = run_tool({"compact", c.dir(), "--version", "20", "--out", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, "checkpoint directory '" + c.dir() + "' is locked by another writer"));
    CHECK(entries(c.dir()) == source);
  }
  SECTION("as a delta: the source directory itself, once its store is gone") {
    c.close();
    const std::vector<std::string> source = entries(c.dir());
    const Result r = run_tool({"compact", c.dir(), "--version", "20", "--out", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err,
                   c.dir() + " already holds version 20 (" + version_dir_name(20, false) + ")"));
    CHECK(entries(c.dir()) == source);
  }
}
