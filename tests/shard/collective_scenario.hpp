// Collective checkpoints and resharding restores through the public C API, checked against one
// process (sharded_scenario.hpp's tables and batches). Ranks are threads with callbacks
// (sharded_callbacks_test.cpp) or MPI ranks (mpi_checkpoint_test.cpp).
//
//   write    W ranks train sharded for kSteps steps and checkpoint collectively: full at step 2,
//            incremental at 4 and 6 (each rank attaches its own bytes to each)
//   restore  W' ranks (or one store without a communicator) restore version 2, 4 or 6 of the
//            W ranks' directory; every rank compares every row it owns, bit for bit, with one
//            process that replayed the W ranks' batches up to that version, then all train one
//            more step on their own batches and compare again (optimizer state and admission
//            counts then show), and read their rank's attachment
//   warm_start
//            W' ranks (or one store) that trained a step of their own warm-start from three
//            versions of the W ranks' directory (overlapping regexes, one source values only),
//            and compare with one process that did the same, before and after one more step
#pragma once

#include <embstore/embstore.h>

#include <string>
#include <vector>

#include "sharded_scenario.hpp"

namespace embstore_test::collective {

using sharded::kTables;
using sharded::Outcome;

inline constexpr size_t kTableCount = sizeof(kTables) / sizeof(kTables[0]);
inline constexpr uint64_t kVersions[] = {2, 4, 6};

inline std::vector<embstore_table_t*> create_tables(embstore_store_t* store, Outcome& out,
                                                    const std::string& at) {
  std::vector<embstore_table_t*> tables(kTableCount, nullptr);
  for (size_t t = 0; t < kTableCount; ++t) {
    const embstore_table_config_t c = sharded::config_of(kTables[t]);
    out.expect_status(embstore_table_create(store, &c, &tables[t]), EMBSTORE_OK, at + "table");
  }
  return tables;
}

// One training step of `world` ranks' batches: through the sharded calls on this rank, or (one
// process, tables of a store without a communicator) on the batches concatenated.
inline void train_step(const std::vector<embstore_table_t*>& tables, int rank, int world,
                       bool sharded_calls, int step, Outcome& out, const std::string& at) {
  for (size_t t = 0; t < kTableCount; ++t) {
    const uint32_t dim = kTables[t].dim;
    std::vector<int64_t> keys;
    std::vector<size_t> begin{0};
    for (int q = 0; q < world; ++q) {
      if (sharded_calls && q != rank) continue;
      const std::vector<int64_t> k = sharded::batch_of(q, step, t);
      keys.insert(keys.end(), k.begin(), k.end());
      begin.push_back(keys.size());
    }
    std::vector<float> rows(keys.size() * dim);
    auto lookup = sharded_calls ? embstore_sharded_lookup : embstore_lookup;
    out.expect_status(
        lookup(tables[t], keys.data(), keys.size(), rows.data(), EMBSTORE_LOOKUP_INSERT, nullptr),
        EMBSTORE_OK, at + "lookup at step " + std::to_string(step));
    std::vector<float> grads;
    for (size_t s = 0; s + 1 < begin.size(); ++s) {
      const int q = sharded_calls ? rank : static_cast<int>(s);
      const std::vector<float> seg(rows.begin() + begin[s] * dim,
                                   rows.begin() + begin[s + 1] * dim);
      const std::vector<float> g = sharded::grads_of(q, step, seg);
      grads.insert(grads.end(), g.begin(), g.end());
    }
    auto apply = sharded_calls ? embstore_sharded_apply_gradients : embstore_apply_gradients;
    out.expect_status(apply(tables[t], keys.data(), grads.data(), keys.size(), nullptr),
                      EMBSTORE_OK, at + "gradients at step " + std::to_string(step));
  }
}

inline std::string attachment_of(int rank, uint64_t version) {
  return "rank " + std::to_string(rank) + " at " + std::to_string(version);
}

// W ranks (config has the communicator) train and checkpoint into dir. Every rank calls it.
// Ranks below attaching_ranks attach their note to each checkpoint.
// serving_deltas_rank: the rank whose policy asks for values-only deltas (rank 0's decides for
// all); -1: none. serving_dir: where rank 0's policy (dir: dir, on every rank) publishes, the
// other ranks' having none; "": none.
inline Outcome write(embstore_store_config_t config, int rank, int world, const std::string& dir,
                     int attaching_ranks = 1 << 30, int serving_deltas_rank = -1,
                     const std::string& serving_dir = "") {
  Outcome out;
  const std::string at =
      "writer rank " + std::to_string(rank) + " of " + std::to_string(world) + ": ";
  embstore_store_t* store = nullptr;
  out.expect_status(embstore_store_create(&config, &store), EMBSTORE_OK, at + "store_create");
  if (store == nullptr) return out;
  const std::vector<embstore_table_t*> tables = create_tables(store, out, at);
  // Deltas stay deltas (these small tables change mostly between checkpoints).
  embstore_checkpoint_policy_t policy;
  embstore_checkpoint_policy_init(&policy);
  policy.max_chain_length = 0;
  policy.rebaseline_fraction = 0;
  policy.serving_deltas = rank == serving_deltas_rank ? 1 : 0;
  if (!serving_dir.empty()) {
    policy.dir = dir.c_str();
    if (rank == 0) policy.serving_dir = serving_dir.c_str();  // rank 0's policy decides
  }
  out.expect_status(embstore_checkpoint_set_policy(store, &policy), EMBSTORE_OK, at + "policy");
  for (int step = 1; step <= sharded::kSteps; ++step) {
    out.expect_status(embstore_step(store, static_cast<uint64_t>(step)), EMBSTORE_OK,
                      at + "step " + std::to_string(step));
    train_step(tables, rank, world, world > 1, step, out, at);
    if (step % 2 != 0) continue;
    const uint64_t version = static_cast<uint64_t>(step);
    const std::string note = attachment_of(rank, version);
    if (rank < attaching_ranks) {
      out.expect_status(embstore_checkpoint_attach(store, "note", note.data(), note.size()),
                        EMBSTORE_OK, at + "attach");
    }
    uint64_t taken = 0;
    const embstore_ckpt_kind_t kind = step == 2 ? EMBSTORE_CKPT_FULL : EMBSTORE_CKPT_INCREMENTAL;
    out.expect_status(embstore_checkpoint(store, dir.c_str(), kind, &taken), EMBSTORE_OK,
                      at + "checkpoint " + std::to_string(version));
    out.expect(taken == version, at + "checkpoint took version " + std::to_string(taken));
    // Left in flight at step 4 (the next calls settle it); waited for at 2 and 6.
    if (step != 4) {
      out.expect_status(embstore_checkpoint_wait(store, version), EMBSTORE_OK,
                        at + "checkpoint_wait " + std::to_string(version));
    }
    embstore_checkpoint_info_t info{};
    info.struct_size = sizeof(info);
    if (step != 4 && embstore_checkpoint_info(store, version, &info) == EMBSTORE_OK) {
      out.expect(info.kind == kind, at + "version " + std::to_string(version) + " was written as " +
                                        (info.kind == EMBSTORE_CKPT_FULL ? "full" : "a delta"));
    }
  }
  embstore_checkpoint_stats_t stats{};
  stats.struct_size = sizeof(stats);
  embstore_checkpoint_stats(store, &stats);
  out.expect(stats.committed == 3 && stats.failed == 0,
             at + std::to_string(stats.committed) + " committed, " + std::to_string(stats.failed) +
                 " failed");
  out.expect_status(embstore_store_destroy(store), EMBSTORE_OK, at + "store_destroy");
  return out;
}

// Compares every row this rank owns (world ranks) of every table with the reference's.
inline void compare_owned(const std::vector<embstore_table_t*>& tables,
                          const std::vector<embstore_table_t*>& reference, int rank, int world,
                          Outcome& out, const std::string& at) {
  std::vector<int64_t> keys;  // every key the batches ever held, and some never seen
  for (int64_t k = -400; k < 500; ++k) {
    if (embstore_shard_of(k, static_cast<uint32_t>(world)) == static_cast<uint32_t>(rank)) {
      keys.push_back(k);
    }
  }
  for (size_t t = 0; t < kTableCount; ++t) {
    const uint32_t dim = kTables[t].dim;
    std::vector<float> mine(keys.size() * dim), theirs(keys.size() * dim);
    out.expect_status(embstore_lookup(tables[t], keys.data(), keys.size(), mine.data(), 0, nullptr),
                      EMBSTORE_OK, at + "lookup");
    out.expect_status(
        embstore_lookup(reference[t], keys.data(), keys.size(), theirs.data(), 0, nullptr),
        EMBSTORE_OK, at + "reference lookup");
    out.expect(sharded::same_bits(mine.data(), theirs.data(), mine.size()),
               at + kTables[t].name + ": rows differ from one process's");
  }
}

// W' = world ranks (config has the communicator when world > 1) restore `version` of dir,
// written by `writers` ranks (attaching_ranks of which attached) after `trained` steps (-1: as
// many as the version: write() checkpoints after a step's training, a policy at the step
// boundary, before it). Every rank calls it.
inline Outcome restore(embstore_store_config_t config, int rank, int world, const std::string& dir,
                       int writers, uint64_t version, int attaching_ranks = 1 << 30,
                       int trained = -1) {
  Outcome out;
  const std::string at = "restore of version " + std::to_string(version) + " by " +
                         std::to_string(writers) + " writers into rank " + std::to_string(rank) +
                         " of " + std::to_string(world) + ": ";
  // One process replays the writers' batches up to the version.
  embstore_store_config_t one;
  embstore_store_config_init(&one);
  one.backend = EMBSTORE_BACKEND_HOST;
  one.host_threads = 1;
  embstore_store_t* reference = nullptr;
  out.expect_status(embstore_store_create(&one, &reference), EMBSTORE_OK, at + "reference");
  const std::vector<embstore_table_t*> replay = create_tables(reference, out, at);
  for (int step = 1; step <= (trained < 0 ? static_cast<int>(version) : trained); ++step) {
    embstore_step(reference, static_cast<uint64_t>(step));
    train_step(replay, 0, writers, false, step, out, at + "reference ");
  }

  embstore_store_t* store = nullptr;
  out.expect_status(embstore_store_create(&config, &store), EMBSTORE_OK, at + "store_create");
  if (store == nullptr || out.failures > 0) {
    embstore_store_destroy(store);
    embstore_store_destroy(reference);
    return out;
  }
  uint64_t restored = 0;
  out.expect_status(embstore_restore(store, dir.c_str(), version, &restored), EMBSTORE_OK,
                    at + "restore");
  out.expect(restored == version, at + "restored version " + std::to_string(restored));
  std::vector<embstore_table_t*> tables(kTableCount, nullptr);
  for (size_t t = 0; t < kTableCount; ++t) {
    out.expect_status(embstore_table_get(store, kTables[t].name, &tables[t]), EMBSTORE_OK,
                      at + "table_get");
  }
  if (out.failures == 0) {
    compare_owned(tables, replay, rank, world, out, at);
    // One more step on both: values then depend on the optimizer state and admission counts.
    const int next = static_cast<int>(version) + 1;
    embstore_step(store, static_cast<uint64_t>(next));
    embstore_step(reference, static_cast<uint64_t>(next));
    train_step(tables, rank, world, world > 1, next, out, at);
    train_step(replay, 0, world, false, next, out, at + "reference ");
    compare_owned(tables, replay, rank, world, out, at + "after a step: ");
  }
  // Each rank gets its own attachment back, where the writers had its rank.
  char buf[64];
  size_t bytes = 0;
  const embstore_status_t s = embstore_restore_attachment(store, "note", buf, sizeof buf, &bytes);
  if (rank < writers && rank < attaching_ranks) {
    out.expect_status(s, EMBSTORE_OK, at + "restore_attachment");
    out.expect(s != EMBSTORE_OK || std::string(buf, bytes) == attachment_of(rank, version),
               at + "attachment '" + std::string(buf, s == EMBSTORE_OK ? bytes : 0) + "'");
  } else {
    out.expect_status(s, EMBSTORE_NOT_FOUND,
                      at + "restore_attachment of a rank the writers lacked");
  }
  out.expect_status(embstore_store_destroy(store), EMBSTORE_OK, at + "store_destroy");
  out.expect_status(embstore_store_destroy(reference), EMBSTORE_OK, at + "reference destroy");
  return out;
}

// W' = world ranks (config has the communicator when world > 1) warm-start from dir, written
// by `writers` ranks: items from version 2, users from version 6 (over version 2's), ads from
// version 4 values only; clicks keep what step 1 trained. One process does the same on every
// rank's batches and warm-starts from the same sources; every rank compares the rows it owns,
// before and after one more step, and reads the attachment of the last source. Every rank calls it.
inline Outcome warm_start(embstore_store_config_t config, int rank, int world,
                          const std::string& dir, int writers) {
  Outcome out;
  const std::string at = "warm start from " + std::to_string(writers) + " writers into rank " +
                         std::to_string(rank) + " of " + std::to_string(world) + ": ";
  embstore_warm_start_source_t sources[3];
  for (embstore_warm_start_source_t& s : sources) {
    embstore_warm_start_source_init(&s);
    s.dir = dir.c_str();
  }
  sources[0].version = 2;
  sources[0].tables_regex = "items|users";
  sources[1].version = 6;
  sources[1].tables_regex = "user.";
  sources[2].version = 4;
  sources[2].tables_regex = "ads";
  sources[2].flags = EMBSTORE_WARM_START_VALUES_ONLY;

  embstore_store_config_t one;
  embstore_store_config_init(&one);
  one.backend = EMBSTORE_BACKEND_HOST;
  one.host_threads = 1;
  embstore_store_t* reference = nullptr;
  embstore_store_t* store = nullptr;
  out.expect_status(embstore_store_create(&one, &reference), EMBSTORE_OK, at + "reference");
  out.expect_status(embstore_store_create(&config, &store), EMBSTORE_OK, at + "store_create");
  if (reference == nullptr || store == nullptr) {
    embstore_store_destroy(store);
    embstore_store_destroy(reference);
    return out;
  }
  const std::vector<embstore_table_t*> replay = create_tables(reference, out, at);
  const std::vector<embstore_table_t*> tables = create_tables(store, out, at);
  embstore_step(reference, 1);
  embstore_step(store, 1);
  train_step(replay, 0, world, false, 1, out, at + "reference ");
  train_step(tables, rank, world, world > 1, 1, out, at);
  out.expect_status(embstore_warm_start(reference, sources, 3), EMBSTORE_OK,
                    at + "reference warm_start");
  out.expect_status(embstore_warm_start(store, sources, 3), EMBSTORE_OK, at + "warm_start");
  if (out.failures == 0) {
    compare_owned(tables, replay, rank, world, out, at);
    embstore_step(store, 7);
    embstore_step(reference, 7);
    train_step(tables, rank, world, world > 1, 7, out, at);
    train_step(replay, 0, world, false, 7, out, at + "reference ");
    compare_owned(tables, replay, rank, world, out, at + "after a step: ");
  }
  char buf[64];
  size_t bytes = 0;
  const embstore_status_t s = embstore_restore_attachment(store, "note", buf, sizeof buf, &bytes);
  if (rank < writers) {
    out.expect(s == EMBSTORE_OK && std::string(buf, bytes) == attachment_of(rank, 4),
               at + "the attachment of the last source");
  } else {
    out.expect_status(s, EMBSTORE_NOT_FOUND, at + "attachment of a rank the writers lacked");
  }
  out.expect_status(embstore_store_destroy(store), EMBSTORE_OK, at + "store_destroy");
  out.expect_status(embstore_store_destroy(reference), EMBSTORE_OK, at + "reference destroy");
  return out;
}

}  // namespace embstore_test::collective
