#include "io/format/layout.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <set>

namespace embstore::io {
namespace {

bool valid_name_char(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '.' || c == '-';
}

int bad(std::string* why, std::string message) {
  if (why != nullptr) *why = std::move(message);
  return -EBADMSG;
}

}  // namespace

std::string name_problem(std::string_view what, std::string_view name) {
  if (name.empty() || name.size() > kMaxNameLength) {
    return fmt::format("{} name must have 1 to {} characters, has {}", what, kMaxNameLength,
                       name.size());
  }
  for (size_t i = 0; i < name.size(); ++i) {
    if (!valid_name_char(name[i])) {
      // Printed escaped: a name read from disk may hold any byte.
      return fmt::format("{} name '{}' has character {:#04x} at {}: allowed are [A-Za-z0-9_.-]",
                         what, printable(name), static_cast<unsigned char>(name[i]), i);
    }
  }
  if (name == "." || name == "..") return fmt::format("{} name '{}' is reserved", what, name);
  return {};
}

bool valid_name(std::string_view name) { return name_problem("", name).empty(); }

std::string printable(std::string_view s) {
  constexpr size_t kMax = 200;
  std::string out;
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > kMax) out += "...";
  return out;
}

std::string shard_file_name(uint32_t shard, uint32_t shards) {
  return fmt::format("shard-{:05}-of-{:05}.rows", shard, shards);
}

std::string table_dir(uint32_t format, std::string_view table) {
  return format >= 2 ? fmt::format("{}/{}", kTablesDir, table) : std::string(table);
}

std::string row_file_path(uint32_t format, std::string_view table, uint32_t shard,
                          uint32_t shards) {
  return table_dir(format, table) + "/" + shard_file_name(shard, shards);
}

std::string serving_file_path(uint32_t format, std::string_view table, uint32_t shard,
                              uint32_t shards) {
  return fmt::format("{}/serving-{:05}-of-{:05}.rows", table_dir(format, table), shard, shards);
}

std::string admission_file_path(uint32_t format, std::string_view table, uint32_t rank,
                                uint32_t world_size) {
  if (world_size <= 1) return table_dir(format, table) + "/admission.counts";
  return fmt::format("{}/admission-{:05}-of-{:05}.counts", table_dir(format, table), rank,
                     world_size);
}

std::string attachment_path(std::string_view name, uint32_t rank, uint32_t world_size) {
  if (world_size <= 1) return fmt::format("{}/{}", kAttachmentsDir, name);
  return fmt::format("{}/rank-{:05}/{}", kAttachmentsDir, rank, name);
}

int check_layout(const Manifest& m, std::string* why) {
  const uint32_t format = m.format_version;
  std::set<std::string> names, paths;
  // Every file once: two entries naming one file would hand one's bytes to the other.
  auto claim = [&](const std::string& path, const std::string& owner) {
    if (!paths.insert(path).second) {
      return bad(why, fmt::format("{}: '{}' is named by two entries", owner, path));
    }
    return 0;
  };
  for (const TableEntry& t : m.tables) {
    if (std::string p = name_problem("table", t.name); !p.empty()) return bad(why, p);
    if (!names.insert(t.name).second) {
      return bad(why, fmt::format("table '{}' is listed twice", t.name));
    }
    const std::string owner = fmt::format("table '{}'", t.name);
    for (const FileEntry& f : t.files) {
      bool known = false;
      for (uint32_t s = 0; s < m.world_size && !known; ++s) {
        known = f.path == row_file_path(format, t.name, s, m.world_size);
      }
      if (!known) {
        return bad(why, fmt::format("{}: row file '{}' is not one of its {} for world size {} "
                                    "(format {})",
                                    owner, f.path, row_file_path(format, t.name, 0, m.world_size),
                                    m.world_size, format));
      }
      if (int r = claim(f.path, owner); r < 0) return r;
    }
    if (!t.serving.empty() && t.serving.size() != t.files.size()) {
      return bad(why, fmt::format("{}: {} values-only files for {} row files", owner,
                                  t.serving.size(), t.files.size()));
    }
    for (size_t i = 0; i < t.serving.size(); ++i) {
      // The row file at i passed above: it is one of the shards' files.
      std::string path;
      for (uint32_t s = 0; s < m.world_size && path.empty(); ++s) {
        if (t.files[i].path == row_file_path(format, t.name, s, m.world_size)) {
          path = serving_file_path(format, t.name, s, m.world_size);
        }
      }
      if (t.serving[i].path != path) {
        return bad(why, fmt::format("{}: values-only file '{}' is not the copy of '{}' ('{}')",
                                    owner, t.serving[i].path, t.files[i].path, path));
      }
      if (int r = claim(path, owner); r < 0) return r;
    }
    if (m.world_size == 1 && t.admission.size() > 1) {
      return bad(why, fmt::format("{}: {} admission files in a checkpoint of one rank", owner,
                                  t.admission.size()));
    }
    for (const FileEntry& f : t.admission) {
      bool known = false;
      for (uint32_t s = 0; s < m.world_size && !known; ++s) {
        known = f.path == admission_file_path(format, t.name, s, m.world_size);
      }
      if (!known) {
        return bad(why,
                   fmt::format("{}: admission file '{}' is not one of its {} for world size "
                               "{}",
                               owner, f.path, admission_file_path(format, t.name, 0, m.world_size),
                               m.world_size));
      }
      if (int r = claim(f.path, owner); r < 0) return r;
    }
  }
  std::set<std::pair<uint32_t, std::string>> attached;
  for (const AttachmentEntry& a : m.attachments) {
    if (std::string p = name_problem("attachment", a.name); !p.empty()) return bad(why, p);
    if (a.rank >= m.world_size) {
      return bad(why, fmt::format("attachment '{}' has rank {} in a world of size {}", a.name,
                                  a.rank, m.world_size));
    }
    if (!attached.emplace(a.rank, a.name).second) {
      return bad(why, fmt::format("attachment '{}' of rank {} is listed twice", a.name, a.rank));
    }
    const std::string owner = fmt::format("attachment '{}'", a.name);
    const std::string path = attachment_path(a.name, a.rank, m.world_size);
    if (a.file.path != path) {
      return bad(why, fmt::format("{}: file '{}' is not its {}", owner, a.file.path, path));
    }
    if (int r = claim(a.file.path, owner); r < 0) return r;
  }
  // A file inside another entry's path, or the manifest's own name, cannot be a file then.
  for (const std::string& p : paths) {
    if (p == kManifestName || p.compare(0, std::string(kManifestName).size() + 1,
                                        std::string(kManifestName) + "/") == 0) {
      return bad(why, fmt::format("'{}' collides with the manifest", p));
    }
    auto next = paths.upper_bound(p);
    if (next != paths.end() && next->compare(0, p.size() + 1, p + "/") == 0) {
      return bad(why, fmt::format("'{}' is a file and a directory of '{}'", p, *next));
    }
  }
  return 0;
}

}  // namespace embstore::io
