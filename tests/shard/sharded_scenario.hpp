// Sharded training through the public C API, checked against one process: run by every rank of
// a store created with a communicator (threads with callbacks in sharded_callbacks_test.cpp, MPI
// ranks in mpi_sharded_test.cpp). Each rank also replays, in a store of its own, what one process
// does on the ranks' batches concatenated in rank order (every batch is a function of rank and
// step), and compares bit for bit: the rows its sharded lookups return, and at the end every row
// it owns, values and (through more training) optimizer state. Not Catch2: ranks may be threads,
// so failures are counted and described, and the caller checks them.
#pragma once

#include <embstore/embstore.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace embstore_test::sharded {

struct Outcome {
  long failures = 0;
  std::string first;  // the first failure, described
  void fail(const std::string& what) {
    if (failures++ == 0) first = what;
  }
  void expect(bool ok, const std::string& what) {
    if (!ok) fail(what);
  }
  void expect_status(embstore_status_t got, embstore_status_t want, const std::string& what) {
    if (got != want) {
      fail(what + ": " + embstore_status_name(got) + " (want " + embstore_status_name(want) +
           "): " + embstore_last_error());
    }
  }
};

inline constexpr int kSteps = 6;
inline constexpr size_t kBatch = 400;

struct TableShape {
  const char* name;
  uint32_t dim;
  embstore_optimizer_t optimizer;
  uint32_t admit_after;
  float weight_decay;
  uint64_t admit_bloom_bytes;
};
inline constexpr TableShape kTables[] = {
    {"items", 8, EMBSTORE_OPT_SGD, 1, 0.0f, 0},
    {"users", 5, EMBSTORE_OPT_ADAM, 1, 0.01f, 0},
    {"ads", 4, EMBSTORE_OPT_ADAGRAD, 3, 0.0f, 0},  // admission: occurrences count one by one
    // Counted in a Bloom filter: a rank's own filter (its keys only) and one process's (every
    // key) agree for these few keys (a false positive among ~700 keys in 64 Ki counters is
    // about 1e-5 per key); a checkpoint's filters of W ranks add up to one process's.
    {"clicks", 3, EMBSTORE_OPT_ROWWISE_ADAGRAD, 2, 0.0f, 1 << 16},
};

inline embstore_table_config_t config_of(const TableShape& shape) {
  embstore_table_config_t c;
  embstore_table_config_init(&c);
  c.name = shape.name;
  c.dim = shape.dim;
  c.optimizer = shape.optimizer;
  c.admit_after = shape.admit_after;
  c.weight_decay = shape.weight_decay;
  c.admit_bloom_bytes = shape.admit_bloom_bytes;
  c.learning_rate = 0.05f;
  c.seed = 99;
  return c;
}

// Rank r's keys at a step (duplicates, negative keys, some shared with other ranks).
inline std::vector<int64_t> batch_of(int rank, int step, size_t table) {
  std::mt19937_64 rng(1000003ull * static_cast<uint64_t>(rank) + 7919ull * step + table);
  std::vector<int64_t> keys(kBatch);
  for (int64_t& k : keys) k = static_cast<int64_t>(rng() % 700) - 300;
  return keys;
}

// Rank r's gradients at a step, from the rows its lookup returned.
inline std::vector<float> grads_of(int rank, int step, const std::vector<float>& rows) {
  std::mt19937 rng(31u * static_cast<uint32_t>(rank) + 17u * static_cast<uint32_t>(step));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> g(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) g[i] = rows[i] * 0.25f + u(rng);
  return g;
}

inline bool same_bits(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

// Runs the scenario on this rank of `world` with `config` (communicator, rank and world_size set
// by the caller; host backend). Every rank must call it.
inline Outcome run(embstore_store_config_t config, int rank, int world) {
  Outcome out;
  const std::string at = "rank " + std::to_string(rank) + " of " + std::to_string(world) + ": ";
  embstore_store_t* store = nullptr;
  out.expect_status(embstore_store_create(&config, &store), EMBSTORE_OK, at + "store_create");
  if (store == nullptr) return out;
  embstore_store_config_t one;
  embstore_store_config_init(&one);
  one.backend = EMBSTORE_BACKEND_HOST;
  one.host_threads = 1;
  embstore_store_t* reference = nullptr;
  out.expect_status(embstore_store_create(&one, &reference), EMBSTORE_OK, at + "reference");

  const size_t n_tables = sizeof(kTables) / sizeof(kTables[0]);
  std::vector<embstore_table_t*> sharded(n_tables), replay(n_tables);
  for (size_t t = 0; t < n_tables; ++t) {
    const embstore_table_config_t c = config_of(kTables[t]);
    out.expect_status(embstore_table_create(store, &c, &sharded[t]), EMBSTORE_OK, at + "table");
    out.expect_status(embstore_table_create(reference, &c, &replay[t]), EMBSTORE_OK,
                      at + "reference table");
  }
  if (out.failures > 0) {
    embstore_store_destroy(reference);
    embstore_store_destroy(store);
    return out;
  }

  std::set<int64_t> seen;
  for (int step = 1; step <= kSteps; ++step) {
    embstore_step(store, static_cast<uint64_t>(step));
    embstore_step(reference, static_cast<uint64_t>(step));
    for (size_t t = 0; t < n_tables; ++t) {
      const uint32_t dim = kTables[t].dim;
      const std::string where = at + kTables[t].name + " step " + std::to_string(step);
      // One process: every rank's batch, concatenated in rank order.
      std::vector<int64_t> all_keys;
      std::vector<size_t> begin(world + 1, 0);
      for (int q = 0; q < world; ++q) {
        const std::vector<int64_t> k = batch_of(q, step, t);
        all_keys.insert(all_keys.end(), k.begin(), k.end());
        begin[q + 1] = all_keys.size();
      }
      seen.insert(all_keys.begin(), all_keys.end());
      std::vector<float> all_rows(all_keys.size() * dim);
      out.expect_status(embstore_lookup(replay[t], all_keys.data(), all_keys.size(),
                                        all_rows.data(), EMBSTORE_LOOKUP_INSERT, nullptr),
                        EMBSTORE_OK, where + ": reference lookup");

      const std::vector<int64_t> keys = batch_of(rank, step, t);
      std::vector<float> rows(keys.size() * dim);
      out.expect_status(embstore_sharded_lookup(sharded[t], keys.data(), keys.size(), rows.data(),
                                                EMBSTORE_LOOKUP_INSERT, nullptr),
                        EMBSTORE_OK, where + ": sharded_lookup");
      out.expect(same_bits(rows.data(), all_rows.data() + begin[rank] * dim, rows.size()),
                 where + ": sharded_lookup rows differ from one process's");

      std::vector<float> all_grads;
      for (int q = 0; q < world; ++q) {
        const std::vector<float> seg(all_rows.begin() + begin[q] * dim,
                                     all_rows.begin() + begin[q + 1] * dim);
        const std::vector<float> g = grads_of(q, step, seg);
        all_grads.insert(all_grads.end(), g.begin(), g.end());
      }
      out.expect_status(embstore_apply_gradients(replay[t], all_keys.data(), all_grads.data(),
                                                 all_keys.size(), nullptr),
                        EMBSTORE_OK, where + ": reference gradients");
      const std::vector<float> grads = grads_of(rank, step, rows);
      out.expect_status(embstore_sharded_apply_gradients(sharded[t], keys.data(), grads.data(),
                                                         keys.size(), nullptr),
                        EMBSTORE_OK, where + ": sharded_apply_gradients");
    }
  }

  // Every row this rank owns equals one process's; its shard holds exactly those rows.
  std::vector<int64_t> owned_items;  // table 0's, for the failed calls below
  std::vector<float> items_rows;
  uint64_t items_count = 0;
  for (size_t t = 0; t < n_tables; ++t) {
    const uint32_t dim = kTables[t].dim;
    std::vector<int64_t> owned;
    for (int64_t k : seen) {
      if (embstore_shard_of(k, static_cast<uint32_t>(world)) == static_cast<uint32_t>(rank)) {
        owned.push_back(k);
      }
    }
    std::vector<float> mine(owned.size() * dim), theirs(owned.size() * dim);
    out.expect_status(
        embstore_lookup(sharded[t], owned.data(), owned.size(), mine.data(), 0, nullptr),
        EMBSTORE_OK, at + "lookup of owned keys");
    out.expect_status(
        embstore_lookup(replay[t], owned.data(), owned.size(), theirs.data(), 0, nullptr),
        EMBSTORE_OK, at + "reference lookup of owned keys");
    out.expect(same_bits(mine.data(), theirs.data(), mine.size()),
               at + kTables[t].name + ": owned rows differ from one process's");
    embstore_table_stats_t s{}, r{};
    s.struct_size = r.struct_size = sizeof(s);
    embstore_table_stats(sharded[t], &s);
    embstore_table_stats(replay[t], &r);
    uint64_t owned_rows = 0;  // the reference's rows among the owned keys
    for (size_t i = 0; i < owned.size(); ++i) {
      bool zero = true;
      for (uint32_t d = 0; d < dim; ++d) zero = zero && theirs[i * dim + d] == 0.0f;
      owned_rows += !zero;
    }
    out.expect(s.rows == owned_rows, at + kTables[t].name + ": shard has " +
                                         std::to_string(s.rows) + " rows, one process " +
                                         std::to_string(owned_rows) + " of its keys");
    if (t == 0) {
      owned_items = owned;
      items_rows = mine;
      items_count = s.rows;
    }
  }

  if (world > 1) {
    // A key of another rank: the plain calls refuse it and change nothing.
    int64_t foreign = 0;
    while (embstore_shard_of(foreign, static_cast<uint32_t>(world)) ==
           static_cast<uint32_t>(rank)) {
      ++foreign;
    }
    float row[8];
    out.expect_status(
        embstore_lookup(sharded[0], &foreign, 1, row, EMBSTORE_LOOKUP_INSERT, nullptr),
        EMBSTORE_INVALID_ARGUMENT, at + "plain lookup of a foreign key");
    const float g[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    out.expect_status(embstore_apply_gradients(sharded[0], &foreign, g, 1, nullptr),
                      EMBSTORE_INVALID_ARGUMENT, at + "plain gradients of a foreign key");

    // One rank's bad arguments fail the call on every rank, and nobody waits forever.
    const std::vector<int64_t> keys = batch_of(rank, 1, 0);  // keys with rows
    std::vector<int64_t> fresh = keys;                       // keys without
    for (int64_t& k : fresh) k += 100000;
    std::vector<float> rows(keys.size() * 8, 0.5f);
    const uint32_t flags = rank == world - 1 ? 0x80u : EMBSTORE_LOOKUP_INSERT;
    out.expect_status(embstore_sharded_lookup(sharded[0], fresh.data(), fresh.size(), rows.data(),
                                              flags, nullptr),
                      EMBSTORE_INVALID_ARGUMENT, at + "sharded_lookup with one rank's bad flags");
    const float* grads = rank == 0 ? nullptr : rows.data();
    out.expect_status(
        embstore_sharded_apply_gradients(sharded[0], keys.data(), grads, keys.size(), nullptr),
        EMBSTORE_INVALID_ARGUMENT, at + "sharded gradients with rank 0's NULL grads");
    // Both failed before any key moved: no row was inserted or updated anywhere.
    std::vector<float> after(items_rows.size());
    embstore_lookup(sharded[0], owned_items.data(), owned_items.size(), after.data(), 0, nullptr);
    out.expect(same_bits(after.data(), items_rows.data(), after.size()),
               at + "a failed sharded call changed rows");
    embstore_table_stats_t s{};
    s.struct_size = sizeof(s);
    embstore_table_stats(sharded[0], &s);
    out.expect(s.rows == items_count, at + "a failed sharded lookup inserted rows");
  }
  out.expect_status(embstore_store_destroy(reference), EMBSTORE_OK, at + "reference destroy");
  out.expect_status(embstore_store_destroy(store), EMBSTORE_OK, at + "store destroy");
  return out;
}

}  // namespace embstore_test::sharded
