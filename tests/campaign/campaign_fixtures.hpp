// What the fault campaigns share: a deterministic training run on the host backend (three
// tables: Adam with admission, Adagrad with eviction so that deltas carry tombstones, SGD),
// snapshots of a store's tables to compare bit for bit, restores into fresh stores, the
// campaign's scale and seed from the environment, and embstore-ckpt run as a program.
//
// Everything here runs without Catch too (in forked children): failures are return values.
#pragma once

#include <embstore/embstore.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "tests/io/io_fixtures.hpp"

namespace embstore_campaign {

// EMBSTORE_CAMPAIGN_SCALE (default 1) multiplies the trials; EMBSTORE_CAMPAIGN_SEED (default
// fixed) varies them.
inline double scale() {
  const char* s = std::getenv("EMBSTORE_CAMPAIGN_SCALE");
  const double v = s != nullptr ? std::atof(s) : 1.0;
  return v > 0 ? v : 1.0;
}
inline uint64_t seed() {
  const char* s = std::getenv("EMBSTORE_CAMPAIGN_SEED");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 20261123;
}

struct TableSetup {
  const char* name;
  uint32_t dim;
  embstore_optimizer_t optimizer;
  int64_t keys;  // keys in [0, keys)
  uint32_t admit_after;
  uint64_t evict_idle_steps;
};

inline constexpr TableSetup kTables[] = {
    {"users", 8, EMBSTORE_OPT_ADAM, 600, 2, 0},
    {"items", 4, EMBSTORE_OPT_ADAGRAD, 400, 1, 3},
    {"bias", 1, EMBSTORE_OPT_SGD, 100, 1, 0},
};

inline embstore_store_t* host_store() {
  embstore_store_config_t c;
  embstore_store_config_init(&c);
  c.backend = EMBSTORE_BACKEND_HOST;
  c.host_threads = 1;
  c.staging_bytes = size_t{4} << 20;
  embstore_store_t* s = nullptr;
  return embstore_store_create(&c, &s) == EMBSTORE_OK ? s : nullptr;
}

inline bool create_tables(embstore_store_t* s) {
  for (const TableSetup& t : kTables) {
    embstore_table_config_t c;
    embstore_table_config_init(&c);
    c.name = t.name;
    c.dim = t.dim;
    c.optimizer = t.optimizer;
    c.seed = 99;
    c.init_a = -0.5f;
    c.init_b = 0.5f;
    c.admit_after = t.admit_after;
    c.evict_idle_steps = t.evict_idle_steps;
    embstore_table_t* table = nullptr;
    if (embstore_table_create(s, &c, &table) != EMBSTORE_OK) return false;
  }
  return true;
}

// One training step: embstore_step, then per table a batch drawn from (step, table): keys from
// a window that moves with the step (so rows go idle and are evicted), gradients in [-1, 1).
inline bool train_step(embstore_store_t* s, uint64_t step) {
  if (embstore_step(s, step) != EMBSTORE_OK) return false;
  for (const TableSetup& t : kTables) {
    embstore_table_t* table = nullptr;
    if (embstore_table_get(s, t.name, &table) != EMBSTORE_OK) return false;
    std::mt19937_64 rng(step * 1000003 + t.dim);
    std::vector<int64_t> keys(96);
    const int64_t window = t.keys / 3;
    const int64_t base = static_cast<int64_t>(step * 7) % (t.keys - window);
    for (int64_t& k : keys) k = base + static_cast<int64_t>(rng() % static_cast<uint64_t>(window));
    std::vector<float> out(keys.size() * t.dim), grads(keys.size() * t.dim);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (float& g : grads) g = u(rng);
    if (embstore_lookup(table, keys.data(), keys.size(), out.data(), EMBSTORE_LOOKUP_INSERT,
                        nullptr) != EMBSTORE_OK ||
        embstore_apply_gradients(table, keys.data(), grads.data(), keys.size(), nullptr) !=
            EMBSTORE_OK) {
      return false;
    }
  }
  return true;
}

// What a store holds, to compare bit for bit: every table's values over its key range (keys
// without a row read as zeros), rows and pending admissions; and the attachment "note".
struct Snapshot {
  std::map<std::string, std::vector<float>> values;
  std::map<std::string, std::pair<uint64_t, uint64_t>> counts;  // rows, pending
  std::string note;
  bool operator==(const Snapshot& o) const {
    if (counts != o.counts || note != o.note || values.size() != o.values.size()) return false;
    for (const auto& [name, v] : values) {
      auto it = o.values.find(name);
      if (it == o.values.end() || it->second.size() != v.size() ||
          std::memcmp(v.data(), it->second.data(), v.size() * sizeof(float)) != 0) {
        return false;
      }
    }
    return true;
  }
};

// false when a call fails.
inline bool snapshot(embstore_store_t* s, Snapshot* out, bool restored) {
  for (const TableSetup& t : kTables) {
    embstore_table_t* table = nullptr;
    if (embstore_table_get(s, t.name, &table) != EMBSTORE_OK) return false;
    std::vector<int64_t> keys(static_cast<size_t>(t.keys));
    for (int64_t k = 0; k < t.keys; ++k) keys[static_cast<size_t>(k)] = k;
    std::vector<float>& v = out->values[t.name];
    v.resize(keys.size() * t.dim);
    if (embstore_lookup(table, keys.data(), keys.size(), v.data(), 0, nullptr) != EMBSTORE_OK) {
      return false;
    }
    embstore_table_stats_t st;
    st.struct_size = sizeof st;
    if (embstore_table_stats(table, &st) != EMBSTORE_OK) return false;
    out->counts[t.name] = {st.rows, st.pending_admission};
  }
  if (restored) {
    char buf[256];
    size_t bytes = 0;
    if (embstore_restore_attachment(s, "note", buf, sizeof buf, &bytes) == EMBSTORE_OK) {
      out->note.assign(buf, bytes);
    }
  }
  return true;
}

// Restores version of dir into a fresh host store: its status, its last_error, and the
// snapshot when it succeeded.
struct Restored {
  embstore_status_t status = EMBSTORE_INTERNAL;
  std::string message;
  uint64_t version = 0;
  Snapshot snap;
};

inline Restored restore(const std::string& dir, uint64_t version) {
  Restored r;
  embstore_store_t* s = host_store();
  if (s == nullptr) return r;
  r.status = embstore_restore(s, dir.c_str(), version, &r.version);
  if (r.status != EMBSTORE_OK) {
    r.message = embstore_last_error();
  } else if (!snapshot(s, &r.snap, true)) {
    r.status = EMBSTORE_INTERNAL;
    r.message = "snapshot of the restored store failed";
  }
  embstore_store_destroy(s);
  return r;
}

// Runs program with args; its exit status (-1 when killed), stdout and stderr.
struct Run {
  int status = -1;
  std::string out, err;
};

inline std::string slurp(const std::string& path) {
  std::string text;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return text;
}

// Starts program with args, stdout and stderr into files under scratch; returns its pid.
inline pid_t spawn(const std::string& program, const std::vector<std::string>& args,
                   const std::string& scratch) {
  std::vector<std::string> argv_s = {program};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const std::string out = scratch + "/stdout", err = scratch + "/stderr";
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  embstore_test::die_with_parent(parent);
  std::vector<char*> argv;
  for (std::string& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  const int o = ::open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int e = ::open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (o < 0 || e < 0 || ::dup2(o, 1) < 0 || ::dup2(e, 2) < 0) ::_exit(126);
  ::execv(argv[0], argv.data());
  ::_exit(127);
}

inline Run finish(pid_t pid, const std::string& scratch) {
  Run r;
  int status = 0;
  if (::waitpid(pid, &status, 0) == pid && WIFEXITED(status)) r.status = WEXITSTATUS(status);
  r.out = slurp(scratch + "/stdout");
  r.err = slurp(scratch + "/stderr");
  return r;
}

inline Run run(const std::string& program, const std::vector<std::string>& args,
               const std::string& scratch) {
  return finish(spawn(program, args, scratch), scratch);
}

}  // namespace embstore_campaign
