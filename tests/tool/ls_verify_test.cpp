// embstore-ckpt ls and verify on real checkpoints: every version listed with its chain and
// whether it restores, and verify's verdict on good versions and on each kind of damage
// (flipped bytes, truncated, grown or missing files, corrupt or missing manifests, attachments,
// shapes, kinds and row counts), always the same as restore's.
#include <catch2/catch.hpp>

#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test::tool;
using embstore_test::TempDir;

TEST_CASE("ls lists every version with its kind, size, tables, rows, attachments and chain") {
  Checkpoints c;
  const Result r = run_tool({"ls", c.dir()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  REQUIRE(columns(lines_of(r.out).at(0)) ==
          std::vector<std::string>{"DIRECTORY", "VERSION", "KIND", "STEP", "SIZE", "TABLES", "ROWS",
                                   "ATTACHMENTS", "CHAIN", "RESTORABLE", "RANKS"});
  for (uint64_t v : {10, 20}) {
    const std::string line = line_starting(r.out, version_dir_name(v, true));
    INFO("version " << v << ": " << line);
    const std::vector<std::string> col = columns(line);
    REQUIRE(col.size() == 11);
    CHECK(col[10] == "1");
    CHECK(col[1] == std::to_string(v));
    CHECK(col[2] == "full");
    CHECK(col[3] == std::to_string(v));
    // The bytes of every file in the version directory, and their human-readable size.
    const uint64_t bytes = tree_bytes(c.vdir(v));
    REQUIRE(bytes > uint64_t{1} << 20);  // users spans several 1 MiB blocks
    CHECK(col[4].rfind(std::to_string(bytes) + " (", 0) == 0);
    CHECK(std::regex_match(col[4], std::regex(R"(\d+ \(\d+\.\d MiB\))")));
    // Tables in any order.
    REQUIRE(col[5].rfind("3: ", 0) == 0);
    std::set<std::string> names;
    std::istringstream in(col[5].substr(3));
    for (std::string n; std::getline(in, n, ',');) names.insert(n.substr(n.find_first_not_of(' ')));
    CHECK(names == std::set<std::string>{"users", "items", "bias"});
    const uint64_t factor = v / 10;  // version 10 holds one round of keys, version 20 two
    CHECK(col[6] == std::to_string(factor * (2500 + 30 + 10)));
    CHECK(col[7] == (v == 10 ? "2: dense.bin, reader.offsets" : "1: dense.bin"));
    CHECK(col[8] == "base");
    CHECK(col[9] == "yes");
  }
  CHECK_FALSE(contains(r.out, "leftover"));
  // The store that writes there holds the directory's lock, and ls names it.
  REQUIRE(lines_of(r.out).size() == 4);
  CHECK(lines_of(r.out)[3].rfind("writer: pid " + std::to_string(::getpid()) + " on host ", 0) ==
        0);
  CHECK(contains(lines_of(r.out)[3], "(a store of ckpt_tool_test), since "));
  c.close();
  CHECK(lines_of(run_tool({"ls", c.dir()}).out).size() == 3);
}

TEST_CASE("ls marks what is not a checkpoint and counts leftovers") {
  Checkpoints c;
  // A version-named directory without a manifest, one with a corrupt manifest, crash
  // leftovers, and two deltas written with the manifest writer (the library writes none
  // yet): one whose parent is here, one whose parent is not.
  fs::create_directories(c.dir() + "/" + version_dir_name(30, true));
  fs::create_directories(c.dir() + "/.tmp-40-0123456789abcdef/users");
  fs::create_directories(c.dir() + "/.tmp-41-fedcba9876543210");
  std::ofstream(c.dir() + "/.tmp-42-half-written-file") << "x";
  fs::copy(c.vdir(10), c.dir() + "/" + version_dir_name(50, true), fs::copy_options::recursive);
  {
    const std::string manifest = c.dir() + "/" + version_dir_name(50, true) + "/MANIFEST.json";
    std::string text = read_file(manifest);
    const size_t at = text.find("\"rows\": 2500");
    REQUIRE(at != std::string::npos);
    text.replace(at, 12, "\"rows\": 2501");
    std::ofstream(manifest, std::ios::trunc) << text;
  }
  embstore::io::Manifest v20;
  std::string why;
  REQUIRE(embstore::io::read_manifest(c.vdir(20), &v20, &why) == 0);
  for (auto [version, parent] : {std::pair<uint64_t, uint64_t>{25, 20}, {60, 55}}) {
    embstore::io::Manifest m;
    m.full = false;
    m.version = version;
    m.parent = parent;
    m.lineage = v20.lineage;
    m.parent_xxh3 = v20.xxh3;  // 55's would be another
    m.embstore_version = embstore_version();
    const std::string d = c.dir() + "/" + version_dir_name(version, false);
    REQUIRE(embstore::io::create_directories(d) == 0);
    REQUIRE(embstore::io::write_manifest(d, m) == 0);
  }

  const Result r = run_tool({"ls", c.dir()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::vector<std::string> lines = lines_of(r.out);
  REQUIRE(lines.size() == 1 + 6 + 1 + 1);  // header, versions, leftovers, writer
  // Version order.
  CHECK(lines[1].rfind(version_dir_name(10, true), 0) == 0);
  CHECK(lines[2].rfind(version_dir_name(20, true), 0) == 0);
  CHECK(lines[3].rfind(version_dir_name(25, false), 0) == 0);
  // Notes take the columns after the name.
  CHECK(columns(lines[4]) ==
        std::vector<std::string>{version_dir_name(30, true), "(no manifest: not a checkpoint)"});
  CHECK(columns(lines[5]) ==
        std::vector<std::string>{version_dir_name(50, true),
                                 "(corrupt manifest: checksum mismatch (manifest_xxh3))"});
  CHECK(lines[6].rfind(version_dir_name(60, false), 0) == 0);
  const std::vector<std::string> delta = columns(lines[3]);
  REQUIRE(delta.size() == 11);
  CHECK(delta[1] == "25");
  CHECK(delta[2] == "delta");
  CHECK(delta[5] == "0");
  CHECK(delta[6] == "0");
  CHECK(delta[8] == "parent 20");
  CHECK(delta[9] == "yes");
  CHECK(columns(lines[6]).at(8) == "parent 55 (missing)");
  CHECK(columns(lines[6]).at(9) == "no");
  CHECK(lines[7] == "3 leftover temporary entries (removed at the next checkpoint)");
}

TEST_CASE("ls and verify of a missing or empty directory") {
  TempDir t;
  const std::string missing = t.path() + "/nothing-here";
  for (const char* cmd : {"ls", "verify"}) {
    const Result r = run_tool({cmd, missing});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, missing + ": no such directory"));
    CHECK(r.out.empty());
  }
  const Result inspect = run_tool({"inspect", missing, "--version", "latest", "--table", "x"});
  CHECK(inspect.status == 1);
  CHECK(contains(inspect.err, missing + ": no such directory"));

  const Result empty = run_tool({"ls", t.path()});
  INFO(describe(empty));
  CHECK(empty.status == 0);
  CHECK(empty.out == "no checkpoints in " + t.path() + "\n");
  const Result verify = run_tool({"verify", t.path()});
  CHECK(verify.status == 1);
  CHECK(contains(verify.err, "no checkpoints in " + t.path()));
}

TEST_CASE("verify passes good checkpoints, all of them or one") {
  Checkpoints c;
  const std::string ok10 = "OK " + version_dir_name(10, true) + "  (3 tables, 2540 rows, 5 files, ";
  const std::string ok20 = "OK " + version_dir_name(20, true) + "  (3 tables, 5080 rows, 4 files, ";

  const Result all = run_tool({"verify", c.dir()});
  INFO(describe(all));
  REQUIRE(all.status == 0);
  const std::vector<std::string> lines = lines_of(all.out);
  REQUIRE(lines.size() == 2);
  CHECK(lines[0].rfind(ok10, 0) == 0);
  CHECK(lines[1].rfind(ok20, 0) == 0);
  CHECK_FALSE(contains(all.err, "\r"));  // no progress bar off a terminal

  // --version by number, by directory name, latest.
  for (const std::string& v : {std::string("10"), version_dir_name(10, true)}) {
    const Result one = run_tool({"verify", c.dir(), "--version", v});
    INFO(describe(one));
    CHECK(one.status == 0);
    CHECK(lines_of(one.out).size() == 1);
    CHECK(one.out.rfind(ok10, 0) == 0);
  }
  const Result latest = run_tool({"verify", c.dir(), "--version", "latest"});
  CHECK(latest.status == 0);
  CHECK(lines_of(latest.out).size() == 1);
  CHECK(latest.out.rfind(ok20, 0) == 0);

  const Result none = run_tool({"verify", c.dir(), "--version", "15"});
  INFO(describe(none));
  CHECK(none.status == 1);
  CHECK(contains(none.err, "no version 15 in " + c.dir()));
  CHECK(none.out.empty());
  const Result delta = run_tool({"verify", c.dir(), "--version", version_dir_name(10, false)});
  CHECK(delta.status == 1);
  CHECK(contains(delta.err, "no version " + version_dir_name(10, false) + " in " + c.dir()));
}

TEST_CASE("verify names a row file with a flipped byte and the block's offset") {
  Checkpoints c;
  const std::string path = c.row_file(20, "users");
  const std::vector<uint64_t> blocks = block_offsets(path);
  REQUIRE(blocks.size() >= 2);
  uint64_t block = 0;
  SECTION("first block") { block = blocks[0]; }
  SECTION("second block") { block = blocks[1]; }
  // Inside the payload: a key of the block's third row.
  flip_byte(path, block + embstore::io::kRowBlockHeaderBytes + 2 * 8 + 3);

  const Result r = run_tool({"verify", c.dir()});
  INFO(describe(r));
  CHECK(r.status == 1);
  // Version 10 is intact and checked first; version 20 fails.
  CHECK(r.out.rfind("OK " + version_dir_name(10, true), 0) == 0);
  CHECK_FALSE(contains(r.out, "OK " + version_dir_name(20, true)));
  CHECK(contains(r.err, "FAILED " + version_dir_name(20, true) +
                            ": restore would return EMBSTORE_CORRUPT: " + path +
                            ": block at offset " + std::to_string(block) +
                            ": payload checksum mismatch"));
  // Only the first problem is reported.
  CHECK(messages(r.err).size() == 1);

  // The one version alone, and the others still pass.
  CHECK(run_tool({"verify", c.dir(), "--version", "20"}).status == 1);
  CHECK(run_tool({"verify", c.dir(), "--version", "10"}).status == 0);
}

TEST_CASE("verify names a flipped byte in a block header") {
  Checkpoints c;
  const std::string path = c.row_file(10, "items");
  flip_byte(path, 16);  // the rows field
  const Result r = run_tool({"verify", c.dir()});
  INFO(describe(r));
  CHECK(r.status == 1);
  // Every version is checked: 10 fails, 20 (a full checkpoint of its own) passes.
  CHECK(r.out.rfind("OK " + version_dir_name(20, true), 0) == 0);
  CHECK(contains(r.err, path + ": block at offset 0: header checksum mismatch"));
}

TEST_CASE("verify names a truncated row file") {
  Checkpoints c;
  const std::string path = c.row_file(20, "users");
  const uint64_t size = fs::file_size(path);
  const uint64_t cut = size - 4096;
  fs::resize_file(path, cut);
  const Result r = run_tool({"verify", c.dir(), "--version", "latest"});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(contains(r.err, path + ": truncated: the file is " + std::to_string(cut) +
                            " bytes, the manifest says " + std::to_string(size) +
                            " (data ends at offset " + std::to_string(cut) + ")"));
}

TEST_CASE("verify names a row file that grew") {
  Checkpoints c;
  const std::string path = c.row_file(10, "bias");
  const uint64_t size = fs::file_size(path);
  std::ofstream(path, std::ios::app | std::ios::binary) << "tail";
  const Result r = run_tool({"verify", c.dir()});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err, path + ": the file is " + std::to_string(size + 4) +
                            " bytes, the manifest says " + std::to_string(size) +
                            " (4 unexpected bytes from offset " + std::to_string(size) + ")"));
}

TEST_CASE("verify names a corrupt or missing manifest") {
  Checkpoints c;
  const std::string manifest = c.vdir(20) + "/MANIFEST.json";
  SECTION("a number changed") {
    change_seed(manifest);
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(lines_of(r.out).size() == 1);  // version 10
    CHECK(contains(r.err, "FAILED " + version_dir_name(20, true) +
                              ": restore would return EMBSTORE_CORRUPT: " + manifest +
                              ": checksum mismatch (manifest_xxh3)"));
    const Result ls = run_tool({"ls", c.dir()});
    CHECK(ls.status == 0);
    CHECK(columns(line_starting(ls.out, version_dir_name(20, true))) ==
          std::vector<std::string>{version_dir_name(20, true),
                                   "(corrupt manifest: checksum mismatch (manifest_xxh3))"});
    // latest: restore of EMBSTORE_LATEST passes over versions without a manifest, but a
    // corrupt one is corruption: it fails, and verify says so.
    const Result latest = run_tool({"verify", c.dir(), "--version", "latest"});
    CHECK(latest.status == 1);
    // Named by its directory, not by what was asked.
    CHECK(contains(latest.err, "FAILED " + version_dir_name(20, true) +
                                   ": restore would return EMBSTORE_CORRUPT: "));
    CHECK_FALSE(restores(c.dir(), EMBSTORE_LATEST));
    CHECK(restores(c.dir(), 10));
  }
  SECTION("torn") {
    const std::string text = read_file(manifest);
    std::ofstream(manifest, std::ios::trunc) << text.substr(0, text.size() / 2);
    const Result r = run_tool({"verify", c.dir(), "--version", "20"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, "FAILED " + version_dir_name(20, true) +
                              ": restore would return EMBSTORE_CORRUPT: " + manifest + ": "));
    CHECK(contains(r.err, "parse error"));
    CHECK(r.out.empty());
  }
  SECTION("removed") {
    fs::remove(manifest);
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, manifest + " is missing: it is not a committed checkpoint"));
    CHECK(columns(line_starting(run_tool({"ls", c.dir()}).out, version_dir_name(20, true))) ==
          std::vector<std::string>{version_dir_name(20, true), "(no manifest: not a checkpoint)"});
  }
  SECTION("describing another version") {
    fs::rename(c.vdir(10), c.dir() + "/" + version_dir_name(15, true));
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, c.dir() + "/" + version_dir_name(15, true) +
                              "/MANIFEST.json: it describes version 10 (full), "
                              "not the directory's"));
  }
}

TEST_CASE("verify names a missing, altered or missized attachment") {
  Checkpoints c;
  const std::string path = c.vdir(10) + "/" + embstore::io::attachment_path("reader.offsets");
  REQUIRE(read_file(path) == "0123456789");
  SECTION("deleted") {
    fs::remove(path);
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(r.out.rfind("OK " + version_dir_name(20, true), 0) == 0);  // its own attachments
    CHECK(contains(r.err, path + " is missing (the manifest lists it with 10 bytes)"));
  }
  SECTION("one byte changed") {
    flip_byte(path, 4);
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, path + ": XXH3 checksum mismatch: the file hashes to "));
  }
  SECTION("truncated") {
    fs::resize_file(path, 3);
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, path + ": truncated: the file is 3 bytes, the manifest says 10"));
  }
}

TEST_CASE("verify names a missing row file") {
  Checkpoints c;
  const std::string path = c.row_file(20, "items");
  fs::remove(path);
  const Result r = run_tool({"verify", c.dir(), "--version", "20"});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err, path + " is missing (the manifest lists it with "));
}

// Row files that are intact block by block but disagree with their manifest: written with
// RowFileWriter and entered into the manifest with their true size and checksum.
TEST_CASE("verify checks each block's shape and kind and the row count") {
  Checkpoints c;
  const std::string vdir = c.vdir(20);
  const std::string path = c.row_file(20, "items");
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(vdir, &m, &detail) == 0);
  auto items = std::find_if(m.tables.begin(), m.tables.end(),
                            [](const embstore::io::TableEntry& t) { return t.name == "items"; });
  REQUIRE(items != m.tables.end());
  REQUIRE(items->config.dim == 4);
  REQUIRE(items->state_dim == 10);
  embstore::io::FileEntry& entry = items->files.at(0);

  // Rewrites the items row file: n upserts of the given shape, then tombstones.
  auto rewrite = [&](uint32_t dim, uint32_t state_dim, int upserts, int tombstones) {
    std::unique_ptr<embstore::io::RowFileWriter> w;
    REQUIRE(embstore::io::RowFileWriter::open(path, dim, state_dim, {}, &w) == 0);
    const std::vector<float> value(dim, 0.5f), state(state_dim, 0.25f);
    for (int i = 0; i < upserts; ++i) REQUIRE(w->add(-500 + i, value.data(), state.data()) == 0);
    for (int i = 0; i < tombstones; ++i) REQUIRE(w->add_tombstone(-400 + i) == 0);
    REQUIRE(w->finish() == 0);
    entry.bytes = w->bytes();
    entry.xxh3 = w->checksum();
    entry.rows = w->rows();
    items->rows = w->rows();
  };
  std::string expect;
  SECTION("another dim") {
    rewrite(3, 10, 5, 0);
    expect = ": block at offset 0 has dim 3 and state_dim 10, the manifest says 4 and 10";
  }
  SECTION("another state_dim") {
    rewrite(4, 8, 5, 0);
    expect = ": block at offset 0 has dim 4 and state_dim 8, the manifest says 4 and 10";
  }
  SECTION("tombstones in a full checkpoint") {
    rewrite(4, 10, 2, 1);
    expect = ": block at offset 4096 holds tombstones in a full checkpoint";
  }
  SECTION("fewer rows than the manifest says") {
    entry.rows += 1;
    items->rows += 1;
    expect = ": holds 60 rows, the manifest says 61";
  }
  REQUIRE(embstore::io::write_manifest(vdir, m) == 0);
  const Result r = run_tool({"verify", c.dir(), "--version", "20"});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(r.out.empty());
  CHECK(contains(r.err, path + expect));
}

TEST_CASE("ls marks the versions whose chain is broken as not restorable") {
  Checkpoints c(Checkpoints::kChain);
  make_chain(c);
  REQUIRE(c.advance(50, 4, true) == 50);
  REQUIRE(c.advance(60, 5) == 60);
  REQUIRE(fs::exists(c.vdir(50)));
  REQUIRE(fs::exists(c.delta_dir(60)));
  std::map<uint64_t, std::string> expect = {{10, "yes"}, {20, "yes"}, {30, "yes"},
                                            {40, "yes"}, {50, "yes"}, {60, "yes"}};
  SECTION("intact") {}
  SECTION("a middle delta deleted") {
    fs::remove_all(c.delta_dir(20));
    expect.erase(20);
    expect[30] = expect[40] = "no";
  }
  SECTION("a middle manifest corrupt") {
    const std::string manifest = c.delta_dir(30) + "/MANIFEST.json";
    change_seed(manifest);
    expect.erase(30);  // shown with a note
    expect[40] = "no";
  }
  const Result r = run_tool({"ls", c.dir()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  for (const auto& [version, restorable] : expect) {
    const bool full = version == 10 || version == 50;
    const std::vector<std::string> col =
        columns(line_starting(r.out, version_dir_name(version, full)));
    INFO("version " << version);
    REQUIRE(col.size() == 11);
    CHECK(col[9] == restorable);
    CHECK(col[8].rfind(full ? std::string("base") : "parent " + std::to_string(version - 10), 0) ==
          0);
    // ls tells what restore finds.
    CHECK(restores(c.dir(), version) == (restorable == "yes"));
  }
}

TEST_CASE("verify takes 'latest' by name only: the largest number is refused") {
  // 18446744073709551615 is the library's EMBSTORE_LATEST: as a number it used to mean latest.
  Checkpoints c;
  for (const std::string& v :
       {std::string("18446744073709551615"), std::string("18446744073709551615.full")}) {
    const Result r = run_tool({"verify", c.dir(), "--version", v});
    INFO(describe(r));
    CHECK(r.status == 2);
    CHECK(contains(r.err, "out of range"));
  }
  const Result r = run_tool({"verify", c.dir(), "--version", "latest"});
  INFO(describe(r));
  CHECK(r.status == 0);
}
