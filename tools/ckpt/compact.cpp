// embstore-ckpt compact DIR --version V --out OUT: merges the full checkpoint and the deltas of
// V's chain into one full checkpoint of version V in OUT, of one rank, without a store (and
// embstore-ckpt reshard ... --world-size W: the same, written as W ranks would have: each key's
// row in the file of the rank that owns it, admission counts per rank, each rank's attachments;
// a checkpoint of any world size goes in): per table, each
// key's newest row (value and optimizer state), tombstoned keys left out, the admission counts
// merged. It reads V as restore does (host/checkpoint/restore_plan.hpp: the same plan, the
// same checks of every file), and writes OUT's version with the checkpointer's own writer
// (io/format/version_writer.hpp), so embstore_restore(OUT) restores it and an interrupted or failed
// compact leaves no version in OUT. OUT's writer lock is held throughout (io/format/dir_lock.hpp):
// a trainer writing there makes compact fail, and the other way round.
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/row/shard.h"
#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "io/format/admission_file.hpp"
#include "io/format/chain.hpp"
#include "io/format/commit.hpp"
#include "io/format/dir_lock.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"
#include "io/format/version_writer.hpp"
#include "tools/ckpt/ckpt.hpp"

namespace embstore::ckpt {
namespace {

using checkpoint::RestorePlan;
using checkpoint::TablePlan;

// Every rank's writer is open at once: their staging together stays within kReshardStaging,
// and no rank's larger than its share of the data (a rank holding 1 row does not stage 16 MiB:
// W = 1000 ranks of a 200-row checkpoint took 16 GB). One output rank (compact) keeps the
// writer's defaults.
constexpr size_t kReshardStaging = size_t{256} << 20;

io::WriterOptions rank_writer_options(uint32_t world, uint64_t rows_per_rank, uint32_t dim,
                                      uint32_t state_dim) {
  io::WriterOptions options;
  if (world == 1) return options;
  const uint64_t row_bytes = 8 + 4 * (uint64_t{dim} + state_dim);
  const size_t one_row = io::detail::align_up(io::kRowBlockHeaderBytes + row_bytes);
  // The default depth for a few ranks (16 of 1 MiB each, within the budget up to 16 ranks),
  // shallower for many.
  options.queue_depth = static_cast<unsigned>(std::clamp<uint64_t>(
      kReshardStaging / (uint64_t{world} * options.buffer_bytes), 2, options.queue_depth));
  const uint64_t share = kReshardStaging / (uint64_t{world} * options.queue_depth);
  const uint64_t data = io::kRowBlockHeaderBytes + rows_per_rank * row_bytes;
  options.buffer_bytes = std::max<size_t>(
      one_row, io::detail::align_up(std::min<uint64_t>({options.buffer_bytes, share, data})));
  return options;
}

// Writes table's rows at the plan's version into the ranks' writers (each row to the writer of
// the rank that owns its key) and returns its manifest entry.
// progress counts rows from done_before.
io::TableEntry write_table(const RestorePlan& plan, const TablePlan& t,
                           const std::vector<std::unique_ptr<io::VersionWriter>>& ranks,
                           Progress& progress, uint64_t done_before) {
  const io::TableEntry& source = *t.entry;
  const uint32_t world = static_cast<uint32_t>(ranks.size());
  std::string detail;
  std::vector<std::unique_ptr<io::RowFileWriter>> files(world);
  const uint64_t rows_per_rank = source.table_rows / world + 1;
  const io::WriterOptions options =
      rank_writer_options(world, rows_per_rank, source.config.dim, source.state_dim);
  // The table's codecs: rows a lossy codec rounded are encoded again (bf16 gives them back
  // unchanged; int8 may move a value by up to another half step of its row's range).
  io::RowCodecs codecs{static_cast<io::Codec>(source.config.value_codec),
                       static_cast<io::Codec>(source.config.state_codec)};
  // A serving-only chain's values are in the serving codec (bf16's rounded already), no state.
  if (plan.manifest().serving_only) {
    codecs = io::serving_row_codecs(static_cast<io::Codec>(source.config.serving_codec));
  }
  for (uint32_t r = 0; r < world; ++r) {
    if (ranks[r]->open_rows(source.name, source.config.dim, source.state_dim, rows_per_rank, 0,
                            options, &files[r], &detail, codecs) < 0) {
      throw Problem(detail);
    }
  }
  int write_error = 0;
  uint64_t written = 0;
  const io::RowSink sink = [&](const io::RowBlock& b, std::string* why) {
    for (uint32_t i = 0; i < b.rows; ++i) {
      const float* state = b.state_dim > 0 ? b.state + size_t{i} * b.state_dim : nullptr;
      const uint32_t owner = world == 1 ? 0 : row::shard_of(b.keys[i], world);
      if (int r = files[owner]->add(b.keys[i], b.values + size_t{i} * b.dim, state); r < 0) {
        write_error = r;  // reported as the output's error, not the input block's
        *why = errno_text(r);
        return r;
      }
    }
    written += b.rows;
    progress.update(done_before + written);
    return 0;
  };
  try {
    io::ChainReadOptions options;
    options.unique_keys = true;
    checkpoint::read_table(plan, t, options, sink, [&] { return written; });
  } catch (const Error& e) {
    if (write_error == 0) throw Problem(e.what());
  }
  io::TableEntry e = source;
  e.rows = 0;
  e.files.clear();
  e.serving.clear();  // a full checkpoint has no values-only files
  e.admission.clear();
  for (uint32_t r = 0; r < world; ++r) {
    const io::FileEntry entry = ranks[r]->rows_entry(source.name, *files[r]);
    if (int err = write_error != 0 ? write_error : files[r]->finish(); err < 0) {
      throw Problem(
          fmt::format("{}/{}: cannot write: {}", ranks[r]->staging(), entry.path, errno_text(err)));
    }
    e.files.push_back(ranks[r]->rows_entry(source.name, *files[r]));
    e.rows += files[r]->rows();
  }
  try {
    // Each rank's counts: exact ones follow their keys; a Bloom filter cannot be split (see
    // read_admission).
    for (uint32_t r = 0; r < world; ++r) {
      if (const std::optional<io::AdmissionFile> counts =
              checkpoint::read_admission(plan, t, r, world)) {
        e.admission.emplace_back();
        if (ranks[r]->write_admission(source.name, *counts, &e.admission.back(), &detail) < 0) {
          throw Problem(detail);
        }
      }
    }
  } catch (const Error& err) {
    throw Problem(err.what());
  }
  return e;
}

}  // namespace

RestorePlan plan_of(io::CheckpointDir& checkpoints, const std::string& version_text) {
  const VersionSpec spec = parse_version_spec(version_text);
  try {
    std::string detail;
    size_t index = 0;
    if (choose_version(checkpoints, spec, &index, &detail) < 0) throw Problem(detail);
    return checkpoint::plan_version(checkpoints, index);
  } catch (const Error& e) {
    throw Problem(e.what());
  }
}

int cmd_compact(const std::string& dir, const std::string& version_text, const std::string& out,
                uint32_t world_size, ProgressWhen when) {
  const char* command = world_size == 1 ? "compact" : "reshard";
  io::CheckpointDir checkpoints(dir, versions_of(dir));
  const std::optional<RestorePlan> plan = plan_of(checkpoints, version_text);
  const io::Manifest& source = plan->manifest();
  // Each attachment belongs to its rank: one the new layout lacks has no place in it.
  for (const io::AttachmentEntry& a : source.attachments) {
    if (a.rank >= world_size) {
      throw Problem(
          fmt::format("{}: rank {} has attachment '{}', which a checkpoint of {} "
                      "cannot hold: nothing written",
                      plan->path(), a.rank, a.name, plural(world_size, "rank", "ranks")));
    }
  }

  std::string detail;
  if (int r = io::create_directories(out); r < 0) {
    throw Problem(fmt::format("{}: cannot create: {}", out, errno_text(r)));
  }
  std::unique_ptr<io::DirLock> lock;
  if (io::DirLock::acquire(out, fmt::format("embstore-ckpt {}", command), &lock, &detail) < 0) {
    throw Problem(detail);
  }
  // What an interrupted writer of OUT left (a compact or a checkpoint killed half-way).
  if (int r = io::remove_leftovers(out, nullptr); r < 0) {
    std::fprintf(stderr, "embstore-ckpt %s: could not remove every leftover in %s: %s\n", command,
                 out.c_str(), errno_text(r).c_str());
  }
  // Either kind of V in OUT would stand beside the new one; restore could pick it instead.
  for (const io::VersionDir& v : versions_of(out)) {
    if (v.version == source.version) {
      throw Problem(fmt::format("{} already holds version {} ({}): nothing written", out,
                                source.version, v.name));
    }
  }
  // Rank 0's writer begins the version and commits it; the other ranks' write beside it.
  std::vector<std::unique_ptr<io::VersionWriter>> ranks(world_size);
  if (io::VersionWriter::begin(out, source.version, true, &ranks[0], &detail, 0, world_size) < 0) {
    throw Problem(detail);
  }
  for (uint32_t r = 1; r < world_size; ++r) {
    if (io::VersionWriter::join(out, ranks[0]->staging(), source.version, true, r, world_size,
                                &ranks[r], &detail) < 0) {
      throw Problem(detail);
    }
  }
  io::VersionWriter& writer = *ranks[0];

  io::Manifest m;
  m.full = true;
  m.lineage = io::new_lineage();  // a new base: deltas written on it start a new chain
  m.version = source.version;
  m.serving_only = plan->manifest().serving_only;  // values only in, values only out
  m.world_size = world_size;
  m.embstore_version = EMBSTORE_VERSION_CODE;
  uint64_t rows = 0, bytes = 0, total_rows = 0;
  for (const TablePlan& t : plan->tables) total_rows += t.entry->table_rows;
  Progress progress(when, world_size == 1 ? "compacting" : "resharding", Progress::Unit::kRows,
                    total_rows);
  for (const TablePlan& t : plan->tables) {
    m.tables.push_back(write_table(*plan, t, ranks, progress, rows));
    rows += m.tables.back().rows;
    for (const io::FileEntry& f : m.tables.back().files) bytes += f.bytes;
    for (const io::FileEntry& f : m.tables.back().admission) bytes += f.bytes;
  }
  for (uint32_t r = 0; r < world_size; ++r) {
    std::map<std::string, std::vector<char>> attachments;
    try {
      attachments = checkpoint::read_attachments(*plan, r);
    } catch (const Error& e) {
      throw Problem(e.what());
    }
    for (const auto& [name, data] : attachments) {
      io::AttachmentEntry a{name, {}, r};
      if (ranks[r]->write_attachment(name, data.data(), data.size(), &a.file, &detail) < 0) {
        throw Problem(detail);
      }
      bytes += a.file.bytes;
      m.attachments.push_back(std::move(a));
    }
  }
  progress.finish();
  if (writer.write_manifest(&m, &detail) < 0 || writer.commit(&detail) < 0) {
    throw Problem(fmt::format("{}: {}", writer.final_path(), detail));
  }

  const size_t deltas = plan->chain.size() - 1;
  // Ranks are named where either side has several.
  const bool ranks_apart = source.world_size > 1 || world_size > 1;
  fmt::print("{} {} (1 full, {}{}) into {} ({}, {} rows, {}{})\n",
             world_size == 1 ? "compacted" : "resharded", plan->path(),
             plural(deltas, "delta", "deltas"),
             ranks_apart ? ", " + plural(source.world_size, "rank", "ranks") : "",
             writer.final_path(), plural(m.tables.size(), "table", "tables"), rows, human(bytes),
             ranks_apart ? ", " + plural(world_size, "rank", "ranks") : "");
  return kExitOk;
}

}  // namespace embstore::ckpt
