// What a restore of one version does before it changes anything, in stages that restore
// (restore.cpp) and embstore-ckpt's verify and ls share, so that the tool says exactly what
// restore would do:
//
//   choose_version  the version asked for (EMBSTORE_LATEST: the newest committed one)
//   plan_version    its chain back to a full checkpoint, every link checked (io::check_link),
//                   the world size, and each table's configuration as embstore_table_create
//                   would take it
//   read_table      a table's rows along the chain into a sink: every file's size, blocks, row
//                   count and checksum, then the table's rows at that version
//   read_admission  a table's admission counts along the chain, checked and merged
//   read_attachments
//
// Each throws Error with the status embstore_restore returns: NOT_FOUND (no directory, no
// committed version, no such version), CORRUPT (a manifest, a link, a configuration, a file:
// the message names the file), IO_ERROR. Versions of any world size are read (their files hold
// keys, never slots).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "host/table/table.hpp"
#include "io/format/admission_file.hpp"
#include "io/format/chain.hpp"

namespace embstore::checkpoint {

struct TablePlan {
  const io::TableEntry* entry = nullptr;  // in the version's manifest
  TableSpec spec;                         // its configuration, validated
};

// The pointers point into the io::CheckpointDir the plan was made from: keep it alive.
struct RestorePlan {
  std::vector<io::ChainLink> chain;  // the version, then each parent back to a full checkpoint
  std::vector<TablePlan> tables;     // the version's tables, in its manifest's order

  const io::Manifest& manifest() const { return *chain.front().manifest; }
  const std::string& path() const { return chain.front().path; }
};

// A table that a restore or warm start loads: its plan and table, and whether it takes the
// values only (warm start's EMBSTORE_WARM_START_VALUES_ONLY: the optimizer state starts as a new
// row's, and admission counts are left out).
struct TableLoad {
  const RestorePlan* plan = nullptr;
  const TablePlan* table = nullptr;
  bool values_only = false;
};

// What a restore or warm start replaces, planned: the versions it read, the tables to load,
// the step their rows are stamped with (the store's step after the swap), and whether the
// store starts a new run there (restore: the idle clock's marks are forgotten).
struct Replacement {
  const char* op = "restore";  // for messages
  std::vector<const RestorePlan*> plans;
  std::vector<TableLoad> loads;
  uint64_t step = 0;
  bool new_run = true;
};

// Opens dir into *checkpoints and returns the index of version in it: an exact version (of the
// given kind when full is set), or the newest with a manifest for EMBSTORE_LATEST (those
// without one are skipped, and their paths appended to *skipped, which may be null).
size_t choose_version(const std::string& dir, uint64_t version, std::optional<bool> full,
                      io::CheckpointDir* checkpoints, std::vector<std::string>* skipped);

// The plan of checkpoints->versions()[index]. Reads manifests only.
RestorePlan plan_version(io::CheckpointDir& checkpoints, size_t index);
// Throws Error(INVALID_ARGUMENT) when the plan's version is serving-only (values without
// optimizer state): op ("restore", "warm start") cannot load training's state from it.
void refuse_serving_only(const RestorePlan& plan, const char* op);

// Hands sink the table's rows along the plan's chain (io::read_chain_rows: the newest row of
// each key first, tombstoned keys left out; see io::ChainReadOptions), then requires
// rows_held() (the rows the sink ended up with) to be the table's rows at the version (unless
// rows_held is empty: a rank of a sharded store holds only its share).
void read_table(const RestorePlan& plan, const TablePlan& table,
                const io::ChainReadOptions& options, const io::RowSink& sink,
                const std::function<uint64_t()>& rows_held);

// The rows to reserve for the table before loading it: the manifest's row count, but no more
// than its row files along the chain can hold in the bytes they have on disk (apparent size,
// allocated blocks and the manifest's size, whichever is least), so that a manifest cannot make
// a restore allocate more than the files could fill.
uint64_t rows_to_reserve(const RestorePlan& plan, const TablePlan& table);

// The table's admission counts at the version for rank of world_size (1: every key): its count
// files along the chain, each checked against its manifest, each version's ranks combined
// (io::combine_rank_admission), merged (io::merge_admission); exact counts then only for the
// keys rank owns; a Bloom filter rank's own where the version has world_size ranks, else every
// rank's added. None when it has no files. A table whose configuration does not count
// (admit_after <= 1) yet lists counts is corrupt.
std::optional<io::AdmissionFile> read_admission(const RestorePlan& plan, const TablePlan& table,
                                                uint32_t rank = 0, uint32_t world_size = 1);

// The version's attachments of rank (0 in a checkpoint of one rank), each checked against its
// manifest.
std::map<std::string, std::vector<char>> read_attachments(const RestorePlan& plan, uint32_t rank);

}  // namespace embstore::checkpoint
