// A table's admission counts in a checkpoint (tables/<table>/admission.counts; the counting is
// in host/admission/). Tables hand over and take their counts as an AdmissionFile, the
// structured form; the bytes are this file's alone. Little-endian, checksummed by the manifest:
//   header (24 bytes): "EMBADMIT", u32 kind, u32 format (1), u64 n
//   kind 0, exact:       n entries
//   kind 1, Bloom:       n one-byte counters (the whole filter)
//   kind 2, exact delta: u64 r, r removed keys (i64, ascending), then n entries: the changes
//                        since the parent version (removals first, then upserts)
//   entry (24 bytes):    i64 key, u32 count (>= 1), u32 0, u64 step last seen
// liburing style: 0 or -errno; -EBADMSG for bytes that do not parse, the reason in *detail.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace embstore::io {

enum class AdmissionKind : uint32_t { kExact = 0, kBloom = 1, kExactDelta = 2 };

struct AdmissionEntry {
  int64_t key = 0;
  uint32_t count = 0;
  uint32_t reserved = 0;  // 0 in files
  uint64_t step = 0;
};
static_assert(sizeof(AdmissionEntry) == 24);

inline constexpr size_t kAdmissionHeaderBytes = 24;

struct AdmissionFile {
  AdmissionKind kind = AdmissionKind::kExact;
  std::vector<AdmissionEntry> entries;  // exact kinds; reserved is written as 0
  std::vector<int64_t> removed;         // exact delta
  std::vector<uint8_t> counters;        // Bloom
};

const char* admission_kind_name(AdmissionKind kind);

// The file's bytes: the header, then removed keys and entries, or the counters.
std::vector<char> format_admission_file(const AdmissionFile& f);

// Parses and checks the bytes: header, sizes, counts >= 1, reserved fields 0, keys listed once.
int parse_admission_file(const std::string& bytes, AdmissionFile* out, std::string* detail);

// The counts a chain's files make at its newest version, whole (exact, keys ascending, or the
// newest Bloom filter): the files given oldest first, applied from the newest whole one on
// (older ones do not matter, whatever their kind). -EBADMSG when a file does not parse, or
// no whole file precedes the deltas.
int merge_admission_files(const std::vector<std::string>& oldest_first, AdmissionFile* out,
                          std::string* detail);
// The same over parsed files (moved from).
int merge_admission(std::vector<AdmissionFile> oldest_first, AdmissionFile* out,
                    std::string* detail);

// One version's counts from the files of its ranks (each rank's keys its own): exact entries
// and removed keys joined (a key in two ranks' files is -EBADMSG), Bloom counters added
// (saturating at 255: the filter of all the ranks' occurrences). All of one kind and, for
// Bloom, one size, else -EBADMSG.
int combine_rank_admission(std::vector<AdmissionFile> ranks, AdmissionFile* out,
                           std::string* detail);

}  // namespace embstore::io
