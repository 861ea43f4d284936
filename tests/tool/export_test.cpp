// embstore-ckpt export: a table's rows at a version as .npy files, read back here by a small
// parser of the format (and by numpy where it is installed): every key once, its values and
// optimizer state exactly those restore gives, across a chain and from a checkpoint of several
// ranks.
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "host/checkpoint/restore_plan.hpp"
#include "tests/shard/collective_scenario.hpp"
#include "tests/shard/thread_group.hpp"
#include "tests/tool/tool_fixtures.hpp"

using namespace embstore_test::tool;
using embstore_test::TempDir;

namespace {

// An .npy file of format 1.0: its descr, shape and data (little-endian, C order).
struct Npy {
  std::string descr;
  std::vector<uint64_t> shape;
  std::string data;
};

Npy read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() >= 10);
  REQUIRE(bytes.compare(0, 6, "\x93NUMPY") == 0);
  REQUIRE(bytes[6] == 1);
  const size_t header_len = static_cast<unsigned char>(bytes[8]) |
                            (static_cast<size_t>(static_cast<unsigned char>(bytes[9])) << 8);
  REQUIRE((10 + header_len) % 64 == 0);  // the data starts aligned
  const std::string header = bytes.substr(10, header_len);
  REQUIRE(header.back() == '\n');
  REQUIRE(contains(header, "'fortran_order': False"));
  Npy npy;
  const size_t d = header.find("'descr': '") + 10;
  npy.descr = header.substr(d, header.find('\'', d) - d);
  const size_t s = header.find("'shape': (") + 10;
  const std::string shape = header.substr(s, header.find(')', s) - s);
  for (size_t at = 0; at < shape.size();) {
    const size_t comma = shape.find(',', at);
    const std::string part = shape.substr(at, comma == std::string::npos ? comma : comma - at);
    if (part.find_first_not_of(' ') != std::string::npos) npy.shape.push_back(std::stoull(part));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  npy.data = bytes.substr(10 + header_len);
  return npy;
}

// Every row of table at version of dir, as restore reads it: key -> values, then state.
std::map<int64_t, std::vector<float>> rows_of(const std::string& dir, uint64_t version,
                                              const std::string& table) {
  embstore::io::CheckpointDir checkpoints;
  const size_t i =
      embstore::checkpoint::choose_version(dir, version, std::nullopt, &checkpoints, nullptr);
  const embstore::checkpoint::RestorePlan plan = embstore::checkpoint::plan_version(checkpoints, i);
  std::map<int64_t, std::vector<float>> rows;
  for (const auto& t : plan.tables) {
    if (t.entry->name != table) continue;
    embstore::io::ChainReadOptions options;
    options.unique_keys = true;
    embstore::checkpoint::read_table(plan, t, options,
                                     [&](const embstore::io::RowBlock& b, std::string*) {
                                       for (uint32_t r = 0; r < b.rows; ++r) {
                                         std::vector<float>& row = rows[b.keys[r]];
                                         row.assign(b.values + size_t{r} * b.dim,
                                                    b.values + size_t{r + 1} * b.dim);
                                         if (b.state_dim > 0) {
                                           row.insert(row.end(), b.state + size_t{r} * b.state_dim,
                                                      b.state + size_t{r + 1} * b.state_dim);
                                         }
                                       }
                                       return 0;
                                     },
                                     {});
  }
  return rows;
}

// Exports table and checks the three files against rows_of.
void export_and_check(const std::string& dir, uint64_t version, const std::string& table,
                      const std::string& prefix) {
  const Result r = run_tool(
      {"export", dir, "--version", std::to_string(version), "--table", table, "--out", prefix});
  INFO(describe(r));
  REQUIRE(r.status == 0);
  const std::map<int64_t, std::vector<float>> expected = rows_of(dir, version, table);
  REQUIRE_FALSE(expected.empty());
  const Npy keys = read_npy(prefix + ".keys.npy");
  const Npy values = read_npy(prefix + ".values.npy");
  CHECK(keys.descr == "<i8");
  CHECK(values.descr == "<f4");
  REQUIRE(keys.shape == std::vector<uint64_t>{expected.size()});
  REQUIRE(values.shape.size() == 2);
  REQUIRE(values.shape[0] == expected.size());
  const uint64_t dim = values.shape[1];
  const size_t width = expected.begin()->second.size();
  const bool has_state = width > dim;
  Npy state;
  if (has_state) {
    state = read_npy(prefix + ".state.npy");
    CHECK(state.descr == "<f4");
    REQUIRE(state.shape == std::vector<uint64_t>{expected.size(), width - dim});
  } else {
    CHECK_FALSE(std::filesystem::exists(prefix + ".state.npy"));
  }
  REQUIRE(keys.data.size() == expected.size() * 8);
  REQUIRE(values.data.size() == expected.size() * dim * 4);
  std::set<int64_t> seen;
  uint64_t mismatched = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    int64_t key;
    std::memcpy(&key, keys.data.data() + i * 8, 8);
    seen.insert(key);
    const auto it = expected.find(key);
    if (it == expected.end()) {
      ++mismatched;
      continue;
    }
    mismatched += std::memcmp(values.data.data() + i * dim * 4, it->second.data(), dim * 4) != 0;
    if (has_state) {
      mismatched += std::memcmp(state.data.data() + i * (width - dim) * 4, it->second.data() + dim,
                                (width - dim) * 4) != 0;
    }
  }
  CHECK(seen.size() == expected.size());  // every key once
  CHECK(mismatched == 0);
  // numpy reads them too, where it is installed (CI's machine may lack it: then only the
  // parser above has read them).
  if (std::system("python3 -c 'import numpy' > /dev/null 2>&1") == 0) {
    const std::string script =
        "python3 -c \"import numpy as np; k = np.load('" + prefix + ".keys.npy'); v = np.load('" +
        prefix +
        ".values.npy'); assert k.shape[0] == v.shape[0] == " + std::to_string(expected.size()) +
        "\"";
    CHECK(std::system(script.c_str()) == 0);
  }
}

}  // namespace

TEST_CASE("export writes a chain's table as .npy files: keys, values and optimizer state") {
  Checkpoints c(Checkpoints::kChain);
  for (const char* table : {"users", "items", "bias"}) {  // Adagrad, Adam, SGD (no state)
    INFO(table);
    export_and_check(c.dir(), 20, table, c.dir() + "/../export-" + table);
  }
}

TEST_CASE("export of a checkpoint of three ranks holds every rank's rows") {
  TempDir tmp;
  const std::string dir = tmp.path() + "/ckpt";
  for (const auto& o : embstore_test::threads::on_ranks(3, [&](embstore_store_config_t c, int r) {
         return embstore_test::collective::write(c, r, 3, dir);
       })) {
    INFO(o.first);
    REQUIRE(o.failures == 0);
  }
  export_and_check(dir, 6, "users", tmp.path() + "/users");
}

TEST_CASE("export of a table the version lacks fails and writes nothing") {
  Checkpoints c;
  const std::string prefix = c.dir() + "/../none";
  const Result r =
      run_tool({"export", c.dir(), "--version", "10", "--table", "nope", "--out", prefix});
  INFO(describe(r));
  CHECK(r.status == 1);
  CHECK(contains(r.err, "has no table 'nope'"));
  CHECK_FALSE(std::filesystem::exists(prefix + ".keys.npy"));
  CHECK_FALSE(std::filesystem::exists(prefix + ".keys.npy.tmp"));
}
