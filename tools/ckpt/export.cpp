// embstore-ckpt export DIR --version V --table T --out PREFIX: a table's rows at version V as
// NumPy files that any tool reads without embstore: PREFIX.keys.npy (int64, [rows]),
// PREFIX.values.npy (float32, [rows, dim]) and, for optimizers with state,
// PREFIX.state.npy (float32, [rows, state_dim]; its layout in the manifest's state_layout),
// rows in the same order in all three. V is read as restore reads it (the same plan and checks,
// any world size, the chain applied); the files are written beside their final names and
// renamed only once all are complete, so an interrupted export leaves no .npy behind.
#include <fmt/core.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "io/format/chain.hpp"
#include "tools/ckpt/ckpt.hpp"

namespace embstore::ckpt {
namespace {

// An .npy file (format 1.0) of a little-endian array of `descr` ("<i8", "<f4") and shape,
// written as rows come. Its header says the final shape, known before the rows.
class NpyWriter {
 public:
  NpyWriter(const std::string& path, const char* descr, uint64_t rows, uint32_t columns)
      : path_(path), tmp_(path + ".tmp") {
    file_ = std::fopen(tmp_.c_str(), "wb");
    if (file_ == nullptr)
      throw Problem(fmt::format("{}: cannot create: {}", tmp_, errno_text(-errno)));
    const std::string shape =
        columns == 0 ? fmt::format("({},)", rows) : fmt::format("({}, {})", rows, columns);
    std::string header =
        fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': {}, }}", descr, shape);
    // Magic (6), version (2), header length (2), then the header padded with spaces to a
    // multiple of 64 bytes and ended by a newline.
    const size_t total = (10 + header.size() + 1 + 63) / 64 * 64;
    header.append(total - 10 - header.size() - 1, ' ');
    header += '\n';
    const uint16_t length = static_cast<uint16_t>(header.size());
    const char preamble[10] = {'\x93',
                               'N',
                               'U',
                               'M',
                               'P',
                               'Y',
                               1,
                               0,
                               static_cast<char>(length & 0xff),
                               static_cast<char>(length >> 8)};
    if (write(preamble, sizeof preamble) < 0 || write(header.data(), header.size()) < 0) {
      throw Problem(fmt::format("{}: cannot write: {}", tmp_, errno_text(-errno)));
    }
  }
  ~NpyWriter() {
    if (file_ != nullptr) std::fclose(file_);
    if (!renamed_) std::remove(tmp_.c_str());
  }
  // 0, or -errno.
  int write(const void* data, size_t bytes) {
    if (bytes > 0 && std::fwrite(data, 1, bytes, file_) != bytes) return errno > 0 ? -errno : -EIO;
    return 0;
  }
  const std::string& tmp() const { return tmp_; }
  // Flushed and closed; the rename comes once every file of the export is complete.
  void close() {
    const bool ok = std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0;
    const int err = errno;
    std::fclose(file_);
    file_ = nullptr;
    if (!ok) throw Problem(fmt::format("{}: cannot write: {}", tmp_, errno_text(-err)));
  }
  void rename() {
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      throw Problem(fmt::format("{}: cannot rename to {}: {}", tmp_, path_, errno_text(-errno)));
    }
    renamed_ = true;
  }

 private:
  std::string path_, tmp_;
  std::FILE* file_ = nullptr;
  bool renamed_ = false;
};

}  // namespace

int cmd_export(const std::string& dir, const std::string& version_text, const std::string& table,
               const std::string& prefix, ProgressWhen when) {
  io::CheckpointDir checkpoints(dir, versions_of(dir));
  const std::optional<checkpoint::RestorePlan> plan = plan_of(checkpoints, version_text);
  const checkpoint::TablePlan* t = nullptr;
  for (const checkpoint::TablePlan& p : plan->tables) {
    if (p.entry->name == table) t = &p;
  }
  if (t == nullptr) throw Problem(fmt::format("{} has no table '{}'", plan->path(), table));
  const uint64_t rows = t->entry->table_rows;
  // The version's state_dim: 0 in a serving-only version, whatever the optimizer.
  const uint32_t dim = t->spec.dim, state_dim = t->entry->state_dim;
  std::vector<std::unique_ptr<NpyWriter>> files;
  files.push_back(std::make_unique<NpyWriter>(prefix + ".keys.npy", "<i8", rows, 0));
  files.push_back(std::make_unique<NpyWriter>(prefix + ".values.npy", "<f4", rows, dim));
  if (state_dim > 0) {
    files.push_back(std::make_unique<NpyWriter>(prefix + ".state.npy", "<f4", rows, state_dim));
  }
  Progress progress(when, "exporting", Progress::Unit::kRows, rows);
  uint64_t written = 0;
  int write_error = 0;
  std::string write_what;
  const io::RowSink sink = [&](const io::RowBlock& b, std::string* why) {
    written += b.rows;
    progress.update(written);
    if (written > rows) return 0;  // read_table reports the count against the manifest
    const size_t n = b.rows;
    int r = files[0]->write(b.keys, n * sizeof(int64_t));
    size_t f = 0;
    if (r == 0) r = files[f = 1]->write(b.values, n * dim * sizeof(float));
    if (r == 0 && state_dim > 0) r = files[f = 2]->write(b.state, n * state_dim * sizeof(float));
    if (r < 0) {  // the output's error, not the input block's
      write_error = r;
      write_what = files[f]->tmp();
      *why = errno_text(r);
    }
    return r;
  };
  try {
    io::ChainReadOptions options;
    options.unique_keys = true;
    checkpoint::read_table(*plan, *t, options, sink, [&] { return written; });
  } catch (const Error& e) {
    if (write_error == 0) throw Problem(e.what());
  }
  if (write_error != 0) {
    throw Problem(fmt::format("{}: cannot write: {}", write_what, errno_text(write_error)));
  }
  progress.finish();
  for (auto& f : files) f->close();
  for (auto& f : files) f->rename();
  fmt::print(
      "exported table '{}' of {} ({} rows, dim {}, state_dim {}{}) to {}.keys.npy, "
      "{}.values.npy{}\n",
      table, plan->path(), rows, dim, state_dim,
      state_dim > 0 ? ": " + t->entry->state_layout : std::string(), prefix, prefix,
      state_dim > 0 ? ", " + prefix + ".state.npy" : std::string());
  return kExitOk;
}

}  // namespace embstore::ckpt
