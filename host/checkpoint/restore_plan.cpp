#include "host/checkpoint/restore_plan.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>

#include "cuda/row/index.h"
#include "cuda/row/shard.h"
#include "host/error.hpp"
#include "io/format/admission_file.hpp"
#include "io/format/layout.hpp"
#include "io/format/manifest.hpp"

namespace embstore::checkpoint {

namespace {

// io/chain's errors as statuses: corrupt data, or an I/O error; the message names the file.
[[noreturn]] void fail_chain(int err, const std::string& detail) {
  fail(err == -EBADMSG ? EMBSTORE_CORRUPT : EMBSTORE_IO_ERROR, "{}", detail);
}

}  // namespace

size_t choose_version(const std::string& dir, uint64_t version, std::optional<bool> full,
                      io::CheckpointDir* checkpoints, std::vector<std::string>* skipped) {
  static_assert(EMBSTORE_LATEST == io::kLatestVersion);
  std::string detail;
  if (int r = checkpoints->open(dir, &detail); r < 0) {
    if (r == -ENOENT) fail(EMBSTORE_NOT_FOUND, "{}", detail);
    fail_chain(r, detail);
  }
  size_t index = 0;
  const int r = checkpoints->choose(version, full, &index, &detail, skipped);
  if (r == -ENOENT) fail(EMBSTORE_NOT_FOUND, "{}", detail);
  if (r < 0) fail_chain(r, detail);
  return index;
}

RestorePlan plan_version(io::CheckpointDir& checkpoints, size_t index) {
  RestorePlan plan;
  std::string detail;
  if (int r = checkpoints.chain(index, &plan.chain, &detail); r < 0) fail_chain(r, detail);
  const std::string manifest = plan.path() + "/" + io::kManifestName;
  for (const io::TableEntry& t : plan.manifest().tables) {
    TablePlan p;
    p.entry = &t;
    try {
      p.spec = make_table_spec(t.config);
    } catch (const Error& e) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}': {}", manifest, t.name, e.what());
    }
    // A serving-only version holds values only, whatever the optimizer (the parser checked).
    const uint32_t state_dim = plan.manifest().serving_only ? 0 : p.spec.state_dim();
    if (state_dim != t.state_dim) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}' has state_dim {}, its optimizer needs {}", manifest,
           t.name, t.state_dim, p.spec.state_dim());
    }
    // A table never holds more rows than its limit, so a manifest that says so is wrong.
    if (t.table_rows > row::row_limit(p.spec.max_capacity)) {
      fail(EMBSTORE_CORRUPT, "{}: table '{}' has {} rows, more than its limit of {}", manifest,
           t.name, t.table_rows, row::row_limit(p.spec.max_capacity));
    }
    plan.tables.push_back(std::move(p));
  }
  return plan;
}

void refuse_serving_only(const RestorePlan& plan, const char* op) {
  if (!plan.manifest().serving_only) return;
  fail(EMBSTORE_INVALID_ARGUMENT,
       "{}: version {} is of a serving-only directory (a policy's serving_dir): it holds values "
       "without optimizer state, so {} cannot resume training from it; follow it with a "
       "follower, or warm start from it with EMBSTORE_WARM_START_VALUES_ONLY",
       plan.path(), plan.manifest().version, op);
}

void read_table(const RestorePlan& plan, const TablePlan& table,
                const io::ChainReadOptions& options, const io::RowSink& sink,
                const std::function<uint64_t()>& rows_held) {
  std::string detail;
  if (int r = io::read_chain_rows(plan.chain, *table.entry, options, sink, &detail); r < 0) {
    fail_chain(r, detail);
  }
  // Every file checked out; the rows must also be the table's rows at that version.
  if (!rows_held) return;
  if (const uint64_t rows = rows_held(); rows != table.entry->table_rows) {
    fail(EMBSTORE_CORRUPT, "{}: table '{}' has {} rows after loading, the manifest says {}",
         plan.path(), table.entry->name, rows, table.entry->table_rows);
  }
}

uint64_t rows_to_reserve(const RestorePlan& plan, const TablePlan& table) {
  // The smallest a row can be on disk: its key and its floats, without block headers.
  // (values only in a serving-only version).
  const uint64_t row_bytes = 8 + (uint64_t{table.spec.dim} + table.entry->state_dim) * 4;
  uint64_t fit = 0;
  for (const io::ChainLink& c : plan.chain) {
    for (const io::TableEntry& e : c.manifest->tables) {
      if (e.name != table.entry->name) continue;
      for (const io::FileEntry& f : e.files) {
        // What the file really holds: not past the manifest's size, its apparent size, or
        // the blocks allocated to it (a sparse file claims bytes it does not have).
        struct stat st;
        const std::string path = c.path + "/" + f.path;
        if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
        const uint64_t bytes = std::min({f.bytes, static_cast<uint64_t>(st.st_size),
                                         static_cast<uint64_t>(st.st_blocks) * 512});
        fit += bytes / row_bytes;
      }
    }
  }
  return std::min(fit, table.entry->table_rows);
}

std::optional<io::AdmissionFile> read_admission(const RestorePlan& plan, const TablePlan& table,
                                                uint32_t rank, uint32_t world_size) {
  const bool sharded = world_size > 1;
  std::vector<io::AdmissionFile> versions;  // oldest first, each version's ranks combined
  for (auto link = plan.chain.rbegin(); link != plan.chain.rend(); ++link) {
    const io::Manifest& m = *link->manifest;
    for (const io::TableEntry& e : m.tables) {
      if (e.name != table.entry->name || e.admission.empty()) continue;
      std::vector<io::AdmissionFile> ranks;
      for (const io::FileEntry& f : e.admission) {
        std::string bytes, detail;
        if (int r = io::read_checked_file(link->path, f, &bytes, &detail); r < 0) {
          fail_chain(r, detail);
        }
        ranks.emplace_back();
        if (io::parse_admission_file(bytes, &ranks.back(), &detail) < 0) {
          fail(EMBSTORE_CORRUPT, "{}/{}: {}", link->path, f.path, detail);
        }
        // A Bloom filter cannot be split by key: a rank of the same world size takes its own
        // filter back; another layout takes every rank's, added.
        if (sharded && m.world_size == world_size &&
            ranks.back().kind == io::AdmissionKind::kBloom &&
            f.path == io::admission_file_path(m.format_version, e.name, rank, world_size)) {
          ranks = {std::move(ranks.back())};
          break;
        }
      }
      versions.emplace_back();
      std::string detail;
      if (io::combine_rank_admission(std::move(ranks), &versions.back(), &detail) < 0) {
        fail(EMBSTORE_CORRUPT, "{}: table '{}': {}", link->path, e.name, detail);
      }
    }
  }
  if (versions.empty()) return std::nullopt;
  if (!table.spec.admits()) {
    fail(EMBSTORE_CORRUPT,
         "{}: table '{}' lists admission counts but does not count (admit_after "
         "{})",
         plan.path(), table.entry->name, table.spec.admit_after);
  }
  io::AdmissionFile merged;
  std::string detail;
  if (io::merge_admission(std::move(versions), &merged, &detail) < 0) {
    fail(EMBSTORE_CORRUPT, "{}: table '{}': the admission counts do not merge: {}", plan.path(),
         table.entry->name, detail);
  }
  if (sharded && merged.kind != io::AdmissionKind::kBloom) {
    // Exact counts follow their keys to their owners.
    std::erase_if(merged.entries, [&](const io::AdmissionEntry& e) {
      return row::shard_of(e.key, world_size) != rank;
    });
  }
  return merged;
}

std::map<std::string, std::vector<char>> read_attachments(const RestorePlan& plan, uint32_t rank) {
  std::map<std::string, std::vector<char>> out;
  for (const io::AttachmentEntry& a : plan.manifest().attachments) {
    if (a.rank != rank) continue;
    std::string data, detail;
    if (int r = io::read_checked_file(plan.path(), a.file, &data, &detail); r < 0) {
      fail_chain(r, detail);
    }
    out[a.name].assign(data.begin(), data.end());
  }
  return out;
}

}  // namespace embstore::checkpoint
