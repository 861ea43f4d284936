// verify and ls say what restore does, and no manifest steers a file: crafted manifests (their
// checksums recomputed, as a writer with a bug or a hostile hand would leave them) that name
// files outside their directory, drop a middle delta or re-point a delta's parent; each time
// verify's exit status is restore's outcome, ls's RESTORABLE agrees as far as manifests and
// sizes tell, and compact writes nothing outside --out.
#include <catch2/catch.hpp>

#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test::tool;
using embstore_test::TempDir;

namespace {

embstore::io::Manifest manifest_of(const std::string& vdir) {
  embstore::io::Manifest m;
  std::string detail;
  INFO(vdir << ": " << detail);
  REQUIRE(embstore::io::read_manifest(vdir, &m, &detail) == 0);
  return m;
}

// Rewrites vdir's manifest through edit, with a valid checksum.
template <typename Edit>
void rewrite_manifest(const std::string& vdir, Edit edit) {
  embstore::io::Manifest m = manifest_of(vdir);
  edit(m);
  REQUIRE(embstore::io::write_manifest(vdir, m) == 0);
}

// verify's exit status for one version, and restore's outcome: the same, or the test fails.
bool verify_agrees_with_restore(const std::string& dir, uint64_t version) {
  const Result v = run_tool({"verify", dir, "--version", std::to_string(version)});
  const bool restored = restores(dir, version);
  INFO("version " << version << ": restore " << (restored ? "succeeds" : "fails") << "\n"
                  << describe(v));
  REQUIRE((v.status == 0) == restored);
  return restored;
}

std::string restorable_column(const std::string& dir, const std::string& name) {
  const std::vector<std::string> col = columns(line_starting(run_tool({"ls", dir}).out, name));
  return col.size() == 11 ? col[9] : "(" + (col.size() > 1 ? col[1] : std::string()) + ")";
}

// Every entry below root, relative, sorted.
std::vector<std::string> tree(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    out.push_back(fs::relative(e.path(), root).string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("a manifest that names a file outside its directory steers nothing") {
  Checkpoints c;
  c.close();
  // A copy of version 20 whose table 'bias' is called "../../../x", its row file moved to the
  // matching path inside the version (where a writer that trusted names would have put it).
  TempDir tmp;
  const std::string dir = tmp.path() + "/a/b/ckpt";
  fs::create_directories(dir);
  const std::string vdir = dir + "/" + version_dir_name(20, true);
  fs::copy(c.vdir(20), vdir, fs::copy_options::recursive);
  rewrite_manifest(vdir, [](embstore::io::Manifest& m) {
    for (auto& t : m.tables) {
      if (t.name == "bias") {
        t.name = "../../../x";
        t.files[0].path = "tables/../../../x/shard-00000-of-00001.rows";
      }
    }
  });
  const std::vector<std::string> before = tree(tmp.path());

  const Result verify = run_tool({"verify", dir});
  INFO(describe(verify));
  CHECK(verify.status == 1);
  CHECK(contains(verify.err, "table name '../../../x' has character 0x2f"));
  CHECK_FALSE(restores(dir, 20));
  CHECK(contains(line_starting(run_tool({"ls", dir}).out, version_dir_name(20, true)),
                 "(corrupt manifest: table name '../../../x'"));
  const std::string out = tmp.path() + "/a/b/out";
  const Result compact = run_tool({"compact", dir, "--version", "20", "--out", out});
  INFO(describe(compact));
  CHECK(compact.status == 1);
  CHECK(contains(compact.err, "table name '../../../x' has character 0x2f"));
  // Nothing written anywhere: only compact's --out (created, with its lock file) is new.
  std::vector<std::string> after = tree(tmp.path());
  after.erase(std::remove_if(after.begin(), after.end(),
                             [](const std::string& p) { return p.rfind("a/b/out", 0) == 0; }),
              after.end());
  CHECK(after == before);
  CHECK((!fs::exists(out) || entries(out).empty()));
}

TEST_CASE("verify, ls and restore agree on a broken chain") {
  Checkpoints c(Checkpoints::kChain);
  make_chain(c);  // 10 (full), 20, 30, 40 (deltas)
  c.close();
  std::map<uint64_t, bool> restorable = {{10, true}, {20, true}, {30, true}, {40, true}};
  std::string why;
  SECTION("intact") {}
  SECTION("a middle delta removed") {
    fs::remove_all(c.delta_dir(20));
    restorable.erase(20);
    restorable[30] = restorable[40] = false;
    why = "its parent version 20 is not in";
  }
  SECTION("a delta's parent re-pointed to a missing version") {
    rewrite_manifest(c.delta_dir(30), [](embstore::io::Manifest& m) { m.parent = 25; });
    restorable[30] = restorable[40] = false;
    why = "its parent version 25 is not in";  // and 40 no longer names 30's manifest
  }
  SECTION("a delta's parent re-pointed to an older version that exists") {
    rewrite_manifest(c.delta_dir(30), [&](embstore::io::Manifest& m) {
      m.parent = 10;
      m.parent_xxh3 = manifest_of(c.vdir(10)).xxh3;  // names 10 exactly: only rows tell
    });
    restorable[30] = restorable[40] = false;
    why = "rows after loading, the manifest says";
  }
  SECTION("a middle manifest rewritten, its checksum valid") {
    rewrite_manifest(c.delta_dir(20), [](embstore::io::Manifest& m) { m.embstore_version += 1; });
    restorable[30] = restorable[40] = false;  // they name 20's old manifest
    why = "not the version it applies on";
  }
  for (const auto& [version, expect] : restorable) {
    INFO("version " << version);
    CHECK(verify_agrees_with_restore(c.dir(), version) == expect);
  }
  const Result all = run_tool({"verify", c.dir()});
  INFO(describe(all));
  const bool every =
      std::all_of(restorable.begin(), restorable.end(), [](const auto& v) { return v.second; });
  CHECK((all.status == 0) == every);
  if (!why.empty()) CHECK(contains(all.err, why));
  // ls: manifests, links and sizes, without reading rows; a parent re-pointed with its exact
  // checksum is found only by the rows, so ls still says yes there.
  for (const auto& [version, expect] : restorable) {
    const bool full = version == 10;
    const std::string col = restorable_column(c.dir(), version_dir_name(version, full));
    INFO("version " << version << ": " << col);
    if (why.rfind("rows after loading", 0) == 0 && version == 30) {
      CHECK(col == "yes");
    } else {
      CHECK(col == (expect ? "yes" : "no"));
    }
  }
}

TEST_CASE("verify and restore agree on a format 1 chain, re-pointed or not") {
  TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  fs::copy(std::string(EMBSTORE_TEST_DATA_DIR) + "/checkpoint-format1", dir,
           fs::copy_options::recursive);
  for (uint64_t v : {3, 6, 8}) CHECK(verify_agrees_with_restore(dir, v));
  // Format 1 deltas do not name their parent's manifest: re-pointed to the full checkpoint,
  // the newest delta is caught by its row counts, by verify as by restore.
  rewrite_manifest(dir + "/" + version_dir_name(8, false), [](embstore::io::Manifest& m) {
    REQUIRE(m.format_version == 1);
    m.parent = 3;
  });
  CHECK_FALSE(verify_agrees_with_restore(dir, 8));
  CHECK(verify_agrees_with_restore(dir, 6));
}
