// Two stores checkpointing into two directories at once, fulls and deltas: each directory
// restores its own versions, tables and optimizer state.
#include <catch2/catch.hpp>

#include "tests/checkpoint/checkpoint_fixtures.hpp"

using namespace embstore_test;
using namespace embstore_test::checkpoint;

namespace {

// One of the two stores of the two-directory test: its tables, its own key stream and steps.
struct TwinRun {
  std::string dir;
  uint64_t seed = 0;
  uint64_t first_step = 0;
  int64_t key_base = 0;
  std::vector<embstore_table_config_t> configs;  // names are string literals
};

// What a run's thread saw at one of its checkpoints, right after the capture.
struct TwinVersion {
  uint64_t version = 0;
  embstore_ckpt_kind_t kind = EMBSTORE_CKPT_FULL;
  uint32_t in_flight = 0;
  std::vector<std::vector<float>> values;  // per table, of twin_all_keys
  std::vector<uint64_t> rows;              // per table
};

// Rounds of 3 steps, a checkpoint (the first full, then deltas) and a 4th step while it is
// written (none after the last).
constexpr int kTwinRounds = 5;
constexpr size_t kTwinBatch = 512;

// Table i draws keys from [base + 100000 i, + twin_keys(local step)): new keys at every step.
int64_t twin_keys(uint64_t local_step) { return 2000 + 40 * static_cast<int64_t>(local_step); }

// Every key table i of run draws in its steps (and the 2 after), and a few it never draws.
std::vector<int64_t> twin_all_keys(const TwinRun& run, size_t i) {
  const int64_t n = twin_keys(4 * kTwinRounds) + 16;
  std::vector<int64_t> k(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    k[static_cast<size_t>(j)] = run.key_base + 100000 * static_cast<int64_t>(i) + j;
  }
  return k;
}

// The helpers' device copies assert on CUDA, and Catch's assertions are not thread-safe: the
// threads of a test take this around them there. On the host they assert nothing.
std::mutex g_helper_mutex;

std::unique_lock<std::mutex> helper_lock() {
  std::unique_lock<std::mutex> lock(g_helper_mutex, std::defer_lock);
  if (backend() != EMBSTORE_BACKEND_HOST) lock.lock();
  return lock;
}

// One training step of run, for threads: no assertion. Returns the error, or "".
std::string twin_step(const TwinRun& run, embstore_store_t* store,
                      const std::vector<embstore_table_t*>& tables, uint64_t step) {
  const uint64_t local = step - run.first_step;
  for (size_t i = 0; i < tables.size(); ++i) {
    std::mt19937_64 rng(run.seed * 1000003 + step * 7919 + i);
    const uint32_t dim = embstore_table_dim(tables[i]);
    std::vector<int64_t> k(kTwinBatch);
    for (auto& x : k) {
      x = run.key_base + 100000 * static_cast<int64_t>(i) +
          static_cast<int64_t>(rng() % static_cast<uint64_t>(twin_keys(local)));
    }
    std::vector<float> g(k.size() * dim);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& x : g) x = u(rng);
    std::vector<float> out;
    auto lock = helper_lock();
    if (lookup(tables[i], k, EMBSTORE_LOOKUP_INSERT, &out) != EMBSTORE_OK ||
        apply_gradients(tables[i], k, g) != EMBSTORE_OK) {
      return "step " + std::to_string(step) + ": " + embstore_last_error();
    }
  }
  if (embstore_step(store, step) != EMBSTORE_OK) {
    return "embstore_step " + std::to_string(step) + ": " + embstore_last_error();
  }
  return "";
}

}  // namespace

// Under ThreadSanitizer this test can report races inside liburing.h (io_uring_prep_rw,
// __io_uring_peek_cqe) between the two stores' workers. They are not races: liburing 2.3 maps
// its rings with raw syscalls that TSan does not see, so a ring of one store mapped where a
// closed ring of the other was looks like shared memory. Run it with a suppression
// (TSAN_OPTIONS=suppressions=FILE, FILE holding "race:liburing.h").
TEST_CASE("two stores checkpoint into two directories at once and each restores its own",
          "[checkpoint][incremental]") {
  TempDir da, db;
  // Different tables (one name in common, of another shape), seeds, keys and steps.
  std::vector<TwinRun> runs(2);
  runs[0].dir = da.path();
  runs[0].seed = 11;
  runs[0].first_step = 1;
  runs[0].key_base = -500000;
  runs[0].configs = {config_for("alpha", 8, EMBSTORE_OPT_ADAM),
                     config_for("emb", 4, EMBSTORE_OPT_ADAGRAD)};
  runs[1].dir = db.path();
  runs[1].seed = 29;
  runs[1].first_step = 1001;
  runs[1].key_base = 700000;
  runs[1].configs = {config_for("beta", 12, EMBSTORE_OPT_ROWWISE_ADAGRAD),
                     config_for("emb", 6, EMBSTORE_OPT_SGD)};
  for (auto& c : runs[1].configs) c.seed = 99;
  // Shallow writer queues: registering their buffers costs more than these small tables take
  // to write, and this test takes 14 checkpoints and 10 restores.
  auto twin_store = [] {
    embstore_store_config_t c;
    embstore_store_config_init(&c);
    c.io_queue_depth = 2;
    c.staging_bytes = size_t{16} << 20;
    return make_store(c);
  };
  StoreGuard sa(twin_store()), sb(twin_store());
  embstore_store_t* stores[2] = {sa, sb};
  std::vector<embstore_table_t*> tables[2];
  for (size_t r = 0; r < 2; ++r) {
    for (const auto& c : runs[r].configs) tables[r].push_back(make_table(stores[r], c));
    no_rebaseline(stores[r]);
  }

  std::vector<TwinVersion> recorded[2];
  std::mutex errors_mutex;
  std::vector<std::string> errors;
  // The first checkpoints of both stores are held at their first write until both are in
  // flight: the two pipelines run at the same time. (The write hook is global to the process
  // and called under a lock, so one write waits at the gate and the other behind it.)
  std::mutex gate_mutex;
  std::condition_variable gate_cv;
  bool gate_open = false;
  int in_flight = 0;
  bool both_in_flight = false;
  {
    FaultGuard gate([&](uint64_t, size_t) {
      std::unique_lock lock(gate_mutex);
      gate_cv.wait_for(lock, std::chrono::seconds(20), [&] { return gate_open; });
      return 0;
    });
    std::barrier round_start(2);
    auto body = [&](size_t r) {
      const TwinRun& run = runs[r];
      embstore_store_t* store = stores[r];
      for (int round = 0; round < kTwinRounds; ++round) {
        round_start.arrive_and_wait();
        const uint64_t base = run.first_step + 4 * static_cast<uint64_t>(round);
        std::string e;
        for (uint64_t s = base; s < base + 3 && e.empty(); ++s) {
          e = twin_step(run, store, tables[r], s);
        }
        TwinVersion rec;
        if (e.empty() &&
            embstore_checkpoint(store, run.dir.c_str(),
                                round == 0 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL,
                                &rec.version) != EMBSTORE_OK) {
          e = std::string("checkpoint: ") + embstore_last_error();
        }
        if (e.empty()) {
          embstore_checkpoint_info_t info;
          std::memset(&info, 0, sizeof(info));
          info.struct_size = sizeof(info);
          if (embstore_checkpoint_info(store, rec.version, &info) != EMBSTORE_OK) e = "info";
          rec.kind = info.kind;
          rec.in_flight = info.in_flight;
          for (size_t i = 0; i < tables[r].size() && e.empty(); ++i) {
            embstore_table_stats_t st;
            std::memset(&st, 0, sizeof(st));
            st.struct_size = sizeof(st);
            std::vector<float> values;
            auto lock = helper_lock();
            if (lookup(tables[r][i], twin_all_keys(run, i), 0, &values) != EMBSTORE_OK ||
                embstore_table_stats(tables[r][i], &st) != EMBSTORE_OK) {
              e = std::string("lookup: ") + embstore_last_error();
            }
            rec.values.push_back(std::move(values));
            rec.rows.push_back(st.rows);
          }
        }
        if (round == 0) {
          {
            std::lock_guard lock(gate_mutex);
            ++in_flight;
          }
          gate_cv.notify_all();
        }
        // Training goes on while the checkpoint is written.
        if (e.empty() && round + 1 < kTwinRounds) e = twin_step(run, store, tables[r], base + 3);
        if (e.empty() && embstore_checkpoint_wait(store, rec.version) != EMBSTORE_OK) {
          e = "wait " + std::to_string(rec.version) + ": " + embstore_last_error();
        }
        if (!e.empty()) {
          {
            std::lock_guard lock(errors_mutex);
            errors.push_back("store " + std::to_string(r) + ": " + e);
          }
          round_start.arrive_and_drop();
          return;
        }
        recorded[r].push_back(std::move(rec));
      }
    };
    std::thread ta(body, size_t{0}), tb(body, size_t{1});
    {
      std::unique_lock lock(gate_mutex);
      both_in_flight =
          gate_cv.wait_for(lock, std::chrono::seconds(20), [&] { return in_flight == 2; });
      gate_open = true;
    }
    gate_cv.notify_all();
    ta.join();
    tb.join();
  }
  for (const auto& e : errors) UNSCOPED_INFO(e);
  REQUIRE(errors.empty());
  REQUIRE(both_in_flight);

  for (size_t r = 0; r < 2; ++r) {
    const TwinRun& run = runs[r];
    const TwinRun& other = runs[1 - r];
    const std::vector<TwinVersion>& recs = recorded[r];
    INFO("store " << r << ", directory " << run.dir);
    REQUIRE(recs.size() == static_cast<size_t>(kTwinRounds));
    REQUIRE(recs[0].in_flight == 1);  // while the other store's was too
    embstore_checkpoint_stats_t cs;
    cs.struct_size = sizeof(cs);
    ok(embstore_checkpoint_stats(stores[r], &cs));
    REQUIRE(cs.committed == static_cast<uint64_t>(kTwinRounds));
    REQUIRE(cs.deltas_committed == static_cast<uint64_t>(kTwinRounds - 1));
    REQUIRE(cs.failed == 0);

    // The directory holds this store's versions, each with this store's tables, and nothing
    // else: no version, table or leftover of the other store.
    std::vector<embstore::io::VersionDir> versions;
    REQUIRE(embstore::io::list_versions(run.dir, &versions) == 0);
    REQUIRE(versions.size() == recs.size());
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(run.dir)) {
      if (e.path().filename() != embstore::io::kLockFileName) ++entries;  // this store's lock
    }
    REQUIRE(entries == versions.size());
    const std::vector<std::string> want_names = {"MANIFEST.json", "tables"};
    std::vector<std::string> want_tables;
    for (const auto& c : run.configs) want_tables.push_back(c.name);
    std::sort(want_tables.begin(), want_tables.end());
    for (size_t i = 0; i < versions.size(); ++i) {
      REQUIRE(recs[i].version == run.first_step + 4 * i + 2);
      REQUIRE(versions[i].version == recs[i].version);
      REQUIRE(versions[i].full == (i == 0));
      REQUIRE(recs[i].kind == (i == 0 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL));
      std::vector<std::string> names;
      for (const auto& e : fs::directory_iterator(run.dir + "/" + versions[i].name)) {
        names.push_back(e.path().filename().string());
      }
      std::sort(names.begin(), names.end());
      REQUIRE(names == want_names);
      names.clear();
      for (const auto& e : fs::directory_iterator(run.dir + "/" + versions[i].name + "/tables")) {
        names.push_back(e.path().filename().string());
      }
      std::sort(names.begin(), names.end());
      REQUIRE(names == want_tables);
    }

    // Each version restores into a fresh store as this store had it.
    for (size_t k = 0; k < recs.size(); ++k) {
      const TwinVersion& rec = recs[k];
      INFO("version " << rec.version);
      StoreGuard fresh(twin_store());
      REQUIRE(restore_ok(fresh, run.dir, rec.version) == rec.version);
      std::vector<embstore_table_t*> fresh_tables;
      for (size_t i = 0; i < run.configs.size(); ++i) {
        INFO("table " << run.configs[i].name);
        embstore_table_t* t = get_table(fresh, run.configs[i].name);
        fresh_tables.push_back(t);
        REQUIRE(embstore_table_dim(t) == run.configs[i].dim);
        REQUIRE(stats(t).rows == rec.rows[i]);
        REQUIRE(same_bits(lookup_ok(t, twin_all_keys(run, i), 0), rec.values[i]));
        if (k > 0) REQUIRE_FALSE(same_bits(rec.values[i], recs[k - 1].values[i]));
      }
      embstore_table_t* absent = nullptr;
      require_status(embstore_table_get(fresh, other.configs[0].name, &absent), EMBSTORE_NOT_FOUND);
      if (k + 1 < recs.size()) {
        // The optimizer state came back too: the store's steps from here reach its next
        // version exactly.
        const TwinVersion& next = recs[k + 1];
        for (uint64_t s = rec.version + 1; s <= next.version; ++s) {
          REQUIRE(twin_step(run, fresh, fresh_tables, s).empty());
        }
        for (size_t i = 0; i < run.configs.size(); ++i) {
          REQUIRE(stats(fresh_tables[i]).rows == next.rows[i]);
          REQUIRE(same_bits(lookup_ok(fresh_tables[i], twin_all_keys(run, i), 0), next.values[i]));
        }
        continue;
      }
      // The latest is where the store stopped: full checkpoints of both hold the same rows,
      // values and optimizer state, and training goes on identically.
      TempDir of_fresh, of_store;
      REQUIRE(checkpoint_ok(fresh, of_fresh.path()) == rec.version);
      REQUIRE(checkpoint_ok(stores[r], of_store.path()) == rec.version);
      for (const auto& c : run.configs) {
        const auto rows = read_rows(table_file(of_fresh.path(), rec.version, c.name));
        REQUIRE(rows.size() == stats(get_table(fresh, c.name)).rows);
        REQUIRE(rows == read_rows(table_file(of_store.path(), rec.version, c.name)));
      }
      for (uint64_t s = rec.version + 1; s <= rec.version + 2; ++s) {
        REQUIRE(twin_step(run, fresh, fresh_tables, s).empty());
        REQUIRE(twin_step(run, stores[r], tables[r], s).empty());
      }
      for (size_t i = 0; i < run.configs.size(); ++i) {
        const std::vector<int64_t> all = twin_all_keys(run, i);
        const std::vector<float> after = lookup_ok(fresh_tables[i], all, 0);
        REQUIRE_FALSE(same_bits(after, rec.values[i]));
        REQUIRE(same_bits(after, lookup_ok(tables[r][i], all, 0)));
      }
    }
  }
}
