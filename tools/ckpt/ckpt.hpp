// What the subcommands of embstore-ckpt (ckpt_main.cpp, compact.cpp) share.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "host/checkpoint/restore_plan.hpp"
#include "io/engine/engine.hpp"
#include "io/format/chain.hpp"
#include "io/format/commit.hpp"
#include "tools/ckpt/progress.hpp"

namespace embstore::ckpt {

inline constexpr int kExitOk = 0;
inline constexpr int kExitProblem = 1;
inline constexpr int kExitUsage = 2;

// A problem found (corruption, something missing): main prints it and exits 1.
struct Problem : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Bad usage that CLI11 cannot see (a malformed --version): exit 2.
struct Usage : std::runtime_error {
  using std::runtime_error::runtime_error;
};

using io::detail::errno_text;

// "512 B", "268.0 KiB", "12.5 MiB".
std::string human(uint64_t bytes);
// "1 file", "3 files".
std::string plural(uint64_t n, const char* one, const char* many);

// --json's output: one object on stdout. A name that is not UTF-8 (a directory's, a table's
// from a forged manifest) has its bad bytes replaced rather than failing the dump.
void print_json(const nlohmann::json& j);

// The committed version directories of dir; a Problem when dir cannot be listed.
std::vector<io::VersionDir> versions_of(const std::string& dir);

// --version: a number, a version directory name, or "latest".
struct VersionSpec {
  bool latest = false;
  uint64_t version = 0;
  std::optional<bool> full;  // set when given as a directory name
  std::string text;
};

// Throws Usage for anything else.
VersionSpec parse_version_spec(const std::string& text);

// The version spec names as restore chooses it (io::CheckpointDir::choose) in *index: 0, or
// choose's -EBADMSG/-errno when its manifest does not read (*index and *detail name it). Throws
// a Problem when there is no such version.
int choose_version(io::CheckpointDir& checkpoints, const VersionSpec& spec, size_t* index,
                   std::string* detail);

// The plan of the version --version names in checkpoints (restore's own), or a Problem. The
// plan points into checkpoints: keep it alive.
checkpoint::RestorePlan plan_of(io::CheckpointDir& checkpoints, const std::string& version_text);

// embstore-ckpt compact DIR --version V --out OUT (world_size 1), and
// embstore-ckpt reshard DIR --version V --world-size W --out OUT.
int cmd_compact(const std::string& dir, const std::string& version_text, const std::string& out,
                uint32_t world_size, ProgressWhen progress);

// embstore-ckpt export DIR --version V --table T --out PREFIX (export.cpp).
int cmd_export(const std::string& dir, const std::string& version_text, const std::string& table,
               const std::string& prefix, ProgressWhen progress);

// embstore-ckpt verify DIR [--version V] [--json] [--serving] (verify.cpp). With json, one JSON
// object on stdout: {"directory", "ok", "versions": [{"name", "ok", "status", "problem", ...}]}.
// serving: serving-only versions pass as followers read them (else they fail: restore refuses).
int cmd_verify(const std::string& dir, const std::optional<std::string>& version_text,
               ProgressWhen progress, bool json, bool serving = false);

// Why restore of versions()[index] would fail before it reads a row: its plan (manifests,
// links, world size, configurations) and every file it would read there with its size, as
// "EMBSTORE_CORRUPT: <why>"; "" when nothing is wrong so far. ls's RESTORABLE column.
std::string restore_problem(io::CheckpointDir& checkpoints, size_t index);

}  // namespace embstore::ckpt
