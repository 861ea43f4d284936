// embstore-ckpt (io/tool/ckpt_main.cpp) run as a program on real checkpoints written through
// the C API on the host backend: ls, verify (good checkpoints, then a flipped byte, a
// truncated row file, a corrupt manifest, a missing or altered attachment), inspect (against
// the values embstore_lookup returns), and the exit codes. Links embstore_static for the io/
// reader and manifest writer, which the tests use to find block offsets and to craft deltas.
#include <embstore/embstore.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "io/commit.hpp"
#include "io/manifest.hpp"
#include "io/row_file.hpp"
#include "tests/io/io_fixtures.hpp"

#ifndef EMBSTORE_CKPT_TOOL
#error "EMBSTORE_CKPT_TOOL must give the path of the embstore-ckpt binary"
#endif

namespace fs = std::filesystem;
using embstore::io::version_dir_name;

namespace {

constexpr const char* kShard = "shard-00000-of-00001.rows";

using embstore_test::TempDir;

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Result {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
};

// Runs embstore-ckpt with args, stdout and stderr captured through files (never a terminal,
// so no progress bar).
Result run_tool(const std::vector<std::string>& args) {
  TempDir capture;
  const std::string out_path = capture.path() + "/stdout", err_path = capture.path() + "/stderr";
  std::vector<std::string> argv_s = {EMBSTORE_CKPT_TOOL};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int wstatus = 0;
  REQUIRE(waitpid(pid, &wstatus, 0) == pid);
  Result r;
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

std::string describe(const Result& r) {
  return "exit " + std::to_string(r.status) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The lines of the tool's stderr, without the library's io engine log line.
std::vector<std::string> messages(const std::string& err) {
  std::vector<std::string> out;
  for (const std::string& line : lines_of(err)) {
    if (line.rfind("embstore: io engine ", 0) != 0) out.push_back(line);
  }
  return out;
}

// The line of text starting with prefix ("" when none).
std::string line_starting(const std::string& text, const std::string& prefix) {
  for (const std::string& line : lines_of(text)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

// ls columns are separated by two or more spaces.
std::vector<std::string> columns(const std::string& line) {
  static const std::regex sep(" {2,}");
  return {std::sregex_token_iterator(line.begin(), line.end(), sep, -1),
          std::sregex_token_iterator()};
}

void ok(embstore_status_t s) {
  INFO("status " << embstore_status_name(s) << ", last_error: " << embstore_last_error());
  REQUIRE(s == EMBSTORE_OK);
}

struct TableSetup {
  const char* name;
  uint32_t dim;
  embstore_optimizer_t optimizer;
  embstore_init_t init;
  uint64_t seed;
  int64_t first_key;
  uint64_t rows_v10;  // rows after version 10; version 20 adds as many again
};

// users: several row blocks (dim 64 Adagrad: 2016 rows per 1 MiB block).
const TableSetup kTables[] = {
    {"users", 64, EMBSTORE_OPT_ADAGRAD, EMBSTORE_INIT_UNIFORM, 7, 1000000, 2500},
    {"items", 4, EMBSTORE_OPT_ADAM, EMBSTORE_INIT_NORMAL, 11, -500, 30},
    {"bias", 1, EMBSTORE_OPT_SGD, EMBSTORE_INIT_CONSTANT, 3, 42, 10},
};

// A store with three tables and two full checkpoints (versions 10 and 20, each with an
// attachment) in a fresh directory. Nothing changes the tables after version 20.
class Checkpoints {
 public:
  Checkpoints() {
    dir_ = tmp_.path() + "/ckpt";
    embstore_store_config_t sc;
    embstore_store_config_init(&sc);
    sc.backend = EMBSTORE_BACKEND_HOST;
    sc.host_threads = 2;
    ok(embstore_store_create(&sc, &store_));
    for (const TableSetup& t : kTables) {
      embstore_table_config_t c;
      embstore_table_config_init(&c);
      c.name = t.name;
      c.dim = t.dim;
      c.optimizer = t.optimizer;
      c.init = t.init;
      c.seed = t.seed;
      c.learning_rate = 0.05f;
      if (t.init == EMBSTORE_INIT_CONSTANT) c.init_a = 0.25f;
      if (t.init == EMBSTORE_INIT_NORMAL) {
        c.init_a = 0.0f;
        c.init_b = 0.1f;
      }
      embstore_table_t* table = nullptr;
      ok(embstore_table_create(store_, &c, &table));
      tables_[t.name] = table;
    }
    train(10, 0);
    ok(embstore_checkpoint_attach(store_, "dense.bin", "dense weights v10", 17));
    ok(embstore_checkpoint_attach(store_, "reader.offsets", "0123456789", 10));
    REQUIRE(checkpoint() == 10);
    train(20, 1);
    ok(embstore_checkpoint_attach(store_, "dense.bin", "dense weights, step 20", 22));
    REQUIRE(checkpoint() == 20);
  }
  ~Checkpoints() { embstore_store_destroy(store_); }
  Checkpoints(const Checkpoints&) = delete;
  Checkpoints& operator=(const Checkpoints&) = delete;

  const std::string& dir() const { return dir_; }
  std::string vdir(uint64_t version) const { return dir_ + "/" + version_dir_name(version, true); }
  std::string row_file(uint64_t version, const std::string& table) const {
    return vdir(version) + "/" + table + "/" + kShard;
  }
  // Every table's rows at version 20 (the current ones).
  uint64_t rows(const std::string& table) const {
    for (const TableSetup& t : kTables) {
      if (table == t.name) return 2 * t.rows_v10;
    }
    return 0;
  }
  // The current value of key (flags 0: nothing inserted).
  std::vector<float> lookup(const std::string& table, int64_t key) const {
    embstore_table_t* t = tables_.at(table);
    std::vector<float> v(embstore_table_dim(t));
    ok(embstore_lookup(t, &key, 1, v.data(), 0, nullptr));
    return v;
  }

 private:
  // Step, then per table the round's keys are inserted and get one gradient.
  void train(uint64_t step, int round) {
    ok(embstore_step(store_, step));
    for (const TableSetup& t : kTables) {
      std::vector<int64_t> keys;
      for (uint64_t i = 0; i < t.rows_v10; ++i) {
        keys.push_back(t.first_key + static_cast<int64_t>(round * t.rows_v10 + i));
      }
      // Half the keys of round 0 are touched again in round 1.
      if (round == 1) {
        for (uint64_t i = 0; i < t.rows_v10 / 2; ++i) keys.push_back(t.first_key + i);
      }
      embstore_table_t* table = tables_.at(t.name);
      std::vector<float> values(keys.size() * t.dim), grads(keys.size() * t.dim);
      ok(embstore_lookup(table, keys.data(), keys.size(), values.data(), EMBSTORE_LOOKUP_INSERT,
                         nullptr));
      for (size_t i = 0; i < grads.size(); ++i) {
        grads[i] = 0.001f * static_cast<float>((i * 7919 + round * 31) % 200) - 0.1f;
      }
      ok(embstore_apply_gradients(table, keys.data(), grads.data(), keys.size(), nullptr));
    }
  }

  uint64_t checkpoint() {
    uint64_t version = 0;
    ok(embstore_checkpoint(store_, dir_.c_str(), EMBSTORE_CKPT_FULL, &version));
    ok(embstore_checkpoint_wait(store_, version));
    return version;
  }

  TempDir tmp_;
  std::string dir_;
  embstore_store_t* store_ = nullptr;
  std::map<std::string, embstore_table_t*> tables_;
};

uint64_t tree_bytes(const std::string& path) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) total += e.file_size();
  }
  return total;
}

void flip_byte(const std::string& path, uint64_t offset) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  REQUIRE(f);
  f.seekg(static_cast<std::streamoff>(offset));
  char c = 0;
  REQUIRE(f.get(c));
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x20));
  REQUIRE(f);
}

// The offsets of the row blocks of a file.
std::vector<uint64_t> block_offsets(const std::string& path) {
  std::unique_ptr<embstore::io::RowFileReader> reader;
  REQUIRE(embstore::io::RowFileReader::open(path, {}, &reader) == 0);
  std::vector<uint64_t> offsets;
  embstore::io::RowBlock b;
  int r;
  while ((r = reader->next_block(&b)) == 1) offsets.push_back(b.offset);
  REQUIRE(r == 0);
  return offsets;
}

// "  key K  value [v0, v1, ...]" lines of inspect: key and the printed values.
struct PrintedRow {
  int64_t key = 0;
  std::vector<float> values;
  std::vector<float> state;
  bool has_state = false;
};

std::vector<float> parse_floats(const std::string& list) {
  std::vector<float> out;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const size_t start = item.find_first_not_of(' ');
    if (start == std::string::npos || item.compare(start, 3, "...") == 0) break;
    char* end = nullptr;
    const float v = std::strtof(item.c_str() + start, &end);
    REQUIRE(end != item.c_str() + start);
    out.push_back(v);
  }
  return out;
}

std::vector<PrintedRow> printed_rows(const std::string& out) {
  static const std::regex row(R"(^  key (-?\d+)  value \[([^\]]*)\](  state \[([^\]]*)\])?$)");
  std::vector<PrintedRow> rows;
  for (const std::string& line : lines_of(out)) {
    if (line.rfind("  key ", 0) != 0) continue;
    std::smatch m;
    INFO(line);
    REQUIRE(std::regex_match(line, m, row));
    PrintedRow r;
    r.key = std::stoll(m[1].str());
    r.values = parse_floats(m[2].str());
    r.has_state = m[3].matched;
    if (r.has_state) r.state = parse_floats(m[4].str());
    rows.push_back(std::move(r));
  }
  return rows;
}

bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

TEST_CASE("ls lists every version with its kind, size, tables, rows, attachments and chain") {
  Checkpoints c;
  const Result r = run_tool({"ls", c.dir()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  REQUIRE(columns(lines_of(r.out).at(0)) ==
          std::vector<std::string>{"DIRECTORY", "VERSION", "KIND", "STEP", "SIZE", "TABLES", "ROWS",
                                   "ATTACHMENTS", "CHAIN"});
  for (uint64_t v : {10, 20}) {
    const std::string line = line_starting(r.out, version_dir_name(v, true));
    INFO("version " << v << ": " << line);
    const std::vector<std::string> col = columns(line);
    REQUIRE(col.size() == 9);
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
  }
  CHECK_FALSE(contains(r.out, "leftover"));
  CHECK(lines_of(r.out).size() == 3);
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
  for (auto [version, parent] : {std::pair<uint64_t, uint64_t>{25, 20}, {60, 55}}) {
    embstore::io::Manifest m;
    m.full = false;
    m.version = version;
    m.parent = parent;
    m.embstore_version = embstore_version();
    const std::string d = c.dir() + "/" + version_dir_name(version, false);
    REQUIRE(embstore::io::create_directories(d) == 0);
    REQUIRE(embstore::io::write_manifest(d, m) == 0);
  }

  const Result r = run_tool({"ls", c.dir()});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::vector<std::string> lines = lines_of(r.out);
  REQUIRE(lines.size() == 1 + 6 + 1);
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
  REQUIRE(delta.size() == 9);
  CHECK(delta[1] == "25");
  CHECK(delta[2] == "delta");
  CHECK(delta[5] == "0");
  CHECK(delta[6] == "0");
  CHECK(delta[8] == "parent 20");
  CHECK(columns(lines[6]).back() == "parent 55 (missing)");
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
  CHECK(contains(r.err, path + ": corrupt row file: block at offset " + std::to_string(block) +
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
  CHECK(r.out.empty());
  CHECK(contains(r.err, path + ": corrupt row file: block at offset 0: header checksum mismatch"));
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
    std::string text = read_file(manifest);
    const size_t at = text.find("\"seed\": 7");
    REQUIRE(at != std::string::npos);
    text[at + 8] = '8';
    std::ofstream(manifest, std::ios::trunc) << text;
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(lines_of(r.out).size() == 1);  // version 10
    CHECK(contains(r.err, manifest + ": corrupt manifest: checksum mismatch (manifest_xxh3)"));
    const Result ls = run_tool({"ls", c.dir()});
    CHECK(ls.status == 0);
    CHECK(columns(line_starting(ls.out, version_dir_name(20, true))) ==
          std::vector<std::string>{version_dir_name(20, true),
                                   "(corrupt manifest: checksum mismatch (manifest_xxh3))"});
    // latest: the newest version with a valid manifest.
    const Result latest = run_tool({"verify", c.dir(), "--version", "latest"});
    CHECK(latest.status == 0);
    CHECK(latest.out.rfind("OK " + version_dir_name(10, true), 0) == 0);
  }
  SECTION("torn") {
    const std::string text = read_file(manifest);
    std::ofstream(manifest, std::ios::trunc) << text.substr(0, text.size() / 2);
    const Result r = run_tool({"verify", c.dir(), "--version", "20"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, manifest + ": corrupt manifest: "));
    CHECK(contains(r.err, "parse error"));
  }
  SECTION("removed") {
    fs::remove(manifest);
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(
        contains(r.err, manifest + ": missing: " + c.vdir(20) + " is not a committed checkpoint"));
    CHECK(columns(line_starting(run_tool({"ls", c.dir()}).out, version_dir_name(20, true))) ==
          std::vector<std::string>{version_dir_name(20, true), "(no manifest: not a checkpoint)"});
  }
  SECTION("describing another version") {
    fs::rename(c.vdir(10), c.dir() + "/" + version_dir_name(15, true));
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, c.dir() + "/" + version_dir_name(15, true) +
                              "/MANIFEST.json: corrupt manifest: it describes version 10 (full), "
                              "not the directory's"));
  }
}

TEST_CASE("verify names a missing, altered or missized attachment") {
  Checkpoints c;
  const std::string path = c.vdir(10) + "/attachments/reader.offsets";
  REQUIRE(read_file(path) == "0123456789");
  SECTION("deleted") {
    fs::remove(path);
    const Result r = run_tool({"verify", c.dir()});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(r.out.empty());
    CHECK(contains(r.err, path + ": missing (the manifest lists it with 10 bytes)"));
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
  CHECK(contains(r.err, path + ": missing (the manifest lists it with "));
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

TEST_CASE("inspect shows a delta's tombstones") {
  Checkpoints c;
  // A delta of one table written with the io/ layer (the library writes none yet).
  const std::string vdir = c.dir() + "/" + version_dir_name(30, false);
  REQUIRE(embstore::io::create_directories(vdir + "/bias") == 0);
  embstore::io::Manifest m;
  std::string detail;
  REQUIRE(embstore::io::read_manifest(c.vdir(20), &m, &detail) == 0);
  m.full = false;
  m.version = 30;
  m.parent = 20;
  m.attachments.clear();
  m.tables.erase(std::remove_if(m.tables.begin(), m.tables.end(),
                                [](const embstore::io::TableEntry& t) { return t.name != "bias"; }),
                 m.tables.end());
  REQUIRE(m.tables.size() == 1);
  std::unique_ptr<embstore::io::RowFileWriter> w;
  REQUIRE(embstore::io::RowFileWriter::open(vdir + "/bias/" + kShard, 1, 0, {}, &w) == 0);
  const float one = 1.5f;
  REQUIRE(w->add(42, &one, nullptr) == 0);
  REQUIRE(w->add_tombstone(43) == 0);
  REQUIRE(w->add_tombstone(44) == 0);
  REQUIRE(w->finish() == 0);
  m.tables[0].files = {{std::string("bias/") + kShard, w->bytes(), w->rows(), w->checksum()}};
  m.tables[0].rows = w->rows();
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
  const Result verify = run_tool({"verify", c.dir(), "--version", "20"});
  INFO(describe(verify));
  CHECK(verify.status == 0);
  CHECK(lines_of(verify.out).size() == 2);
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
}
