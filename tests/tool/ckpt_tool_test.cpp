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

#include "io/admission_file.hpp"
#include "io/commit.hpp"
#include "io/dir_lock.hpp"
#include "io/layout.hpp"
#include "io/manifest.hpp"
#include "io/row_file.hpp"
#include "tests/io/io_fixtures.hpp"

#ifndef EMBSTORE_CKPT_TOOL
#error "EMBSTORE_CKPT_TOOL must give the path of the embstore-ckpt binary"
#endif

namespace fs = std::filesystem;
using embstore::io::version_dir_name;

namespace {

// Paths inside a version directory, in the layout this version writes.
std::string row_rel(const std::string& table) {
  return embstore::io::row_file_path(embstore::io::kManifestFormatVersion, table, 0, 1);
}
std::string table_rel(const std::string& table) {
  return embstore::io::table_dir(embstore::io::kManifestFormatVersion, table);
}

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

// Whether embstore_restore(dir, version) succeeds in a fresh store.
bool restores(const std::string& dir, uint64_t version) {
  embstore_store_config_t sc;
  embstore_store_config_init(&sc);
  sc.backend = EMBSTORE_BACKEND_HOST;
  embstore_store_t* raw = nullptr;
  ok(embstore_store_create(&sc, &raw));
  uint64_t got = 0;
  const bool restored = embstore_restore(raw, dir.c_str(), version, &got) == EMBSTORE_OK;
  embstore_store_destroy(raw);
  return restored;
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

// A store with three tables and two checkpoints (versions 10 and 20, each with an attachment)
// in a fresh directory: both full, or (kChain) a full one and a delta. Nothing changes the
// tables after version 20 but advance().
class Checkpoints {
 public:
  enum Kind { kFulls, kChain };

  explicit Checkpoints(Kind kind = kFulls) : kind_(kind) {
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
    if (kind_ == kChain) {
      // Small tables make each delta large next to its full checkpoint: keep the chain.
      embstore_checkpoint_policy_t p;
      embstore_checkpoint_policy_init(&p);
      p.max_chain_length = 0;
      p.rebaseline_fraction = 0;
      ok(embstore_checkpoint_set_policy(store_, &p));
    }
    train(10, 0);
    ok(embstore_checkpoint_attach(store_, "dense.bin", "dense weights v10", 17));
    ok(embstore_checkpoint_attach(store_, "reader.offsets", "0123456789", 10));
    REQUIRE(checkpoint() == 10);
    train(20, 1);
    ok(embstore_checkpoint_attach(store_, "dense.bin", "dense weights, step 20", 22));
    REQUIRE(checkpoint() == 20);
  }
  ~Checkpoints() { close(); }
  // Destroys the store: it no longer holds the directory's writer lock.
  void close() {
    embstore_store_destroy(store_);
    store_ = nullptr;
  }
  Checkpoints(const Checkpoints&) = delete;
  Checkpoints& operator=(const Checkpoints&) = delete;

  const std::string& dir() const { return dir_; }
  std::string vdir(uint64_t version) const { return dir_ + "/" + version_dir_name(version, true); }
  std::string delta_dir(uint64_t version) const {
    return dir_ + "/" + version_dir_name(version, false);
  }
  embstore_store_t* store() const { return store_; }
  // Trains one more round at step and checkpoints it (kChain: a delta; full when asked).
  uint64_t advance(uint64_t step, int round, bool full = false) {
    train(step, round);
    return checkpoint(full);
  }
  std::string row_file(uint64_t version, const std::string& table) const {
    return vdir(version) + "/" + row_rel(table);
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
      // Half the keys of round 0 are touched again in each later round, and from round 2 on
      // half the keys the round before inserted.
      if (round >= 1) {
        for (uint64_t i = 0; i < t.rows_v10 / 2; ++i) keys.push_back(t.first_key + i);
      }
      if (round >= 2) {
        for (uint64_t i = 0; i < t.rows_v10 / 2; ++i) {
          keys.push_back(t.first_key + static_cast<int64_t>((round - 1) * t.rows_v10 + i));
        }
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

  uint64_t checkpoint(bool full = false) {
    uint64_t version = 0;
    ok(embstore_checkpoint(store_, dir_.c_str(),
                           full || kind_ == kFulls ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL,
                           &version));
    ok(embstore_checkpoint_wait(store_, version));
    return version;
  }

  Kind kind_;
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

// Changes a digit in a manifest (users' seed, 7) and leaves its checksum as it was.
void change_seed(const std::string& manifest) {
  std::string text = read_file(manifest);
  const size_t at = text.find("\"seed\": 7");
  REQUIRE(at != std::string::npos);
  text[at + 8] = '8';
  std::ofstream(manifest, std::ios::trunc) << text;
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
                                   "ATTACHMENTS", "CHAIN", "RESTORABLE"});
  for (uint64_t v : {10, 20}) {
    const std::string line = line_starting(r.out, version_dir_name(v, true));
    INFO("version " << v << ": " << line);
    const std::vector<std::string> col = columns(line);
    REQUIRE(col.size() == 10);
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
  REQUIRE(delta.size() == 10);
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
    CHECK(contains(latest.err, "FAILED latest: restore would return EMBSTORE_CORRUPT: "));
    CHECK_FALSE(restores(c.dir(), EMBSTORE_LATEST));
    CHECK(restores(c.dir(), 10));
  }
  SECTION("torn") {
    const std::string text = read_file(manifest);
    std::ofstream(manifest, std::ios::trunc) << text.substr(0, text.size() / 2);
    const Result r = run_tool({"verify", c.dir(), "--version", "20"});
    INFO(describe(r));
    CHECK(r.status == 1);
    CHECK(contains(r.err, "FAILED 20: restore would return EMBSTORE_CORRUPT: " + manifest + ": "));
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

// --------------------------------------------------------------------------- compact --

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

// The names in dir, sorted.
// The entries of dir but its writer lock file.
std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != embstore::io::kLockFileName) {
      names.push_back(e.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
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

// Versions 10 (full), 20, 30 and 40 (deltas); every round inserts keys and updates older ones.
void make_chain(Checkpoints& c) {
  REQUIRE(c.advance(30, 2) == 30);
  REQUIRE(c.advance(40, 3) == 40);
  REQUIRE(fs::exists(c.vdir(10)));
  for (uint64_t v : {20, 30, 40}) REQUIRE(fs::exists(c.delta_dir(v)));
}

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
  CHECK(columns(line_starting(ls.out, version_dir_name(60, true))).back() == "yes");
}

TEST_CASE("compact merges the chain's admission counts; verify checks them") {
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
    CHECK(contains(r.err, "'" + c.dir() + "' holds no version " + v));
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
    REQUIRE(col.size() == 10);
    CHECK(col[9] == restorable);
    CHECK(col[8].rfind(full ? std::string("base") : "parent " + std::to_string(version - 10), 0) ==
          0);
    // ls tells what restore finds.
    CHECK(restores(c.dir(), version) == (restorable == "yes"));
  }
}
