// MANIFEST.json of a checkpoint version directory (docs/DESIGN.md, "On-disk layout and
// commit"). The manifest makes a version directory a checkpoint: it records what the
// checkpoint is (format, kind, step, parent), each table's whole configuration and state
// layout, and every file with its size, row count and XXH3 checksum. It carries its own
// checksum ("manifest_xxh3", over the compact dump of every other member), so a flipped bit in
// a number is caught as surely as a torn file.
//
// liburing style: 0 or -errno; -EBADMSG for a manifest that does not parse or check, with the
// reason in *detail.
#pragma once

#include <embstore/embstore.h>

#include "io/codec/block_codec.hpp"

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace embstore::io {

inline constexpr const char* kManifestName = "MANIFEST.json";
// The newest format (io/format/layout.hpp): 2 since 0.4 (tables/ namespace, lineage, parent
// checksum); 3 adds codecs (issue 35: each table's value_codec, state_codec and serving_codec,
// each row file's codecs when not none), values-only files ("serving_files": deltas with
// serving_deltas, every version with a serving_dir) and serving-only versions ("serving_only"),
// with format 2's layout. A writer writes 3 only for a checkpoint that uses one of them
// (manifest_format_for), so that versions before codecs still read every
// checkpoint without one, and refuse by its format number one they could not decode.
// Versions 1 to 3 are read.
inline constexpr uint32_t kManifestFormatVersion = 3;
inline constexpr uint32_t kPlainManifestFormatVersion = 2;
inline constexpr uint32_t kOldestManifestFormatVersion = 1;
// The most ranks a checkpoint (and a sharded store) may have: more is a corrupt manifest.
inline constexpr uint32_t kMaxWorldSize = 65535;

struct FileEntry {
  std::string path;  // relative to the version directory, as io/format/layout.hpp names it
  uint64_t bytes = 0;
  uint64_t rows = 0;  // row files only
  uint64_t xxh3 = 0;  // XXH3_64bits of the whole file
  // Row files, format 3: how the writer encoded the blocks' columns (a block may still keep
  // floats where the encoding would not be smaller: row_file.hpp).
  Codec value_codec = Codec::kNone;
  Codec state_codec = Codec::kNone;
};

struct TableEntry {
  std::string name;
  // The table's whole configuration as it was created; config.name is not stored (it points
  // at `name` after read_manifest).
  embstore_table_config_t config{};
  uint32_t state_dim = 0;
  std::string state_layout;      // e.g. "m[dim] v[dim] beta1_power beta2_power"
  uint64_t rows = 0;             // rows in this version's files
  uint64_t table_rows = 0;       // the table's rows at capture (after a delta is applied)
  std::vector<FileEntry> files;  // row files: one per rank that wrote the table
  // Format 3, deltas with serving_deltas and every version with a serving_dir: the values-only
  // copy of each row file (the same index), the same rows with state_dim 0, in
  // config.serving_codec; empty when none.
  std::vector<FileEntry> serving;
  // Tables with admission: the counts (host/admission/admission.hpp), one file per rank that
  // wrote the table (at most one with world size 1). JSON: an object with world size 1, as
  // since format 1; an array with several ranks.
  std::vector<FileEntry> admission;
};

struct AttachmentEntry {
  std::string name;
  FileEntry file;
  uint32_t rank = 0;  // the rank that attached it ("rank" in JSON with several ranks only)
};

struct Manifest {
  uint32_t format_version = kManifestFormatVersion;
  bool full = true;
  uint64_t version = 0;            // the global step at capture
  std::optional<uint64_t> parent;  // deltas: the version they apply on
  // The ranks that wrote it: each rank's row files and admission counts hold the keys
  // embstore_shard_of gives it; rank 0 wrote the manifest.
  uint32_t world_size = 1;
  int32_t embstore_version = 0;
  // The chain this version belongs to: a random non-zero id drawn by its full checkpoint and
  // copied by every delta on it. 0 in format 1, and along chains that grew from a format 1 one.
  uint64_t lineage = 0;
  // Deltas, format 2: the manifest_xxh3 of the parent's manifest, so that a delta names the
  // exact version it applies on, not merely its number.
  std::optional<uint64_t> parent_xxh3;
  // A version of a serving-only directory (format 3, "serving_only": true; the policy's
  // serving_dir): its row files hold values without optimizer state (state_dim 0, in each
  // table's serving codec), it has no values-only copies, admission counts or attachments, and
  // only followers and a values-only warm start read it. source_xxh3: the manifest checksum of
  // the checkpoint's version it was published from ("source_manifest_xxh3", required there), so
  // that a delta is published only on the serving version of its own parent.
  bool serving_only = false;
  uint64_t source_xxh3 = 0;
  std::vector<TableEntry> tables;
  std::vector<AttachmentEntry> attachments;
  // This manifest's own manifest_xxh3: set by parse_manifest and format_manifest, not stored.
  uint64_t xxh3 = 0;
};

// The format a writer gives m: kManifestFormatVersion when a table or file of m uses a codec, a
// table has values-only files or m is serving-only, else kPlainManifestFormatVersion.
uint32_t manifest_format_for(const Manifest& m);

// A new chain's lineage: random, never 0 (0 means "unknown", as in format 1).
uint64_t new_lineage();

// "sgd", "adagrad", "rowwise_adagrad", "adam" / "zeros", "constant", "uniform", "normal".
const char* optimizer_name(int optimizer);
const char* init_name(int init);
// The optimizer state after a row's value, in words: "" for SGD.
std::string state_layout(int optimizer);

// The manifest as JSON text (pretty-printed, with manifest_xxh3; *xxh3, when given, gets it),
// in m.format_version's format.
std::string format_manifest(const Manifest& m, uint64_t* xxh3 = nullptr);
// Parses and checks text: checksum, format version, every field present and typed, and every
// name and path against the layout (io/format/layout.hpp: check_layout). A manifest is input, never
// an instruction: whatever passes names only files inside its version directory, each once.
int parse_manifest(const std::string& text, Manifest* out, std::string* detail);

// Writes <version_dir>/MANIFEST.json (not fsynced: the commit protocol fsyncs every file);
// *xxh3 (may be null) = its manifest_xxh3. -EFBIG, writing nothing, past kMaxManifestBytes.
int write_manifest(const std::string& version_dir, const Manifest& m, uint64_t* xxh3 = nullptr);
// The largest manifest read (EMBSTORE_MAX_MANIFEST_BYTES): about 200 bytes per file entry, so
// room for 300,000 files (tables x ranks x kinds).
inline constexpr size_t kMaxManifestBytes = EMBSTORE_MAX_MANIFEST_BYTES;
// JSON nested deeper than this does not parse (a manifest nests 4 deep); nlohmann's dump, which
// the manifest checksum runs, recurses once per level.
inline constexpr int kMaxManifestDepth = EMBSTORE_MAX_JSON_DEPTH;

// -ENOENT when the file is missing, -EBADMSG (the reason in *detail) when it does not parse or
// check, is not a regular file (io/engine/regular_file.hpp) or is larger than kMaxManifestBytes.
int read_manifest(const std::string& version_dir, Manifest* out, std::string* detail);

// Writes bytes to path (created or truncated, mode 0644), without fsync.
int write_whole_file(const std::string& path, const void* data, size_t bytes);
// XXH3_64bits of a file's contents, streamed; progress(bytes_done) after each piece when set.
int checksum_file(const std::string& path, uint64_t* xxh3, uint64_t* bytes,
                  void (*progress)(uint64_t bytes_done, void* ctx) = nullptr, void* ctx = nullptr);

}  // namespace embstore::io
