// embstore-ckpt: lists, verifies, inspects and compacts checkpoint directories
// (docs/DESIGN.md, "On-disk layout and commit") with the io/ layer's own readers, and the
// chain resolution that restore uses (io/format/chain.hpp).
//
//   embstore-ckpt ls DIR [--json]        RESTORABLE: restore's checks short of reading data;
//                                        RANKS: the world size that wrote the version
//   embstore-ckpt verify DIR [--version V] [--json]   exit 0 exactly when restore would succeed
//                                            (verify.cpp)
//   embstore-ckpt inspect DIR --version V --table T [--rows N] [--floats K] [--json]
//   embstore-ckpt compact DIR --version V --out OUT   (compact.cpp)
//   embstore-ckpt reshard DIR --version V --world-size W --out OUT   (compact.cpp)
//   embstore-ckpt export DIR --version V --table T --out PREFIX      (export.cpp: .npy files)
//
// V is a version number (the global step), a version directory name
// ("00000000000000001000.full") or "latest" (the newest committed version: the one restore
// loads, which fails when its manifest does not read).
// Exit codes: 0 ok, 1 a problem found or something not found, 2 bad usage.
// verify, compact, reshard and export draw a progress line on stderr when it is a terminal
// (--progress auto|always|never, -q); --json's output is for scripts (docs/ckpt-tool.md).
#include <fmt/core.h>
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/engine/engine.hpp"
#include "io/format/chain.hpp"
#include "io/format/commit.hpp"
#include "io/format/dir_lock.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"
#include "tools/ckpt/ckpt.hpp"

namespace embstore::ckpt {

std::string human(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  static constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes) / 1024.0;
  size_t unit = 0;
  while (v >= 1024.0 && unit + 1 < std::size(kUnits)) {
    v /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", v, kUnits[unit]);
}

std::string plural(uint64_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

void print_json(const nlohmann::json& j) {
  fmt::print("{}\n", j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
}

VersionSpec parse_version_spec(const std::string& text) {
  VersionSpec s;
  s.text = text;
  if (text == "latest") {
    s.latest = true;
    return s;
  }
  // The largest number is the library's "latest" (EMBSTORE_LATEST): only 'latest' says that.
  auto checked = [&](uint64_t v) {
    if (v == io::kLatestVersion) {
      throw Usage(fmt::format("--version '{}': out of range (at most {}); 'latest' for the newest",
                              text, io::kLatestVersion - 1));
    }
    s.version = v;
    return s;
  };
  bool full = false;
  uint64_t version = 0;
  if (io::parse_version_dir_name(text, &version, &full)) {
    s.full = full;
    return checked(version);
  }
  if (!text.empty() && text.size() <= 20 &&
      text.find_first_not_of("0123456789") == std::string::npos) {
    errno = 0;
    char* end = nullptr;
    const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
    if (errno == 0 && *end == '\0') return checked(v);
  }
  throw Usage(fmt::format(
      "--version '{}': expected a version number, a version directory name such as {} or "
      "'latest'",
      text, io::version_dir_name(1000, true)));
}

int choose_version(io::CheckpointDir& checkpoints, const VersionSpec& spec, size_t* index,
                   std::string* detail) {
  const int r = checkpoints.choose(spec.latest ? io::kLatestVersion : spec.version, spec.full,
                                   index, detail, nullptr);
  if (r == -ENOENT) {
    throw Problem(spec.latest ? fmt::format("no committed checkpoint in {}", checkpoints.path())
                              : fmt::format("no version {} in {}", spec.text, checkpoints.path()));
  }
  return r;
}

std::vector<io::VersionDir> versions_of(const std::string& dir) {
  std::vector<io::VersionDir> versions;
  const int r = io::list_versions(dir, &versions);
  if (r == -ENOENT) throw Problem(fmt::format("{}: no such directory", dir));
  if (r == -ENOTDIR) throw Problem(fmt::format("{}: not a directory", dir));
  if (r < 0) throw Problem(fmt::format("{}: cannot list: {}", dir, errno_text(r)));
  return versions;
}

namespace {

namespace fs = std::filesystem;

std::string join(const std::vector<std::string>& parts, const char* sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i > 0) out += sep;
    out += parts[i];
  }
  return out;
}

std::string version_path(const std::string& dir, const io::VersionDir& v) {
  return dir + "/" + v.name;
}

std::string manifest_path(const std::string& vdir) { return vdir + "/" + io::kManifestName; }

// The manifest of one version directory as read_manifest gives it, plus the check that it
// describes that directory.
struct ManifestRead {
  int rc = 0;          // read_manifest's result; -EBADMSG also for a mismatch with the name
  std::string detail;  // for -EBADMSG
  io::Manifest m;
};

ManifestRead read_version_manifest(const std::string& dir, const io::VersionDir& v) {
  ManifestRead out;
  out.rc = io::read_version_manifest(dir, v, &out.m, &out.detail);
  return out;
}

// Throws the Problem that a manifest which did not read describes.
[[noreturn]] void manifest_problem(const std::string& vdir, const ManifestRead& mr) {
  const std::string path = manifest_path(vdir);
  if (mr.rc == -ENOENT) {
    throw Problem(fmt::format("{}: missing: {} is not a committed checkpoint", path, vdir));
  }
  if (mr.rc == -EBADMSG) throw Problem(fmt::format("{}: corrupt manifest: {}", path, mr.detail));
  throw Problem(fmt::format("{}: cannot read: {}", path, errno_text(mr.rc)));
}

// Sum of the sizes of the regular files below path (symlinks not followed).
uint64_t tree_bytes(const std::string& path) {
  uint64_t total = 0;
  std::error_code ec;
  fs::recursive_directory_iterator it(path, fs::directory_options::skip_permission_denied, ec);
  for (; !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    std::error_code fec;
    if (it->is_regular_file(fec) && !it->is_symlink(fec)) {
      const uintmax_t n = it->file_size(fec);
      if (!fec) total += n;
    }
  }
  return total;
}

// Entries of dir that are leftovers of an interrupted checkpoint (io::remove_leftovers).
uint64_t count_leftovers(const std::string& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    if (it->path().filename().string().rfind(".tmp-", 0) == 0) ++n;
  }
  return n;
}

// ---------------------------------------------------------------------------------- ls --

// With json, one JSON object on stdout (docs/ckpt-tool.md): {"directory", "versions": [...],
// "leftovers", "writer"}.
int cmd_ls(const std::string& dir, bool json) {
  const std::vector<io::VersionDir> versions = versions_of(dir);
  io::CheckpointDir checkpoints(dir, versions);

  // The chain column names a delta's parent and whether that parent is here.
  auto have_version = [&](uint64_t version) {
    const io::Manifest* m = nullptr;
    for (size_t i = 0; i < versions.size(); ++i) {
      if (versions[i].version == version && checkpoints.manifest(i, &m, nullptr) == 0) return true;
    }
    return false;
  };

  using Row = std::vector<std::string>;
  const Row header = {"DIRECTORY", "VERSION",     "KIND",  "STEP",       "SIZE", "TABLES",
                      "ROWS",      "ATTACHMENTS", "CHAIN", "RESTORABLE", "RANKS"};
  std::vector<Row> rows;
  std::vector<std::string> notes;  // non-empty: the row is the name and this note only
  nlohmann::json listed = nlohmann::json::array();
  for (size_t i = 0; i < versions.size(); ++i) {
    const io::VersionDir& v = versions[i];
    const io::Manifest* manifest = nullptr;
    std::string detail;
    if (int rc = checkpoints.manifest(i, &manifest, &detail); rc != 0) {
      std::string note;
      if (rc == -ENOENT) {
        note = "(no manifest: not a checkpoint)";
      } else if (rc == -EBADMSG) {
        note = "(corrupt manifest: " + detail + ")";
      } else {
        note = "(unreadable manifest: " + errno_text(rc) + ")";
      }
      listed.push_back({{"name", v.name},
                        {"version", v.version},
                        {"kind", v.full ? "full" : "delta"},
                        {"manifest_error", rc == -ENOENT    ? std::string("missing")
                                           : rc == -EBADMSG ? "corrupt: " + detail
                                                            : errno_text(rc)},
                        {"restorable", false}});
      rows.push_back({v.name});
      notes.push_back(std::move(note));
      continue;
    }
    const io::Manifest& m = *manifest;
    const uint64_t bytes = tree_bytes(version_path(dir, v));
    uint64_t table_rows = 0;
    std::vector<std::string> table_names, attachment_names;
    for (const io::TableEntry& t : m.tables) {
      table_rows += t.rows;
      table_names.push_back(t.name);
    }
    // With several ranks, each rank's attachments are its own: name@rank.
    for (const io::AttachmentEntry& a : m.attachments) {
      attachment_names.push_back(m.world_size > 1 ? fmt::format("{}@{}", a.name, a.rank) : a.name);
    }
    std::string chain = "base";
    if (m.parent) {
      chain = fmt::format("parent {}", *m.parent);
      if (!have_version(*m.parent)) chain += " (missing)";
    }
    auto counted = [](const std::vector<std::string>& names) {
      return names.empty() ? std::string("0")
                           : fmt::format("{}: {}", names.size(), join(names, ", "));
    };
    // What restore checks before it reads rows (verify reads them too).
    std::string problem = restore_problem(checkpoints, i);
    const bool serves = problem.empty() && m.serving_only;  // a follower reads it
    if (serves) {
      problem =
          "serving-only (values without optimizer state): followers and values-only warm "
          "starts read it";
    }
    const bool restorable = problem.empty();
    nlohmann::json attachments = nlohmann::json::array();
    for (const io::AttachmentEntry& a : m.attachments) {
      attachments.push_back({{"name", a.name}, {"rank", a.rank}, {"bytes", a.file.bytes}});
    }
    listed.push_back({{"name", v.name},
                      {"version", m.version},
                      {"kind", m.full ? "full" : "delta"},
                      {"bytes", bytes},
                      {"tables", table_names},
                      {"rows", table_rows},
                      {"attachments", std::move(attachments)},
                      {"parent", m.parent ? nlohmann::json(*m.parent) : nlohmann::json()},
                      {"parent_present", !m.parent || have_version(*m.parent)},
                      {"restorable", restorable},
                      {"problem", restorable ? nlohmann::json() : nlohmann::json(problem)},
                      {"world_size", m.world_size},
                      {"serving_only", m.serving_only}});
    rows.push_back({v.name, std::to_string(m.version), m.full ? "full" : "delta",
                    std::to_string(m.version), fmt::format("{} ({})", bytes, human(bytes)),
                    counted(table_names), std::to_string(table_rows), counted(attachment_names),
                    chain,
                    restorable ? "yes"
                    : serves   ? "serving-only"
                               : "no",
                    std::to_string(m.world_size)});
    notes.emplace_back();
  }

  const uint64_t leftovers = count_leftovers(dir);
  io::LockOwner owner;
  const bool held = io::lock_holder(dir, &owner) == 1;
  if (json) {
    const nlohmann::json out = {{"directory", dir},
                                {"versions", std::move(listed)},
                                {"leftovers", leftovers},
                                {"writer", held ? nlohmann::json(io::describe(owner)) : nullptr}};
    print_json(out);
    return kExitOk;
  }
  if (versions.empty()) {
    fmt::print("no checkpoints in {}\n", dir);
  } else {
    std::vector<size_t> width(header.size(), 0);
    for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
    for (const Row& r : rows) {
      for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
    }
    auto print_row = [&](const Row& r, const std::string& note) {
      std::string line;
      for (size_t c = 0; c < r.size(); ++c) {
        if (c > 0) line += "  ";
        line += r[c];
        if (c + 1 < r.size() || !note.empty()) line.append(width[c] - r[c].size(), ' ');
      }
      if (!note.empty()) line += "  " + note;
      while (!line.empty() && line.back() == ' ') line.pop_back();
      fmt::print("{}\n", line);
    };
    print_row(header, "");
    for (size_t i = 0; i < rows.size(); ++i) print_row(rows[i], notes[i]);
  }
  if (leftovers > 0) {
    fmt::print("{} (removed at the next checkpoint)\n",
               plural(leftovers, "leftover temporary entry", "leftover temporary entries"));
  }
  if (held) fmt::print("writer: {}\n", io::describe(owner));
  return kExitOk;
}

// ----------------------------------------------------------------------------- inspect --

std::string floats(const float* p, uint32_t n, uint32_t shown) {
  std::string out = "[";
  const uint32_t k = std::min(n, shown);
  for (uint32_t i = 0; i < k; ++i) {
    if (i > 0) out += ", ";
    out += fmt::format("{:.9g}", p[i]);
  }
  if (k < n) out += fmt::format("{}... {} more", k > 0 ? ", " : "", n - k);
  out += "]";
  return out;
}

void print_table(const io::VersionDir& chosen, const io::Manifest& m, const io::TableEntry& table);

// A table's configuration as JSON: every field of embstore_table_config_t inspect prints.
nlohmann::json config_json(const io::TableEntry& table) {
  const embstore_table_config_t& c = table.config;
  return {{"dim", c.dim},
          {"optimizer", io::optimizer_name(c.optimizer)},
          {"learning_rate", c.learning_rate},
          {"weight_decay", c.weight_decay},
          {"epsilon", c.epsilon},
          {"initial_accumulator", c.initial_accumulator},
          {"beta1", c.beta1},
          {"beta2", c.beta2},
          {"state_dim", table.state_dim},
          {"state_layout", table.state_layout},
          {"init", io::init_name(c.init)},
          {"init_a", c.init_a},
          {"init_b", c.init_b},
          {"seed", c.seed},
          {"initial_capacity", c.initial_capacity},
          {"max_capacity", c.max_capacity},
          {"admit_after", c.admit_after},
          {"evict_idle_steps", c.evict_idle_steps},
          {"evict_idle_seconds", c.evict_idle_seconds},
          {"evict_when_full", c.evict_when_full != 0},
          {"value_codec", io::codec_name(static_cast<io::Codec>(c.value_codec))},
          {"state_codec", io::codec_name(static_cast<io::Codec>(c.state_codec))},
          {"serving_codec", io::codec_name(static_cast<io::Codec>(c.serving_codec))}};
}

// With json, one JSON object on stdout: the version, the table's configuration and its first
// rows, each row's values and state whole (--floats shortens the text only; a NaN or an
// infinity is null, which JSON has no number for).
int cmd_inspect(const std::string& dir, const std::string& version_text,
                const std::string& table_name, uint64_t max_rows, uint32_t shown, bool json) {
  const VersionSpec spec = parse_version_spec(version_text);
  const std::vector<io::VersionDir> all = versions_of(dir);

  // The version restore would load ('latest': the newest committed one, which fails when its
  // manifest does not read, as restore does; a bare number: the full one where both exist).
  io::CheckpointDir checkpoints(dir, all);
  size_t index = 0;
  std::string detail;
  choose_version(checkpoints, spec, &index, &detail);  // a bad manifest: read again below
  const std::optional<io::VersionDir> chosen = all[index];
  const ManifestRead mr = read_version_manifest(dir, *chosen);
  const std::string vdir = version_path(dir, *chosen);
  if (mr.rc != 0) manifest_problem(vdir, mr);
  const io::Manifest& m = mr.m;

  const io::TableEntry* table = nullptr;
  std::vector<std::string> names;
  for (const io::TableEntry& t : m.tables) {
    names.push_back(t.name);
    if (t.name == table_name) table = &t;
  }
  if (table == nullptr) {
    throw Problem(fmt::format("no table '{}' in {} (its tables: {})", table_name, vdir,
                              names.empty() ? std::string("none") : join(names, ", ")));
  }
  nlohmann::json out;
  if (json) {
    out = {{"version", chosen->name},
           {"kind", m.full ? "full" : "delta"},
           {"step", m.version},
           {"parent", m.parent ? nlohmann::json(*m.parent) : nlohmann::json()},
           {"table", table->name},
           {"rows", table->rows},
           {"files", table->files.size()},
           {"serving_files", table->serving.size()},
           {"serving_only", m.serving_only},
           {"config", config_json(*table)},
           {"first_rows", nlohmann::json::array()}};
  } else {
    print_table(*chosen, m, *table);
  }

  const uint64_t want = std::min<uint64_t>(max_rows, table->rows);
  if (!json) fmt::print("first {} of {} rows (file order):\n", want, table->rows);
  uint64_t printed = 0;
  for (const io::FileEntry& f : table->files) {
    if (printed >= want) break;
    const std::string path = vdir + "/" + f.path;
    std::unique_ptr<io::RowFileReader> reader;
    if (int r = io::RowFileReader::open(path, {}, &reader); r < 0) {
      if (r == -ENOENT) throw Problem(fmt::format("{}: missing", path));
      throw Problem(fmt::format("{}: cannot open: {}", path, errno_text(r)));
    }
    io::RowBlock b;
    int r;
    while (printed < want && (r = reader->next_block(&b)) == 1) {
      for (uint32_t k = 0; k < b.rows && printed < want; ++k, ++printed) {
        const bool deleted = b.kind == io::RowBlockKind::kTombstones;
        if (json) {
          nlohmann::json row = {{"key", b.keys[k]}, {"deleted", deleted}};
          if (!deleted) {
            const float* v = b.values + uint64_t{k} * b.dim;
            row["value"] = std::vector<float>(v, v + b.dim);
            const float* st = b.state + uint64_t{k} * b.state_dim;
            row["state"] =
                b.state_dim > 0 ? std::vector<float>(st, st + b.state_dim) : std::vector<float>();
          }
          out["first_rows"].push_back(std::move(row));
          continue;
        }
        if (deleted) {
          fmt::print("  key {}  deleted\n", b.keys[k]);
          continue;
        }
        std::string line = fmt::format("  key {}  value {}", b.keys[k],
                                       floats(b.values + uint64_t{k} * b.dim, b.dim, shown));
        if (b.state_dim > 0) {
          line += "  state " + floats(b.state + uint64_t{k} * b.state_dim, b.state_dim, shown);
        }
        fmt::print("{}\n", line);
      }
    }
    if (printed < want) {
      if (r == -EBADMSG) {
        throw Problem(fmt::format("{}: corrupt row file: {}", path, reader->error_detail()));
      }
      if (r < 0) throw Problem(fmt::format("{}: cannot read: {}", path, errno_text(r)));
    }
  }
  if (printed < want) {
    throw Problem(fmt::format("{}: table '{}' holds fewer rows than its manifest says ({})", vdir,
                              table->name, table->rows));
  }
  if (json) print_json(out);
  return kExitOk;
}

// inspect's text: the version and the table's configuration.
void print_table(const io::VersionDir& chosen, const io::Manifest& m, const io::TableEntry& table) {
  const embstore_table_config_t& c = table.config;
  fmt::print("version      {}  ({}, step {}, {}{})\n", chosen.name, m.full ? "full" : "delta",
             m.version, m.parent ? fmt::format("parent {}", *m.parent) : std::string("base"),
             m.serving_only ? "; serving-only: values without optimizer state" : "");
  fmt::print("table        {}\n", table.name);
  fmt::print("rows         {}  ({}{})\n", table.rows, plural(table.files.size(), "file", "files"),
             table.serving.empty() ? std::string()
                                   : fmt::format(", and {} for followers",
                                                 plural(table.serving.size(), "values-only file",
                                                        "values-only files")));
  fmt::print("dim          {}\n", c.dim);
  std::string hyper =
      fmt::format("learning_rate {:.9g}, weight_decay {:.9g}", c.learning_rate, c.weight_decay);
  switch (c.optimizer) {
    case EMBSTORE_OPT_ADAGRAD:
    case EMBSTORE_OPT_ROWWISE_ADAGRAD:
      hyper += fmt::format(", epsilon {:.9g}, initial_accumulator {:.9g}", c.epsilon,
                           c.initial_accumulator);
      break;
    case EMBSTORE_OPT_ADAM:
      hyper +=
          fmt::format(", beta1 {:.9g}, beta2 {:.9g}, epsilon {:.9g}", c.beta1, c.beta2, c.epsilon);
      break;
    default:
      break;
  }
  fmt::print("optimizer    {}  ({})\n", io::optimizer_name(c.optimizer), hyper);
  fmt::print("state        state_dim {}{}\n", table.state_dim,
             table.state_layout.empty() ? std::string("  (no state)") : ": " + table.state_layout);
  std::string init = io::init_name(c.init);
  switch (c.init) {
    case EMBSTORE_INIT_CONSTANT:
      init += fmt::format(" {:.9g}", c.init_a);
      break;
    case EMBSTORE_INIT_UNIFORM:
      init += fmt::format(" [{:.9g}, {:.9g})", c.init_a, c.init_b);
      break;
    case EMBSTORE_INIT_NORMAL:
      init += fmt::format(" (mean {:.9g}, stddev {:.9g})", c.init_a, c.init_b);
      break;
    default:
      break;
  }
  fmt::print("initializer  {}, seed {}\n", init, c.seed);
  fmt::print("capacity     initial {}, max {}\n", c.initial_capacity,
             c.max_capacity == 0 ? std::string("unbounded") : std::to_string(c.max_capacity));
  if (c.value_codec != EMBSTORE_CODEC_NONE || c.state_codec != EMBSTORE_CODEC_NONE) {
    fmt::print("codecs       values {}, state {}\n",
               io::codec_name(static_cast<io::Codec>(c.value_codec)),
               io::codec_name(static_cast<io::Codec>(c.state_codec)));
  }
  if (c.serving_codec != EMBSTORE_CODEC_NONE) {
    fmt::print("serving      values-only files in {}\n",
               io::codec_name(static_cast<io::Codec>(c.serving_codec)));
  }
  if (c.admit_after > 1) fmt::print("admission    after {} occurrences\n", c.admit_after);
  if (c.evict_idle_steps > 0 || c.evict_idle_seconds > 0 || c.evict_when_full != 0) {
    fmt::print("eviction     after {} idle steps, {} idle seconds (0: never); when full: {}\n",
               c.evict_idle_steps, c.evict_idle_seconds, c.evict_when_full != 0 ? "yes" : "no");
  }
}

int run(int argc, char** argv) {
  CLI::App app{
      "embstore-ckpt: list, verify, inspect, compact and reshard embstore checkpoint "
      "directories",
      "embstore-ckpt"};
  app.require_subcommand(1);
  app.footer(
      "VERSION: a number (the global step), a version directory name such as "
      "00000000000000001000.full, or 'latest'.\n"
      "Exit codes: 0 ok, 1 a problem found or not found, 2 bad usage.");

  std::string dir;
  std::optional<std::string> verify_version;
  std::string inspect_version, table, compact_version, out;
  // Signed: CLI11 2.1 converts "-3" to an unsigned type by wrapping it around.
  int64_t rows = 5;
  int shown = 4;

  CLI::App* ls =
      app.add_subcommand("ls", "list the versions in a checkpoint directory, restorable or not");
  ls->add_option("DIR", dir, "checkpoint directory")->required();
  bool json = false;
  ls->add_flag("--json", json, "one JSON object on stdout instead of the table");

  CLI::App* verify = app.add_subcommand(
      "verify",
      "check what embstore_restore would: manifests, chain links, configurations, every file "
      "(size, blocks, checksums) and each table's rows; exit 0 exactly when restore of each "
      "version checked would succeed");
  verify->add_option("DIR", dir, "checkpoint directory")->required();
  verify->add_option("--version", verify_version,
                     "only this version, with its chain ('latest': the one EMBSTORE_LATEST "
                     "restores); default: every version in DIR, each with its chain");
  verify->add_flag("--json", json,
                   "one JSON object on stdout: each version's result (the exit code is the same)");
  bool serving = false;
  verify->add_flag("--serving", serving,
                   "a serving-only directory (a policy's serving_dir): its versions pass when a "
                   "follower can read them (without it they fail: restore refuses them)");

  CLI::App* inspect =
      app.add_subcommand("inspect", "print a table's configuration and its first rows");
  inspect->add_option("DIR", dir, "checkpoint directory")->required();
  inspect->add_option("--version", inspect_version, "version, or 'latest'")->required();
  inspect->add_option("--table", table, "table name")->required();
  inspect->add_option("--rows", rows, "rows to print")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  inspect->add_option("--floats", shown, "values and state floats printed per row")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  inspect->add_flag("--json", json, "one JSON object on stdout, rows whole");

  CLI::App* compact = app.add_subcommand(
      "compact", "merge a version's chain into one full checkpoint in another directory");
  compact->add_option("DIR", dir, "checkpoint directory")->required();
  compact->add_option("--version", compact_version, "version, or 'latest'")->required();
  compact->add_option("--out", out, "directory for the full checkpoint (created if missing)")
      ->required();

  uint32_t world_size = 1;
  CLI::App* reshard = app.add_subcommand(
      "reshard", "write a version as one full checkpoint of W ranks in another directory");
  reshard->add_option("DIR", dir, "checkpoint directory")->required();
  reshard->add_option("--version", compact_version, "version, or 'latest'")->required();
  reshard->add_option("--world-size", world_size, "ranks of the new checkpoint")
      ->check(CLI::Range(1u, io::kMaxWorldSize))
      ->required();
  reshard->add_option("--out", out, "directory for the full checkpoint (created if missing)")
      ->required();

  std::string export_version, export_table, prefix;
  CLI::App* exporter = app.add_subcommand(
      "export", "write a table's keys, values and optimizer state as NumPy .npy files");
  exporter->add_option("DIR", dir, "checkpoint directory")->required();
  exporter->add_option("--version", export_version, "version, or 'latest'")->required();
  exporter->add_option("--table", export_table, "table name")->required();
  exporter
      ->add_option("--out", prefix,
                   "PREFIX: writes PREFIX.keys.npy, PREFIX.values.npy, PREFIX.state.npy")
      ->required();

  // The long commands' progress line on stderr (tools/ckpt/progress.hpp).
  std::string progress_text = "auto";
  bool quiet = false;
  for (CLI::App* sub : {verify, compact, reshard, exporter}) {
    sub->add_option("--progress", progress_text,
                    "WHEN: a progress line on stderr: auto (on a terminal), always or never")
        ->check(CLI::IsMember({"auto", "always", "never"}))
        ->capture_default_str();
    sub->add_flag("-q,--quiet", quiet, "no progress line (--progress never)");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);  // prints help (stdout) or the error (stderr)
    return code == 0 ? kExitOk : kExitUsage;
  }

  const char* command = ls->parsed()         ? "ls"
                        : verify->parsed()   ? "verify"
                        : compact->parsed()  ? "compact"
                        : reshard->parsed()  ? "reshard"
                        : exporter->parsed() ? "export"
                                             : "inspect";
  ProgressWhen progress = ProgressWhen::kAuto;
  parse_progress_when(progress_text, &progress);  // checked by CLI11
  if (quiet) progress = ProgressWhen::kNever;
  try {
    if (ls->parsed()) return cmd_ls(dir, json);
    if (verify->parsed()) return cmd_verify(dir, verify_version, progress, json, serving);
    if (compact->parsed()) return cmd_compact(dir, compact_version, out, 1, progress);
    if (reshard->parsed()) return cmd_compact(dir, compact_version, out, world_size, progress);
    if (exporter->parsed()) {
      return cmd_export(dir, export_version, export_table, prefix, progress);
    }
    return cmd_inspect(dir, inspect_version, table, static_cast<uint64_t>(rows),
                       static_cast<uint32_t>(shown), json);
  } catch (const Usage& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "embstore-ckpt %s: %s\n", command, e.what());
    return kExitUsage;
  } catch (const std::exception& e) {
    // A script asked for JSON gets JSON whatever happened (and a person the line on stderr).
    if (json) print_json({{"ok", false}, {"error", e.what()}});
    std::fflush(stdout);
    std::fprintf(stderr, "embstore-ckpt %s: %s\n", command, e.what());
    return kExitProblem;
  }
}

}  // namespace
}  // namespace embstore::ckpt

int main(int argc, char** argv) { return embstore::ckpt::run(argc, argv); }
