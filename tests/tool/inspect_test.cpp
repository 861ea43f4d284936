// embstore-ckpt inspect (a table's configuration and rows, tombstones of a delta, exactly the
// values lookup returns) and the exit codes of bad usage.
#include <catch2/catch.hpp>

#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test::tool;
using embstore_test::TempDir;

TEST_CASE("inspect shows a delta's tombstones") {
  Checkpoints c;
  // A delta of one table written with the io/ layer (the library writes none yet).
  const std::string vdir = c.dir() + "/" + version_dir_name(30, false);
  REQUIRE(embstore::io::create_directories(vdir + "/" + table_rel("bias")) == 0);
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(c.vdir(20), &m, &detail) == 0);
  m.parent_xxh3 = m.xxh3;
  m.full = false;
  m.version = 30;
  m.parent = 20;
  m.attachments.clear();
  m.tables.erase(std::remove_if(m.tables.begin(), m.tables.end(),
                                [](const embstore::io::TableEntry& t) { return t.name != "bias"; }),
                 m.tables.end());
  REQUIRE(m.tables.size() == 1);
  std::unique_ptr<embstore::io::RowFileWriter> w;
  REQUIRE(embstore::io::RowFileWriter::open(vdir + "/" + row_rel("bias"), 1, 0, {}, &w) == 0);
  const float one = 1.5f;
  REQUIRE(w->add(42, &one, nullptr) == 0);
  REQUIRE(w->add_tombstone(43) == 0);
  REQUIRE(w->add_tombstone(44) == 0);
  REQUIRE(w->finish() == 0);
  m.tables[0].files = {{row_rel("bias"), w->bytes(), w->rows(), w->checksum()}};
  m.tables[0].rows = w->rows();
  m.tables[0].table_rows -= 2;  // 43 and 44 deleted, 42 updated
  REQUIRE(embstore::io::write_manifest(vdir, m) == 0);

  const Result r = run_tool({"inspect", c.dir(), "--version", "latest", "--table", "bias"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  CHECK(line_starting(r.out, "version ") ==
        "version      " + version_dir_name(30, false) + "  (delta, step 30, parent 20)");
  CHECK(contains(r.out,
                 "first 3 of 3 rows (file order):\n  key 42  value [1.5]\n"
                 "  key 43  deleted\n  key 44  deleted\n"));
  // verify accepts tombstones in a delta.
  const Result v = run_tool({"verify", c.dir(), "--version", "30"});
  INFO(describe(v));
  CHECK(v.status == 0);
  CHECK(v.out.rfind("OK " + version_dir_name(30, false) + "  (1 table, 3 rows, 1 file, 8.0 KiB)",
                    0) == 0);
  // A bare number picks the full checkpoint of a version that has both.
  fs::rename(vdir, c.dir() + "/" + version_dir_name(20, false));
  m.version = 20;
  m.parent = 10;
  REQUIRE(embstore::io::write_manifest(c.dir() + "/" + version_dir_name(20, false), m) == 0);
  const Result both = run_tool({"inspect", c.dir(), "--version", "20", "--table", "bias"});
  CHECK(line_starting(both.out, "version ") ==
        "version      " + version_dir_name(20, true) + "  (full, step 20, base)");
  const Result delta =
      run_tool({"inspect", c.dir(), "--version", version_dir_name(20, false), "--table", "bias"});
  CHECK(line_starting(delta.out, "version ") ==
        "version      " + version_dir_name(20, false) + "  (delta, step 20, parent 10)");
  // verify of a bare number checks what restore of it loads: the full one.
  const Result verify = run_tool({"verify", c.dir(), "--version", "20"});
  INFO(describe(verify));
  CHECK(verify.status == 0);
  CHECK(lines_of(verify.out) ==
        std::vector<std::string>{"OK " + version_dir_name(20, true) +
                                 "  (3 tables, 5080 rows, 4 files, 2.5 MiB)"});
  CHECK(restores(c.dir(), 20));
  // The moved delta names version 20's manifest as its parent, not 10's: the chain is broken.
  const Result moved = run_tool({"verify", c.dir(), "--version", version_dir_name(20, false)});
  INFO(describe(moved));
  CHECK(moved.status == 1);
  CHECK(contains(moved.err, ": the chain is broken"));
}

TEST_CASE("inspect prints the table's configuration") {
  Checkpoints c;
  SECTION("adagrad") {
    const Result r = run_tool({"inspect", c.dir(), "--version", "20", "--table", "users"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(line_starting(r.out, "version ") ==
          "version      " + version_dir_name(20, true) + "  (full, step 20, base)");
    CHECK(line_starting(r.out, "table ") == "table        users");
    CHECK(line_starting(r.out, "rows ") == "rows         5000  (1 file)");
    CHECK(line_starting(r.out, "dim ") == "dim          64");
    CHECK(line_starting(r.out, "optimizer ")
              .rfind("optimizer    adagrad  (learning_rate 0.0500000007, ", 0) == 0);
    CHECK(line_starting(r.out, "state ") == "state        state_dim 64: accumulator[dim]");
    CHECK(line_starting(r.out, "initializer ") ==
          "initializer  uniform [-0.00999999978, "
          "0.00999999978), seed 7");
    CHECK(line_starting(r.out, "first ") == "first 5 of 5000 rows (file order):");
  }
  SECTION("adam") {
    const Result r = run_tool({"inspect", c.dir(), "--version", "latest", "--table", "items"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(line_starting(r.out, "optimizer ").rfind("optimizer    adam  (", 0) == 0);
    CHECK(contains(line_starting(r.out, "optimizer "), "beta1 0.899999976, beta2 0.999000013"));
    CHECK(line_starting(r.out, "state ") ==
          "state        state_dim 10: m[dim] v[dim] beta1_power beta2_power");
    CHECK(line_starting(r.out, "initializer ") ==
          "initializer  normal (mean 0, stddev 0.100000001), seed 11");
  }
  SECTION("sgd") {
    const Result r =
        run_tool({"inspect", c.dir(), "--version", version_dir_name(10, true), "--table", "bias"});
    INFO(describe(r));
    REQUIRE(r.status == 0);
    CHECK(line_starting(r.out, "version ") ==
          "version      " + version_dir_name(10, true) + "  (full, step 10, base)");
    CHECK(line_starting(r.out, "rows ") == "rows         10  (1 file)");
    CHECK(line_starting(r.out, "state ") == "state        state_dim 0  (no state)");
    CHECK(line_starting(r.out, "initializer ") == "initializer  constant 0.25, seed 3");
    // No state column.
    const std::vector<PrintedRow> rows = printed_rows(r.out);
    REQUIRE(rows.size() == 5);
    for (const PrintedRow& p : rows) CHECK_FALSE(p.has_state);
  }
}

TEST_CASE("inspect prints exactly the values that lookup returns") {
  Checkpoints c;
  for (const TableSetup& t : kTables) {
    for (uint64_t n : {uint64_t{0}, uint64_t{5}, uint64_t{7}, uint64_t{100000}}) {
      std::vector<std::string> args = {"inspect", c.dir(), "--version", "latest",
                                       "--table", t.name,  "--floats",  "64"};
      if (n != 5) {
        args.push_back("--rows");
        args.push_back(std::to_string(n));
      }
      const Result r = run_tool(args);
      INFO(t.name << " --rows " << n << "\n" << describe(r));
      REQUIRE(r.status == 0);
      const uint64_t want = std::min<uint64_t>(n, c.rows(t.name));
      const std::vector<PrintedRow> rows = printed_rows(r.out);
      REQUIRE(rows.size() == want);
      CHECK(line_starting(r.out, "first ") == "first " + std::to_string(want) + " of " +
                                                  std::to_string(c.rows(t.name)) +
                                                  " rows (file order):");
      std::set<int64_t> keys;
      for (const PrintedRow& p : rows) {
        INFO("key " << p.key);
        CHECK(p.key >= t.first_key);
        CHECK(p.key < t.first_key + static_cast<int64_t>(c.rows(t.name)));
        keys.insert(p.key);
        // Every value of the row (--floats 64 covers every dim here), bit for bit.
        // The first mismatching row stops the test (not one failure per column of each row).
        const std::vector<float> expect = c.lookup(t.name, p.key);
        REQUIRE(p.values.size() == expect.size());
        size_t bad = 0;
        while (bad < expect.size() && same_bits(p.values[bad], expect[bad])) ++bad;
        if (bad < expect.size()) {
          INFO("column " << bad << ": printed " << p.values[bad] << ", lookup " << expect[bad]);
          REQUIRE(bad == expect.size());
        }
        CHECK(p.has_state == (t.optimizer != EMBSTORE_OPT_SGD));
      }
      CHECK(keys.size() == rows.size());  // distinct
    }
  }
}

TEST_CASE("inspect shortens long rows to --floats") {
  Checkpoints c;
  const Result r = run_tool(
      {"inspect", c.dir(), "--version", "20", "--table", "users", "--rows", "2", "--floats", "3"});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::vector<PrintedRow> rows = printed_rows(r.out);
  REQUIRE(rows.size() == 2);
  for (const PrintedRow& p : rows) {
    REQUIRE(p.values.size() == 3);
    REQUIRE(p.state.size() == 3);
    const std::vector<float> expect = c.lookup("users", p.key);
    for (size_t k = 0; k < 3; ++k) CHECK(same_bits(p.values[k], expect[k]));
    // Adagrad accumulators after one or two gradients: positive.
    for (float s : p.state) CHECK(s > 0.0f);
  }
  CHECK(contains(r.out, ", ... 61 more]  state ["));
}

TEST_CASE("inspect of an unknown version or table exits 1") {
  Checkpoints c;
  SECTION("table") {
    const Result r = run_tool({"inspect", c.dir(), "--version", "20", "--table", "nope"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(r.out.empty());
    CHECK(contains(r.err, "no table 'nope' in " + c.vdir(20) + " (its tables: "));
  }
  SECTION("version") {
    const Result r = run_tool({"inspect", c.dir(), "--version", "11", "--table", "users"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(r.out.empty());
    CHECK(contains(r.err, "no version 11 in " + c.dir()));
  }
  SECTION("version with a corrupt manifest") {
    fs::remove(c.vdir(20) + "/MANIFEST.json");
    const Result r = run_tool({"inspect", c.dir(), "--version", "20", "--table", "users"});
    CHECK(r.status == 1);
    CHECK(contains(r.err, "MANIFEST.json: missing"));
    // latest skips it.
    const Result latest = run_tool({"inspect", c.dir(), "--version", "latest", "--table", "users"});
    INFO(describe(latest));
    CHECK(latest.status == 0);
    CHECK(line_starting(latest.out, "rows ") == "rows         2500  (1 file)");
  }
  SECTION("latest is what restore loads: a corrupt newest manifest fails it") {
    // As restore and verify: latest does not fall back to an older version (it did, once).
    flip_byte(c.vdir(20) + "/MANIFEST.json", 30);
    const Result latest = run_tool({"inspect", c.dir(), "--version", "latest", "--table", "users"});
    INFO(describe(latest));
    CHECK(latest.status == 1);
    CHECK(contains(latest.err, version_dir_name(20, true) + "/MANIFEST.json"));
    CHECK(run_tool({"verify", c.dir(), "--version", "latest"}).status == 1);
    CHECK_FALSE(restores(c.dir(), EMBSTORE_LATEST));
  }
  SECTION("a corrupt row file") {
    const std::string path = c.row_file(20, "items");
    flip_byte(path, 64 + 8);
    const Result r = run_tool({"inspect", c.dir(), "--version", "20", "--table", "items"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(
        contains(r.err, path + ": corrupt row file: block at offset 0: payload checksum mismatch"));
  }
}

TEST_CASE("bad usage exits 2, help exits 0") {
  Checkpoints c;
  const std::vector<std::vector<std::string>> bad = {
      {},
      {"frobnicate", c.dir()},
      {"ls"},
      {"ls", c.dir(), "extra"},
      {"verify", c.dir(), "--version"},
      {"verify", c.dir(), "--version", "ten"},
      {"verify", c.dir(), "--version", "-1"},
      {"inspect", c.dir(), "--table", "users"},
      {"inspect", c.dir(), "--version", "20"},
      {"inspect", c.dir(), "--version", "20", "--table", "users", "--rows", "-3"},
      {"inspect", c.dir(), "--version", "20", "--table", "users", "--floats", "0"},
      {"inspect", c.dir(), "--version", "1e3", "--table", "users"},
      {"compact", c.dir(), "--version", "20"},
      {"compact", c.dir(), "--out", c.dir() + "-out"},
      {"compact", "--version", "20", "--out", c.dir() + "-out"},
      {"compact", c.dir(), "--version", "ten", "--out", c.dir() + "-out"},
  };
  for (const std::vector<std::string>& args : bad) {
    const Result r = run_tool(args);
    std::string joined;
    for (const std::string& a : args) joined += " " + a;
    INFO("embstore-ckpt" << joined << "\n" << describe(r));
    CHECK(r.status == 2);
    CHECK_FALSE(r.err.empty());
  }
  const Result help = run_tool({"--help"});
  INFO(describe(help));
  CHECK(help.status == 0);
  CHECK(contains(help.out, "verify"));
  CHECK(contains(help.out, "inspect"));
  CHECK(contains(help.out, "compact"));
  CHECK_FALSE(fs::exists(c.dir() + "-out"));  // bad usage writes nothing
}
