// embstore-ckpt --json: ls, verify and inspect print one JSON object on stdout that says what
// their text says (versions, chain, restorability, each version's verdict, a table's
// configuration and rows), for scripts; the exit codes are the text's.
#include <nlohmann/json.hpp>

#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test::tool;
using nlohmann::json;

namespace {

// stdout as one JSON object (the whole of it: nothing else is printed there).
json parsed(const Result& r) {
  INFO(describe(r));
  json j;
  REQUIRE_NOTHROW(j = json::parse(r.out));
  REQUIRE(j.is_object());
  return j;
}

}  // namespace

TEST_CASE("ls --json lists each version, its chain and whether it restores") {
  Checkpoints c(Checkpoints::kChain);
  const Result r = run_tool({"ls", c.dir(), "--json"});
  REQUIRE(r.status == 0);
  json j = parsed(r);
  CHECK(j["directory"] == c.dir());
  CHECK(j["writer"].is_string());  // the store still holds the directory
  REQUIRE(j["versions"].size() == 2);
  const json& full = j["versions"][0];
  const json& delta = j["versions"][1];
  CHECK(full["name"] == version_dir_name(10, true));
  CHECK(full["kind"] == "full");
  CHECK(full["parent"].is_null());
  CHECK(full["rows"] == 2540);  // 2500 + 30 + 10 after version 10
  CHECK(full["tables"] == json({"bias", "items", "users"}));  // by name
  CHECK(full["restorable"] == true);
  CHECK(full["problem"].is_null());
  CHECK(full["world_size"] == 1);
  CHECK(full["bytes"].get<uint64_t>() == tree_bytes(c.vdir(10)));
  CHECK(delta["name"] == version_dir_name(20, false));
  CHECK(delta["kind"] == "delta");
  CHECK(delta["version"] == 20);
  CHECK(delta["parent"] == 10);
  CHECK(delta["parent_present"] == true);
  CHECK(delta["restorable"] == true);
  std::set<std::string> attachments;
  for (const json& a : delta["attachments"]) attachments.insert(a["name"].get<std::string>());
  CHECK(attachments == std::set<std::string>{"dense.bin"});  // what version 20 attached

  // A delta whose parent is gone does not restore; an unreadable manifest is named as such.
  c.close();
  fs::remove_all(c.vdir(10));
  fs::create_directory(c.vdir(30));  // no manifest
  const Result broken = run_tool({"ls", c.dir(), "--json"});
  REQUIRE(broken.status == 0);
  j = parsed(broken);
  CHECK(j["writer"].is_null());
  REQUIRE(j["versions"].size() == 2);
  CHECK(j["versions"][0]["parent_present"] == false);
  CHECK(j["versions"][0]["restorable"] == false);
  CHECK(j["versions"][0]["problem"].get<std::string>().rfind("EMBSTORE_", 0) == 0);
  CHECK(j["versions"][1]["name"] == version_dir_name(30, true));
  CHECK(j["versions"][1]["manifest_error"] == "missing");
  CHECK(j["versions"][1]["restorable"] == false);
}

TEST_CASE("verify --json gives each version's verdict with the text's exit code") {
  Checkpoints c(Checkpoints::kChain);
  c.close();
  const Result good = run_tool({"verify", c.dir(), "--json"});
  REQUIRE(good.status == 0);
  json j = parsed(good);
  CHECK(j["ok"] == true);
  REQUIRE(j["versions"].size() == 2);
  CHECK(j["versions"][0]["status"] == "EMBSTORE_OK");
  CHECK(j["versions"][0]["tables"] == 3);
  CHECK(j["versions"][0]["rows"] == 2540);
  CHECK(j["versions"][1]["older_versions"] == 1);
  CHECK(j["versions"][1]["restored_rows"] == c.rows("users") + c.rows("items") + c.rows("bias"));

  // A flipped byte in version 10's users rows fails both versions (the delta reads it too).
  const std::vector<uint64_t> blocks = block_offsets(c.row_file(10, "users"));
  REQUIRE(blocks.size() >= 2);
  flip_byte(c.row_file(10, "users"), blocks[1] + 100);
  const Result bad = run_tool({"verify", c.dir(), "--json"});
  INFO(describe(bad));
  CHECK(bad.status == 1);
  CHECK(messages(bad.err).empty());  // the verdicts are in the JSON, not on stderr
  j = parsed(bad);
  CHECK(j["ok"] == false);
  REQUIRE(j["versions"].size() == 2);
  for (const json& v : j["versions"]) {
    CHECK(v["ok"] == false);
    CHECK(v["status"] == "EMBSTORE_CORRUPT");
    CHECK(!v["problem"].get<std::string>().empty());
  }
  // Only version 20 asked for: one entry, the same verdict.
  const Result one = run_tool({"verify", c.dir(), "--version", "20", "--json"});
  CHECK(one.status == 1);
  j = parsed(one);
  REQUIRE(j["versions"].size() == 1);
  CHECK(j["versions"][0]["name"] == version_dir_name(20, false));
}

TEST_CASE("inspect --json gives a table's configuration and its rows whole") {
  Checkpoints c;
  const Result r = run_tool(
      {"inspect", c.dir(), "--version", "20", "--table", "users", "--rows", "7", "--json"});
  REQUIRE(r.status == 0);
  const json j = parsed(r);
  CHECK(j["version"] == version_dir_name(20, true));
  CHECK(j["kind"] == "full");
  CHECK(j["table"] == "users");
  CHECK(j["rows"] == c.rows("users"));
  const json& config = j["config"];
  CHECK(config["dim"] == 64);
  CHECK(config["optimizer"] == "adagrad");
  CHECK(config["init"] == "uniform");
  CHECK(config["seed"] == 7);
  CHECK(config["state_dim"] == 64);
  REQUIRE(j["first_rows"].size() == 7);
  for (const json& row : j["first_rows"]) {
    CHECK(row["deleted"] == false);
    const std::vector<float> value = row["value"].get<std::vector<float>>();
    REQUIRE(value.size() == 64);  // whole, whatever --floats says
    CHECK(row["state"].size() == 64);
    // The rows of version 20 are the store's current ones; floats print round-trip exact.
    const std::vector<float> current = c.lookup("users", row["key"].get<int64_t>());
    for (size_t i = 0; i < value.size(); ++i) CHECK(same_bits(value[i], current[i]));
  }
  // A table that is not there: exit 1, the text's message on stderr, and on stdout no rows,
  // only the error object.
  const Result missing =
      run_tool({"inspect", c.dir(), "--version", "20", "--table", "nope", "--json"});
  CHECK(missing.status == 1);
  CHECK(contains(missing.err, "no table 'nope'"));
  const json error = parsed(missing);
  CHECK(error["ok"] == false);
  CHECK(contains(error["error"].get<std::string>(), "no table 'nope'"));
  CHECK(!error.contains("first_rows"));
}

TEST_CASE("JSON is printed when the command cannot run, and for names that are not UTF-8") {
  Checkpoints c(Checkpoints::kChain);
  c.close();
  // No such directory, no such version: {"ok": false, "error"} on stdout, exit 1, the message
  // on stderr too.
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"ls", c.dir() + "/missing", "--json"},
        std::vector<std::string>{"verify", c.dir(), "--version", "7", "--json"},
        std::vector<std::string>{"inspect", c.dir(), "--version", "20", "--table", "nope",
                                 "--json"}}) {
    const Result r = run_tool(args);
    CHECK(r.status == 1);
    const json j = parsed(r);
    CHECK(j["ok"] == false);
    CHECK(!j["error"].get<std::string>().empty());
    CHECK(!messages(r.err).empty());
  }
  // A directory whose name is not UTF-8 (legal on Linux): the dump replaces the bad bytes.
  const std::string odd = c.dir() + "-\xff\xfe";
  fs::rename(c.dir(), odd);
  for (const std::vector<std::string>& args : {std::vector<std::string>{"ls", odd, "--json"},
                                               std::vector<std::string>{"verify", odd, "--json"}}) {
    const Result r = run_tool(args);
    CHECK(r.status == 0);
    const json j = parsed(r);
    CHECK(contains(j["directory"].get<std::string>(), "\xef\xbf\xbd"));  // U+FFFD
  }
}

TEST_CASE("verify --json names the version whose manifest fails, not what was asked") {
  Checkpoints c;
  c.close();
  flip_byte(c.vdir(20) + "/MANIFEST.json", 30);
  const Result r = run_tool({"verify", c.dir(), "--version", "20", "--json"});
  CHECK(r.status == 1);
  const json j = parsed(r);
  REQUIRE(j["versions"].size() == 1);
  CHECK(j["versions"][0]["name"] == version_dir_name(20, true));
  CHECK(j["versions"][0]["status"] == "EMBSTORE_CORRUPT");
}
