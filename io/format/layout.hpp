// The layout of a checkpoint version directory: the one place that names its files, for every
// format version, and the check that a manifest names nothing else.
//
// Format 2 (written since 0.4) keeps the three kinds of content in separate namespaces, so that
// no valid table or attachment name can alias another file:
//
//   <version>/MANIFEST.json
//   <version>/tables/<table>/shard-00000-of-00001.rows    row file(s), one per writing rank
//   <version>/tables/<table>/admission.counts             admission counts, when the table has
//   <version>/tables/<table>/serving-00000-of-00001.rows  format 3, deltas with serving_deltas
//                                                         and every version with a serving_dir:
//                                                         the values-only copy of each row file
//   <version>/attachments/<name>
//
// Written by W > 1 ranks (each rank writes only its own files; rank 0 the manifest):
//
//   <version>/tables/<table>/shard-<rank>-of-<W>.rows
//   <version>/tables/<table>/admission-<rank>-of-<W>.counts
//   <version>/tables/<table>/serving-<rank>-of-<W>.rows
//   <version>/attachments/rank-<rank>/<name>
//
// Format 1 (0.1 to 0.3) put table directories beside the manifest (<version>/<table>/...), where
// a table named "attachments" could meet an attachment named like a row file. It is still read;
// its manifests must name exactly these paths, and no two entries one file.
//
// Names of tables and attachments: [A-Za-z0-9_.-]{1,128}, neither "." nor "..": always one path
// component, never a separator.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "io/format/manifest.hpp"

namespace embstore::io {

inline constexpr size_t kMaxNameLength = 128;
inline constexpr const char* kTablesDir = "tables";
inline constexpr const char* kAttachmentsDir = "attachments";

// Whether name is a valid table or attachment name.
bool valid_name(std::string_view name);
// Why name is not valid ("has character 0x2f at 2: allowed are [A-Za-z0-9_.-]"), or "" when it
// is. what names the kind ("table", "attachment") in the message.
std::string name_problem(std::string_view what, std::string_view name);

// s for a message: bytes outside printable ASCII as \xNN, at most 200 characters (then "...").
// For text read from disk, which may hold anything.
std::string printable(std::string_view s);

// "shard-00003-of-00008.rows".
std::string shard_file_name(uint32_t shard, uint32_t shards);
// The directory of a table's files, relative to the version directory.
std::string table_dir(uint32_t format, std::string_view table);
// Paths relative to the version directory, in the given format version.
std::string row_file_path(uint32_t format, std::string_view table, uint32_t shard, uint32_t shards);
// The values-only copy of row_file_path(format, table, shard, shards) (format 3).
std::string serving_file_path(uint32_t format, std::string_view table, uint32_t shard,
                              uint32_t shards);
std::string admission_file_path(uint32_t format, std::string_view table, uint32_t rank = 0,
                                uint32_t world_size = 1);
std::string attachment_path(std::string_view name, uint32_t rank = 0, uint32_t world_size = 1);

// Checks every name and path that m (already parsed) holds against the layout of its format
// version: each table name valid and listed once, each attachment name valid and listed once
// per rank (ranks below the world size); each row file and admission file one of its table's
// for m's world size (one with world size 1), listed once; a table's values-only files, when
// it has them, one per row file, each the copy of the row file at its index; each attachment at
// its path; no two entries naming one file. 0, or -EBADMSG with the reason.
int check_layout(const Manifest& m, std::string* why);

}  // namespace embstore::io
