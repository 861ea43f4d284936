// embstore-ckpt compact DIR --version V --out OUT: merges the full checkpoint and the deltas of
// V's chain into one full checkpoint of version V in OUT, without a store: per table, each
// key's newest row (value and optimizer state), tombstoned keys left out, the admission counts
// merged. It reads V as restore does (host/checkpoint/restore_plan.hpp: the same plan, the
// same checks of every file), and writes OUT's version with the checkpointer's own writer
// (io/format/version_writer.hpp), so embstore_restore(OUT) restores it and an interrupted or failed
// compact leaves no version in OUT. OUT's writer lock is held throughout (io/format/dir_lock.hpp): a
// trainer writing there makes compact fail, and the other way round.
#include <fmt/core.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "io/format/admission_file.hpp"
#include "io/format/chain.hpp"
#include "io/format/commit.hpp"
#include "io/format/dir_lock.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"
#include "io/tool/ckpt.hpp"
#include "io/format/version_writer.hpp"

namespace embstore::ckpt {
namespace {

using checkpoint::RestorePlan;
using checkpoint::TablePlan;

// Writes table's rows at the plan's version into out and returns its manifest entry.
io::TableEntry write_table(const RestorePlan& plan, const TablePlan& t, io::VersionWriter& out) {
  const io::TableEntry& source = *t.entry;
  std::string detail;
  std::unique_ptr<io::RowFileWriter> writer;
  if (out.open_rows(source.name, source.config.dim, source.state_dim, source.table_rows, 0, {},
                    &writer, &detail) < 0) {
    throw Problem(detail);
  }
  int write_error = 0;
  uint64_t written = 0;
  const io::RowSink sink = [&](const io::RowBlock& b, std::string* why) {
    for (uint32_t i = 0; i < b.rows; ++i) {
      const float* state = b.state_dim > 0 ? b.state + size_t{i} * b.state_dim : nullptr;
      if (int r = writer->add(b.keys[i], b.values + size_t{i} * b.dim, state); r < 0) {
        write_error = r;  // reported as the output's error, not the input block's
        *why = errno_text(r);
        return r;
      }
    }
    written += b.rows;
    return 0;
  };
  try {
    io::ChainReadOptions options;
    options.unique_keys = true;
    checkpoint::read_table(plan, t, options, sink, [&] { return written; });
  } catch (const Error& e) {
    if (write_error == 0) throw Problem(e.what());
  }
  const std::string path =
      out.staging() + "/" + io::VersionWriter::rows_entry(source.name, *writer).path;
  if (int e = write_error != 0 ? write_error : writer->finish(); e < 0) {
    throw Problem(fmt::format("{}: cannot write: {}", path, errno_text(e)));
  }
  io::TableEntry e = source;
  e.rows = writer->rows();
  e.files = {io::VersionWriter::rows_entry(source.name, *writer)};
  e.admission.reset();
  try {
    if (const std::optional<io::AdmissionFile> counts = checkpoint::read_admission(plan, t)) {
      e.admission.emplace();
      if (out.write_admission(source.name, *counts, &*e.admission, &detail) < 0) {
        throw Problem(detail);
      }
    }
  } catch (const Error& err) {
    throw Problem(err.what());
  }
  return e;
}

}  // namespace

int cmd_compact(const std::string& dir, const std::string& version_text, const std::string& out) {
  const VersionSpec spec = parse_version_spec(version_text);
  io::CheckpointDir checkpoints(dir, versions_of(dir));
  std::optional<RestorePlan> plan;
  try {
    std::string detail;
    size_t index = 0;
    if (checkpoints.choose(spec.latest ? io::kLatestVersion : spec.version, spec.full, &index,
                           &detail, nullptr) < 0) {
      throw Problem(detail);
    }
    plan = checkpoint::plan_version(checkpoints, index);
  } catch (const Error& e) {
    throw Problem(e.what());
  }
  const io::Manifest& source = plan->manifest();

  std::string detail;
  if (int r = io::create_directories(out); r < 0) {
    throw Problem(fmt::format("{}: cannot create: {}", out, errno_text(r)));
  }
  std::unique_ptr<io::DirLock> lock;
  if (io::DirLock::acquire(out, "embstore-ckpt compact", &lock, &detail) < 0) throw Problem(detail);
  // What an interrupted writer of OUT left (a compact or a checkpoint killed half-way).
  if (int r = io::remove_leftovers(out, nullptr); r < 0) {
    std::fprintf(stderr, "embstore-ckpt compact: could not remove every leftover in %s: %s\n",
                 out.c_str(), errno_text(r).c_str());
  }
  // Either kind of V in OUT would stand beside the new one; restore could pick it instead.
  for (const io::VersionDir& v : versions_of(out)) {
    if (v.version == source.version) {
      throw Problem(fmt::format("{} already holds version {} ({}): nothing written", out,
                                source.version, v.name));
    }
  }
  std::unique_ptr<io::VersionWriter> writer;
  if (io::VersionWriter::begin(out, source.version, true, &writer, &detail) < 0) {
    throw Problem(detail);
  }

  io::Manifest m;
  m.full = true;
  m.lineage = io::new_lineage();  // a new base: deltas written on it start a new chain
  m.version = source.version;
  m.world_size = 1;
  m.embstore_version = EMBSTORE_VERSION_CODE;
  uint64_t rows = 0, bytes = 0;
  for (const TablePlan& t : plan->tables) {
    m.tables.push_back(write_table(*plan, t, *writer));
    rows += m.tables.back().rows;
    bytes += m.tables.back().files.front().bytes;
    if (m.tables.back().admission) bytes += m.tables.back().admission->bytes;
  }
  std::map<std::string, std::vector<char>> attachments;
  try {
    attachments = checkpoint::read_attachments(*plan);
  } catch (const Error& e) {
    throw Problem(e.what());
  }
  for (const auto& [name, data] : attachments) {
    io::AttachmentEntry a{name, {}};
    if (writer->write_attachment(name, data.data(), data.size(), &a.file, &detail) < 0) {
      throw Problem(detail);
    }
    bytes += a.file.bytes;
    m.attachments.push_back(std::move(a));
  }
  if (writer->write_manifest(&m, &detail) < 0 || writer->commit(&detail) < 0) {
    throw Problem(fmt::format("{}: {}", writer->final_path(), detail));
  }

  const size_t deltas = plan->chain.size() - 1;
  fmt::print("compacted {} (1 full, {}) into {} ({}, {} rows, {})\n", plan->path(),
             plural(deltas, "delta", "deltas"), writer->final_path(),
             plural(m.tables.size(), "table", "tables"), rows, human(bytes));
  return kExitOk;
}

}  // namespace embstore::ckpt
