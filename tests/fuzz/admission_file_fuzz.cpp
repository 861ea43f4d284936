// Fuzzes the admission counts parser and merger (io/format/admission_file.hpp). Checks:
// - parse_admission_file never crashes, leaks or throws, and fails only with -EBADMSG;
// - a file it accepts is fully determined by what it parsed: format_admission_file of it gives
//   the input bytes back (abort() otherwise);
// - merge_admission_files of the input split in two (at a position taken from its first two
//   bytes) fails only with -EBADMSG, and what it returns parses as a whole (non-delta) file,
//   equal to the newer file when that one is whole, else to the older file's entries with the
//   newer one's removals and changes applied.
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "io/format/admission_file.hpp"

namespace {

using embstore::io::AdmissionEntry;
using embstore::io::AdmissionFile;
using embstore::io::AdmissionKind;

[[noreturn]] void fail(const char* what, const std::string& detail = "") {
  std::fprintf(stderr, "admission_file_fuzz: %s %s\n", what, detail.c_str());
  std::abort();
}

// The bytes of a parsed file, written back by the format's own writer.
std::string serialize(const AdmissionFile& f) {
  const std::vector<char> out = embstore::io::format_admission_file(f);
  return std::string(out.begin(), out.end());
}

// Parses bytes; on success checks the file's invariants. Returns the parse result.
int parse_and_check(const std::string& bytes, AdmissionFile* f) {
  std::string detail;
  const int r = embstore::io::parse_admission_file(bytes, f, &detail);
  if (r == -EBADMSG) {
    if (detail.empty()) fail("-EBADMSG without a reason");
    return r;
  }
  if (r != 0) fail("parse_admission_file returned neither 0 nor -EBADMSG", std::to_string(r));
  if (f->kind != AdmissionKind::kExactDelta && !f->removed.empty()) {
    fail("removed keys in a whole file");
  }
  if (f->kind == AdmissionKind::kBloom ? !f->entries.empty() : !f->counters.empty()) {
    fail("entries and counters mixed");
  }
  for (const AdmissionEntry& e : f->entries) {
    if (e.count == 0) fail("an accepted entry has count 0");
  }
  if (serialize(*f) != bytes) fail("the parsed file does not write back to its bytes");
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  AdmissionFile whole;
  parse_and_check(bytes, &whole);

  // Two files of a chain, oldest first: the rest of the input cut where its first two bytes say.
  if (size < 2) return 0;
  const size_t rest = size - 2;
  const size_t cut = (size_t{data[0]} | size_t{data[1]} << 8) % (rest + 1);
  const std::vector<std::string> chain = {bytes.substr(2, cut), bytes.substr(2 + cut)};
  AdmissionFile merged;
  std::string detail;
  const int r = embstore::io::merge_admission_files(chain, &merged, &detail);
  if (r == -EBADMSG) {
    if (detail.empty()) fail("merge: -EBADMSG without a reason");
    return 0;
  }
  if (r != 0) fail("merge_admission_files returned neither 0 nor -EBADMSG", std::to_string(r));
  AdmissionFile out;
  const std::string merged_bytes = serialize(merged);
  if (parse_and_check(merged_bytes, &out) != 0) fail("the merged file does not parse");
  if (out.kind == AdmissionKind::kExactDelta) fail("the merge returned a delta");
  AdmissionFile newest;
  if (parse_and_check(chain[1], &newest) != 0) fail("merge accepted a file that does not parse");
  if (newest.kind != AdmissionKind::kExactDelta) {
    if (merged_bytes != chain[1]) fail("the merge of a chain ending in a whole file is not it");
    return 0;
  }
  AdmissionFile oldest;
  if (parse_and_check(chain[0], &oldest) != 0) fail("merge accepted a file that does not parse");
  if (oldest.kind != AdmissionKind::kExact) fail("merge applied a delta on a non-exact file");
  std::map<int64_t, AdmissionEntry> expect;
  for (const AdmissionEntry& e : oldest.entries) expect[e.key] = e;
  for (int64_t k : newest.removed) expect.erase(k);
  for (const AdmissionEntry& e : newest.entries) expect[e.key] = e;
  if (out.kind != AdmissionKind::kExact || out.entries.size() != expect.size()) {
    fail("the merged file has the wrong kind or size");
  }
  size_t i = 0;
  for (const auto& [key, e] : expect) {
    if (std::memcmp(&out.entries[i++], &e, sizeof e) != 0) fail("a merged entry differs");
  }
  return 0;
}
