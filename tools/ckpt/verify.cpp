// embstore-ckpt verify DIR [--version V]: whether embstore_restore of a version would succeed,
// and if not, with which status and why. For each version it checks, verify makes restore's own
// plan (host/checkpoint/restore_plan.hpp: the chain and every link, the world size, each
// table's configuration), reads every file restore reads with restore's checks
// (io::read_row_file, io::read_checked_file), counts each table's rows at that version as
// restore's chain read keeps them (io::read_chain_rows: a key's status is its first occurrence
// in the newest file that holds it), and merges the admission counts as restore does. It exits
// 0 exactly when a restore of every version it checked, into an empty store, would succeed.
//
// Without --version it checks every version directory. Each file is read once, and each
// version's keys are its parent's with its own files applied, so a chain is read once, not
// once per version. A version that fails is reported, and the others are still checked.
//
// A delta's values-only files (serving_deltas) are checked too: a problem there is a WARNING line
// (followers fall back to the whole delta), not a failed version.
//
// Also here: the shallow form of the same check that ls's RESTORABLE column shows.
#include <fmt/core.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "host/checkpoint/restore_plan.hpp"
#include "host/error.hpp"
#include "io/codec/block_codec.hpp"
#include "io/format/chain.hpp"
#include "io/format/manifest.hpp"
#include "io/format/row_file.hpp"
#include "tools/ckpt/ckpt.hpp"

namespace embstore::ckpt {
namespace {

using checkpoint::RestorePlan;
using checkpoint::TablePlan;

// io/chain's errors as restore reports them (restore_plan.cpp does the same).
[[noreturn]] void fail_read(int err, const std::string& detail) {
  fail(err == -EBADMSG ? EMBSTORE_CORRUPT : EMBSTORE_IO_ERROR, "{}", detail);
}

const io::TableEntry* find_table(const io::Manifest& m, const std::string& name) {
  for (const io::TableEntry& t : m.tables) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// A table's keys at one version, sorted: those with a row.
using Keys = std::vector<int64_t>;

// What a version's files say of a key: its first occurrence in them, an upsert or a tombstone.
struct KeyStatus {
  int64_t key;
  bool tombstone;
};

class Verifier {
 public:
  Verifier(io::CheckpointDir& checkpoints, Progress& progress)
      : checkpoints_(checkpoints), progress_(progress) {}

  // Counts, per version, the later versions to check that apply on it: its keys are kept
  // until they have used them.
  void expect_children(const RestorePlan& plan) {
    if (plan.chain.size() > 1) ++children_[index_of(plan.chain[1])];
  }

  // Checks one planned version as restore would load it. Throws Error with the status
  // restore would return.
  void check(const RestorePlan& plan) {
    std::optional<Error> first;
    // Every table's keys, even after a failure, so that the versions on this one need not
    // read its chain again.
    for (const TablePlan& t : plan.tables) {
      try {
        const Keys keys = keys_at(plan, t);
        if (keys.size() != t.entry->table_rows) {
          fail(EMBSTORE_CORRUPT, "{}: table '{}' has {} rows after loading, the manifest says {}",
               plan.path(), t.entry->name, keys.size(), t.entry->table_rows);
        }
      } catch (const Error& e) {
        if (!first) first = e;
      }
    }
    if (plan.chain.size() > 1) {
      const size_t parent = index_of(plan.chain[1]);
      if (--children_[parent] == 0) forget(parent);
    }
    if (first) throw *first;
    for (const TablePlan& t : plan.tables) checkpoint::read_admission(plan, t);
    std::set<uint32_t> ranks;  // each rank's attachments, once
    for (const io::AttachmentEntry& a : plan.manifest().attachments) ranks.insert(a.rank);
    for (uint32_t r : ranks) checkpoint::read_attachments(plan, r);
  }

 private:
  size_t index_of(const io::ChainLink& link) const {
    return static_cast<size_t>(link.dir - checkpoints_.versions().data());
  }

  void forget(size_t version) {
    for (auto it = keys_.lower_bound({version, std::string()});
         it != keys_.end() && it->first.first == version;) {
      it = keys_.erase(it);
    }
  }

  // The table's keys at the plan's version: from the newest parent whose keys are known (or
  // from nothing), each newer version's files applied in turn.
  Keys keys_at(const RestorePlan& plan, const TablePlan& t) {
    const std::string& name = t.entry->name;
    // The shape check of restore's chain read, in its order (newest first).
    for (const io::ChainLink& link : plan.chain) {
      const io::TableEntry* e = find_table(*link.manifest, name);
      if (e != nullptr &&
          (e->config.dim != t.entry->config.dim || e->state_dim != t.entry->state_dim)) {
        fail(EMBSTORE_CORRUPT, "{}: table '{}' changes shape along the chain", link.path, name);
      }
    }
    size_t from = plan.chain.size();  // the first link still to apply, counted from the newest
    Keys keys;
    for (size_t k = 1; k < plan.chain.size(); ++k) {
      auto known = keys_.find({index_of(plan.chain[k]), name});
      if (known != keys_.end()) {
        keys = known->second;
        from = k;
        break;
      }
    }
    for (size_t k = from; k-- > 0;) {
      const io::ChainLink& link = plan.chain[k];
      if (const io::TableEntry* e = find_table(*link.manifest, name); e != nullptr) {
        keys = apply(keys, link, *e);
      }
    }
    const size_t self = index_of(plan.chain.front());
    if (children_[self] > 0) keys_[{self, name}] = keys;
    return keys;
  }

  // keys with one version's files of a table applied, as restore's newest-first read sees
  // them: the keys of the files take their status there, the others keep theirs.
  Keys apply(const Keys& keys, const io::ChainLink& link, const io::TableEntry& e) {
    std::vector<std::pair<KeyStatus, uint64_t>> seen;  // with their position in the files
    for (const io::FileEntry& f : e.files) {
      const std::string path = link.path + "/" + f.path;
      if (auto bad = failed_files_.find(path); bad != failed_files_.end()) {
        fail_read(bad->second.first, bad->second.second);
      }
      std::string detail;
      const io::RowSink collect = [&](const io::RowBlock& b, std::string*) {
        progress_.update(done_ + b.offset);
        const bool tombstone = b.kind == io::RowBlockKind::kTombstones;
        for (uint32_t i = 0; i < b.rows; ++i) seen.push_back({{b.keys[i], tombstone}, seen.size()});
        return 0;
      };
      const int r = io::read_row_file(path, f, e, link.manifest->full, collect, &detail);
      done_ += f.bytes;
      progress_.update(done_);
      if (r < 0) {
        failed_files_[path] = {r, detail};
        fail_read(r, detail);
      }
    }
    // Each key's first occurrence, by key.
    std::sort(seen.begin(), seen.end(), [](const auto& a, const auto& b) {
      return a.first.key != b.first.key ? a.first.key < b.first.key : a.second < b.second;
    });
    seen.erase(std::unique(seen.begin(), seen.end(),
                           [](const auto& a, const auto& b) { return a.first.key == b.first.key; }),
               seen.end());
    Keys out;
    out.reserve(keys.size() + seen.size());
    size_t i = 0;
    for (const auto& [status, position] : seen) {
      while (i < keys.size() && keys[i] < status.key) out.push_back(keys[i++]);
      if (i < keys.size() && keys[i] == status.key) ++i;  // its status is the newer file's
      if (!status.tombstone) out.push_back(status.key);
    }
    out.insert(out.end(), keys.begin() + static_cast<std::ptrdiff_t>(i), keys.end());
    return out;
  }

  io::CheckpointDir& checkpoints_;
  Progress& progress_;
  uint64_t done_ = 0;
  std::map<size_t, int> children_;
  std::map<std::pair<size_t, std::string>, Keys> keys_;  // (version index, table)
  std::map<std::string, std::pair<int, std::string>> failed_files_;
};

// The row bytes a plan reads that no earlier plan read: the progress line's total.
uint64_t new_row_bytes(const RestorePlan& plan, std::map<std::string, bool>* counted) {
  uint64_t bytes = 0;
  for (const io::ChainLink& link : plan.chain) {
    for (const io::TableEntry& t : link.manifest->tables) {
      for (const io::FileEntry& f : t.files) {
        if (counted->emplace(link.path + "/" + f.path, true).second) bytes += f.bytes;
      }
    }
  }
  return bytes;
}

// What a version holds itself, and for a delta the rows of its tables once restored with its
// chain.
struct Summary {
  uint64_t tables = 0, files = 0, rows = 0, bytes = 0, restored_rows = 0, older_versions = 0;
  bool serving_only = false;  // a serving-only directory's: followers read it, restores refuse
};

Summary summarize(const RestorePlan& plan) {
  const io::Manifest& m = plan.manifest();
  Summary s;
  s.tables = m.tables.size();
  s.serving_only = m.serving_only;
  for (const io::TableEntry& t : m.tables) {
    for (const io::FileEntry& f : t.files) {
      ++s.files;
      s.bytes += f.bytes;
    }
    for (const std::vector<io::FileEntry>* files : {&t.admission, &t.serving}) {
      for (const io::FileEntry& f : *files) {
        ++s.files;
        s.bytes += f.bytes;
      }
    }
    s.rows += t.rows;
    s.restored_rows += t.table_rows;
  }
  for (const io::AttachmentEntry& a : m.attachments) {
    ++s.files;
    s.bytes += a.file.bytes;
  }
  s.older_versions = plan.chain.size() - 1;
  return s;
}

// "(3 tables, 2540 rows, 5 files, 1.3 MiB)", and for a delta "  restores N rows with K older
// versions".
std::string describe(const Summary& s) {
  std::string out = fmt::format("({}, {} rows, {}, {})", plural(s.tables, "table", "tables"),
                                s.rows, plural(s.files, "file", "files"), human(s.bytes));
  if (s.older_versions > 0) {
    out +=
        fmt::format("  {} {} rows with {}", s.serving_only ? "serves" : "restores", s.restored_rows,
                    plural(s.older_versions, "older version", "older versions"));
  }
  if (s.serving_only) out += "  serving-only: for followers and values-only warm starts";
  return out;
}

nlohmann::json to_json(const Summary& s) {
  return {{"tables", s.tables},
          {"files", s.files},
          {"rows", s.rows},
          {"bytes", s.bytes},
          {"restored_rows", s.restored_rows},
          {"older_versions", s.older_versions},
          {"serving_only", s.serving_only}};
}

// Compares a delta's values-only file with its row file, both read block by block in step (so
// in constant memory, whatever the delta's size): "" when the copy holds the row file's rows in
// its order (and, with check_values, values within codec's bound of the row file's), else what
// differs. Both files have passed their own checks before.
std::string compare_copy(const std::string& row_path, const std::string& copy_path, uint32_t dim,
                         bool check_values, io::Codec codec) {
  std::unique_ptr<io::RowFileReader> rows, copy;
  if (int r = io::RowFileReader::open(row_path, {}, &rows); r < 0) {
    return fmt::format("{}: {}", row_path, errno_text(r));
  }
  if (int r = io::RowFileReader::open(copy_path, {}, &copy); r < 0) {
    return fmt::format("{}: {}", copy_path, errno_text(r));
  }
  io::RowBlock a, b;
  uint32_t at_a = 0, at_b = 0;
  bool more_a = true, more_b = true;
  const auto next = [](io::RowFileReader& reader, io::RowBlock* block, uint32_t* at, bool* more,
                       const std::string& path) -> std::string {
    while (*more && *at == block->rows) {
      const int r = reader.next_block(block);
      if (r < 0) return fmt::format("{}: {}", path, errno_text(r));
      *more = r == 1;
      *at = 0;
      if (!*more) block->rows = 0;
    }
    return "";
  };
  for (uint64_t row = 0;;) {
    if (std::string why = next(*rows, &a, &at_a, &more_a, row_path); !why.empty()) return why;
    if (std::string why = next(*copy, &b, &at_b, &more_b, copy_path); !why.empty()) return why;
    if (!more_a || !more_b) {
      if (more_a == more_b) return "";
      return fmt::format("{}: {} rows than {}", copy_path, more_a ? "fewer" : "more", row_path);
    }
    const uint32_t n = std::min(a.rows - at_a, b.rows - at_b);
    if (a.kind != b.kind || !std::equal(a.keys + at_a, a.keys + at_a + n, b.keys + at_b)) {
      return fmt::format("{}: its rows from row {} on are not those of {}", copy_path, row,
                         row_path);
    }
    if (check_values && a.kind == io::RowBlockKind::kUpserts &&
        !io::within_bound(codec, a.values + size_t{at_a} * dim, b.values + size_t{at_b} * dim, n,
                          dim)) {
      return fmt::format("{}: values from row {} on differ from {} past serving codec {}'s bound",
                         copy_path, row, row_path, io::codec_name(codec));
    }
    at_a += n;
    at_b += n;
    row += n;
  }
}

// What is wrong with the values-only files (serving_deltas) of the plan's version, if anything:
// each must read with every check, and hold its row file's rows, in its order, with the values
// within the table's serving codec's bound of the row file's (where those are exact: both copies
// of a table with lossy values are rounded from the same floats, each in its own way). Restore
// never reads them, so a problem here is a warning (followers read the whole delta instead), not
// a failed version.
std::vector<std::string> serving_problems(const RestorePlan& plan) {
  std::vector<std::string> problems;
  for (const io::TableEntry& e : plan.manifest().tables) {
    for (size_t k = 0; k < e.serving.size(); ++k) {
      const std::string path = plan.path() + "/" + e.serving[k].path;
      std::string detail;
      if (io::read_serving_file(path, e.serving[k], e, nullptr, &detail) < 0) {
        problems.push_back(detail);
        continue;
      }
      const io::Codec codec = static_cast<io::Codec>(e.config.serving_codec);
      if (std::string why = compare_copy(
              plan.path() + "/" + e.files[k].path, path, e.config.dim,
              io::codec_is_lossless(static_cast<io::Codec>(e.config.value_codec)), codec);
          !why.empty()) {
        problems.push_back(why);
      }
    }
  }
  return problems;
}

}  // namespace

std::string restore_problem(io::CheckpointDir& checkpoints, size_t index) {
  try {
    const RestorePlan plan = checkpoint::plan_version(checkpoints, index);
    std::string detail;
    auto present = [&](const std::string& vdir, const io::FileEntry& f) {
      if (int r = io::check_file_size(vdir + "/" + f.path, f, &detail); r < 0) {
        fail_read(r, detail);
      }
    };
    for (const TablePlan& t : plan.tables) {
      for (const io::ChainLink& link : plan.chain) {
        const io::TableEntry* e = find_table(*link.manifest, t.entry->name);
        if (e == nullptr) continue;
        for (const io::FileEntry& f : e->files) present(link.path, f);
        for (const io::FileEntry& f : e->admission) present(link.path, f);
      }
    }
    for (const io::AttachmentEntry& a : plan.manifest().attachments) present(plan.path(), a.file);
  } catch (const Error& e) {
    return fmt::format("{}: {}", embstore_status_name(e.status()), e.what());
  }
  return "";
}

int cmd_verify(const std::string& dir, const std::optional<std::string>& version_text,
               ProgressWhen when, bool json, bool serving) {
  io::CheckpointDir checkpoints(dir, versions_of(dir));
  nlohmann::json report = {{"directory", dir}, {"ok", true}, {"versions", nlohmann::json::array()}};
  // A failed version: a line on stderr, or an entry of the JSON report.
  auto failed_version = [&](const std::string& name, const std::string& status,
                            const std::string& problem) {
    if (json) {
      report["ok"] = false;
      report["versions"].push_back(
          {{"name", name}, {"ok", false}, {"status", status}, {"problem", problem}});
    } else {
      std::fflush(stdout);
      std::fprintf(stderr, "embstore-ckpt verify: FAILED %s: restore would return %s: %s\n",
                   name.c_str(), status.c_str(), problem.c_str());
    }
  };
  auto print_report = [&] {
    if (json) print_json(report);
  };
  std::vector<size_t> targets;
  if (version_text) {
    const VersionSpec spec = parse_version_spec(*version_text);
    size_t index = 0;
    std::string detail;
    // A version chosen whose manifest does not read: restore fails too.
    if (const int r = choose_version(checkpoints, spec, &index, &detail); r < 0) {
      failed_version(checkpoints.versions()[index].name,
                     embstore_status_name(r == -EBADMSG ? EMBSTORE_CORRUPT : EMBSTORE_IO_ERROR),
                     detail);
      print_report();
      return kExitProblem;
    }
    targets.push_back(index);
  } else {
    for (size_t i = 0; i < checkpoints.versions().size(); ++i) targets.push_back(i);
    if (targets.empty()) throw Problem(fmt::format("no checkpoints in {}", dir));
  }

  // Plans first (manifests only): what the versions read, and which apply on which.
  std::vector<std::optional<RestorePlan>> plans(targets.size());
  std::vector<std::optional<Error>> plan_errors(targets.size());
  std::map<std::string, bool> counted;
  uint64_t total = 0;
  for (size_t k = 0; k < targets.size(); ++k) {
    try {
      plans[k] = checkpoint::plan_version(checkpoints, targets[k]);
      total += new_row_bytes(*plans[k], &counted);
    } catch (const Error& e) {
      plan_errors[k] = e;
    }
  }
  Progress progress(when, "verifying", Progress::Unit::kBytes, total);
  Verifier verifier(checkpoints, progress);
  for (const auto& plan : plans) {
    if (plan) verifier.expect_children(*plan);
  }

  int failed = 0;
  for (size_t k = 0; k < targets.size(); ++k) {
    const std::string& name = checkpoints.versions()[targets[k]].name;
    std::optional<Error> problem = plan_errors[k];
    if (plans[k] && !serving && plans[k]->manifest().serving_only) {
      // Restore refuses it on its manifest: nothing more to read. --serving checks it as
      // followers read it.
      problem = Error(EMBSTORE_INVALID_ARGUMENT,
                      "a serving-only version (values without optimizer state): restore refuses "
                      "it; --serving checks it as followers read it");
    } else if (plans[k]) {
      try {
        verifier.check(*plans[k]);
      } catch (const Error& e) {
        problem = e;
      }
    }
    if (k + 1 == targets.size()) {
      progress.finish();
    } else {
      progress.clear();
    }
    if (!problem) {
      const Summary s = summarize(*plans[k]);
      const std::vector<std::string> warnings = serving_problems(*plans[k]);
      if (json) {
        nlohmann::json v = {{"name", name}, {"ok", true}, {"status", "EMBSTORE_OK"}};
        v.update(to_json(s));
        if (!warnings.empty()) v["serving_problems"] = warnings;
        report["versions"].push_back(std::move(v));
      } else {
        fmt::print("OK {}  {}\n", name, describe(s));
        for (const std::string& w : warnings) {
          fmt::print("WARNING {}: values-only file: {} (followers read the whole delta)\n", name,
                     w);
        }
        std::fflush(stdout);
      }
    } else {
      ++failed;
      failed_version(name, embstore_status_name(problem->status()), problem->what());
    }
  }
  print_report();
  return failed == 0 ? kExitOk : kExitProblem;
}

}  // namespace embstore::ckpt
