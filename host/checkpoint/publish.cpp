#include "host/checkpoint/publish.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

#include "io/engine/engine.hpp"
#include "io/format/chain.hpp"
#include "io/format/commit.hpp"
#include "io/format/manifest.hpp"
#include "io/format/version_writer.hpp"

namespace embstore::checkpoint {

namespace {

using io::detail::errno_text;

// Versions of serving_dir from `first` on belong to a run the trainer abandoned (its step went
// back, after a restore of an older version): retired, newest first, before a version of the
// new run is published, so that followers never take them for the newest and retention never
// counts them. A delta's `first` is just above its parent (this run committed nothing between
// them), a full's its own version. A version there that is not serving-only is not ours to
// delete: -ENOTEMPTY.
int retire_abandoned(const std::string& serving_dir, const std::vector<io::VersionDir>& versions,
                     uint64_t first, std::string* detail) {
  for (auto v = versions.rbegin(); v != versions.rend() && v->version >= first; ++v) {
    io::Manifest m;
    if (io::read_manifest(serving_dir + "/" + v->name, &m, nullptr) == 0 && !m.serving_only) {
      *detail = fmt::format(
          "'{}/{}' is not a serving-only version: a serving_dir holds nothing "
          "else, and this one is not deleted",
          serving_dir, v->name);
      return -ENOTEMPTY;
    }
    if (int r = io::retire_version(serving_dir, v->name); r < 0) {
      *detail = fmt::format("cannot delete '{}/{}', of a run abandoned at an older version: {}",
                            serving_dir, v->name, errno_text(r));
      return r;
    }
  }
  return 0;
}

// The serving directory's version of the delta m's parent: its manifest, which must be
// serving-only, of m's lineage, and published from the very version m applies on (its source
// checksum is m's parent checksum). -ENOENT when it is not there.
int serving_parent(const std::string& serving_dir, const std::vector<io::VersionDir>& versions,
                   const io::Manifest& m, io::Manifest* out, std::string* detail) {
  const uint64_t version = *m.parent;
  for (const io::VersionDir& v : versions) {
    if (v.version != version) continue;
    std::string why;
    if (int r = io::read_version_manifest(serving_dir, v, out, &why); r < 0) {
      *detail = fmt::format("its parent '{}/{}': {}", serving_dir, v.name,
                            why.empty() ? errno_text(r) : why);
      return r == -ENOENT ? -ENOENT : -EBADMSG;
    }
    if (!out->serving_only || out->lineage != m.lineage || !m.parent_xxh3 ||
        out->source_xxh3 != *m.parent_xxh3) {
      *detail = fmt::format("'{}/{}' is not the serving-only version its delta applies on",
                            serving_dir, v.name);
      return -ENOENT;
    }
    return 0;
  }
  *detail = fmt::format("'{}' does not hold its parent version {}", serving_dir, version);
  return -ENOENT;
}

// The serving-only manifest of the checkpoint's manifest m: each table's values-only files in
// place of its row files (under the row files' names), and nothing a follower does not read.
io::Manifest serving_manifest(const io::Manifest& m, const std::optional<uint64_t>& parent_xxh3) {
  io::Manifest s = m;
  s.serving_only = true;
  s.source_xxh3 = m.xxh3;
  s.parent_xxh3 = parent_xxh3;
  s.attachments.clear();
  for (io::TableEntry& t : s.tables) {
    for (size_t k = 0; k < t.files.size(); ++k) {
      const std::string path = t.files[k].path;
      t.files[k] = t.serving[k];
      t.files[k].path = path;
    }
    t.serving.clear();
    t.admission.clear();
    t.state_dim = 0;
    t.state_layout.clear();
    // No counts: a table a warm start creates from it counts exactly instead of in a filter.
    t.config.admit_bloom_bytes = 0;
  }
  return s;
}

}  // namespace

int publish_serving(const std::string& version_path, const std::string& serving_dir,
                    std::string* detail) {
  io::Manifest m;
  std::string why;
  if (int r = io::read_manifest(version_path, &m, &why); r < 0) {
    *detail = why.empty() ? fmt::format("{}: {}", version_path, errno_text(r)) : why;
    return r;
  }
  for (const io::TableEntry& t : m.tables) {
    if (t.serving.size() != t.files.size()) {
      *detail = fmt::format("{}: table '{}' has no values-only files", version_path, t.name);
      return -ENODATA;
    }
  }
  // This store is the directory's only writer: what is left of a crash (a publication's staging
  // directory, a half-deleted version) goes first.
  if (int r = io::remove_leftovers(serving_dir, nullptr); r < 0) {
    *detail = fmt::format("cannot remove the leftovers in '{}': {}", serving_dir, errno_text(r));
    return r;
  }
  std::vector<io::VersionDir> versions;
  if (int r = io::list_versions(serving_dir, &versions); r < 0) {
    *detail = fmt::format("cannot list '{}': {}", serving_dir, errno_text(r));
    return r;
  }
  // (A delta's parent is below `first`: never retired.)
  const uint64_t first = m.full ? m.version : *m.parent + 1;
  if (int r = retire_abandoned(serving_dir, versions, first, detail); r < 0) return r;
  std::optional<uint64_t> parent_xxh3;
  if (!m.full) {
    io::Manifest parent;
    if (int r = serving_parent(serving_dir, versions, m, &parent, detail); r < 0) return r;
    parent_xxh3 = parent.xxh3;
  }
  std::unique_ptr<io::VersionWriter> out;
  if (int r = io::VersionWriter::begin(serving_dir, m.version, m.full, &out, detail); r < 0) {
    return r;
  }
  io::Manifest s = serving_manifest(m, parent_xxh3);
  for (size_t i = 0; i < m.tables.size(); ++i) {
    const io::TableEntry& t = m.tables[i];
    for (size_t k = 0; k < t.files.size(); ++k) {
      const std::string from = version_path + "/" + t.serving[k].path;
      const std::string to = out->staging() + "/" + s.tables[i].files[k].path;
      const std::string parent = std::filesystem::path(to).parent_path().string();
      if (int r = io::create_directories(parent, false); r < 0) {
        *detail = fmt::format("cannot create '{}': {}", parent, errno_text(r));
        return r;
      }
      if (int r = io::link_or_copy(from, to, t.serving[k].bytes); r < 0) {
        *detail = fmt::format("cannot link or copy '{}' to '{}': {}", from, to,
                              r == -EBADMSG ? "its size is not the manifest's" : errno_text(r));
        return r;
      }
    }
  }
  if (int r = out->write_manifest(&s, detail); r < 0) return r;
  return out->commit(detail);  // not committed: the writer rolls back
}

}  // namespace embstore::checkpoint
