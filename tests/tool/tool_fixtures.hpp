// Fixtures of the embstore-ckpt tests: the tool run as a program (stdout, stderr and exit
// status captured), and real checkpoints written through the C API on the host backend (three
// tables, versions 10 and 20, full or a chain). Links embstore_static for the io/ reader and
// manifest writer, which the tests use to find block offsets and to craft versions.
#pragma once

#include <embstore/embstore.h>
#include <fcntl.h>
#include <sys/resource.h>
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

#include "io/format/admission_file.hpp"
#include "io/format/commit.hpp"
#include "io/format/dir_lock.hpp"
#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"
#include "tests/io/io_fixtures.hpp"

#ifndef EMBSTORE_CKPT_TOOL
#error "EMBSTORE_CKPT_TOOL must give the path of the embstore-ckpt binary"
#endif

namespace embstore_test::tool {

namespace fs = std::filesystem;
using embstore::io::version_dir_name;

// Paths inside a version directory, in the layout this version writes.
inline std::string row_rel(const std::string& table) {
  return embstore::io::row_file_path(embstore::io::kManifestFormatVersion, table, 0, 1);
}
inline std::string table_rel(const std::string& table) {
  return embstore::io::table_dir(embstore::io::kManifestFormatVersion, table);
}

using embstore_test::TempDir;

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

struct Result {
  int status = -1;  // exit status; -1 when killed by a signal
  std::string out, err;
  long max_rss_kib = 0;  // the process's peak resident memory
};

// Starts embstore-ckpt with args in a child whose standard streams redirect() sets up (it
// returns false when it cannot: the child exits 126). The child dies with the test.
template <typename Redirect>
pid_t spawn_tool(const std::vector<std::string>& args, Redirect redirect) {
  std::vector<std::string> argv_s = {EMBSTORE_CKPT_TOOL};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    embstore_test::die_with_parent(parent);
    if (!redirect()) _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

// Runs embstore-ckpt with args, stdout and stderr captured through files (never a terminal,
// so no progress bar).
inline Result run_tool(const std::vector<std::string>& args) {
  TempDir capture;
  const std::string out_path = capture.path() + "/stdout", err_path = capture.path() + "/stderr";
  const pid_t pid = spawn_tool(args, [&] {
    const int out = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    return out >= 0 && err >= 0 && dup2(out, 1) >= 0 && dup2(err, 2) >= 0;
  });
  int wstatus = 0;
  struct rusage usage {};
  REQUIRE(wait4(pid, &wstatus, 0, &usage) == pid);
  Result r;
  r.status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
  r.max_rss_kib = usage.ru_maxrss;
  r.out = read_file(out_path);
  r.err = read_file(err_path);
  return r;
}

inline std::string describe(const Result& r) {
  return "exit " + std::to_string(r.status) + "\n--- stdout\n" + r.out + "--- stderr\n" + r.err;
}

inline bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// The lines of the tool's stderr, without the library's io engine log line.
inline std::vector<std::string> messages(const std::string& err) {
  std::vector<std::string> out;
  for (const std::string& line : lines_of(err)) {
    if (line.rfind("embstore: io engine ", 0) != 0) out.push_back(line);
  }
  return out;
}

// The line of text starting with prefix ("" when none).
inline std::string line_starting(const std::string& text, const std::string& prefix) {
  for (const std::string& line : lines_of(text)) {
    if (line.rfind(prefix, 0) == 0) return line;
  }
  return "";
}

// ls columns are separated by two or more spaces.
inline std::vector<std::string> columns(const std::string& line) {
  static const std::regex sep(" {2,}");
  return {std::sregex_token_iterator(line.begin(), line.end(), sep, -1),
          std::sregex_token_iterator()};
}

inline void ok(embstore_status_t s) {
  INFO("status " << embstore_status_name(s) << ", last_error: " << embstore_last_error());
  REQUIRE(s == EMBSTORE_OK);
}

// Whether embstore_restore(dir, version) succeeds in a fresh store.
inline bool restores(const std::string& dir, uint64_t version) {
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

inline uint64_t tree_bytes(const std::string& path) {
  uint64_t total = 0;
  for (const auto& e : fs::recursive_directory_iterator(path)) {
    if (e.is_regular_file()) total += e.file_size();
  }
  return total;
}

inline void flip_byte(const std::string& path, uint64_t offset) {
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
inline void change_seed(const std::string& manifest) {
  std::string text = read_file(manifest);
  const size_t at = text.find("\"seed\": 7");
  REQUIRE(at != std::string::npos);
  text[at + 8] = '8';
  std::ofstream(manifest, std::ios::trunc) << text;
}

// The offsets of the row blocks of a file.
inline std::vector<uint64_t> block_offsets(const std::string& path) {
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

inline std::vector<float> parse_floats(const std::string& list) {
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

inline std::vector<PrintedRow> printed_rows(const std::string& out) {
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

inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

// The entries of dir but its writer lock file.
inline std::vector<std::string> entries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename() != embstore::io::kLockFileName) {
      names.push_back(e.path().filename().string());
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Versions 10 (full), 20, 30 and 40 (deltas); every round inserts keys and updates older ones.
inline void make_chain(Checkpoints& c) {
  REQUIRE(c.advance(30, 2) == 30);
  REQUIRE(c.advance(40, 3) == 40);
  REQUIRE(fs::exists(c.vdir(10)));
  for (uint64_t v : {20, 30, 40}) REQUIRE(fs::exists(c.delta_dir(v)));
}

}  // namespace embstore_test::tool
