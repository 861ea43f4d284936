// Fuzzes parse_manifest (io/format/manifest.hpp), the MANIFEST.json parser. Checks:
// - it never crashes, leaks or throws, and fails only with -EBADMSG (or -ENOMEM), deeply nested
//   JSON included (a seed of the corpus nests 5000 levels);
// - a manifest it accepts survives a round trip: format_manifest() of it parses again, and the
//   result formats to the same text (abort() otherwise).
// Random bytes almost never carry the right "manifest_xxh3", so every input that is a JSON
// object is parsed a second time with its checksum recomputed the way io/format/manifest.cpp does it
// (XXH3_64bits of the compact dump of the object without "manifest_xxh3", 16 lowercase hex
// digits): that reaches the member checks behind the checksum.
#include <xxhash.h>

#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "io/format/bounded_json.hpp"
#include "io/format/manifest.hpp"

namespace {

using embstore::io::Manifest;
using nlohmann::json;

[[noreturn]] void fail(const char* what, const std::string& a, const std::string& b) {
  std::fprintf(stderr, "manifest_fuzz: %s\n--- first:\n%s\n--- second:\n%s\n", what, a.c_str(),
               b.c_str());
  std::abort();
}

// Parses text and, when it is accepted, checks the round trip.
void check(const std::string& text) {
  Manifest m;
  std::string detail;
  const int r = embstore::io::parse_manifest(text, &m, &detail);
  if (r == -EBADMSG || r == -ENOMEM) return;
  if (r != 0) fail("parse_manifest returned neither 0 nor -EBADMSG/-ENOMEM", text, detail);

  const std::string once = embstore::io::format_manifest(m);
  Manifest again;
  detail.clear();
  if (embstore::io::parse_manifest(once, &again, &detail) != 0) {
    fail("format_manifest() of an accepted manifest does not parse", once, detail);
  }
  const std::string twice = embstore::io::format_manifest(again);
  if (once != twice) fail("the round trip changed the manifest", once, twice);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  check(text);

  // The same object with a correct manifest_xxh3 (parsed as the library does, nesting limited:
  // a deeper one is refused by check() above, and this harness's own dump would recurse).
  json j;
  try {
    j = embstore::io::parse_bounded_json(text, embstore::io::kMaxManifestDepth);
  } catch (const std::exception&) {
    return 0;
  }
  if (!j.is_object()) return 0;
  std::string fixed;
  try {
    j.erase("manifest_xxh3");
    const std::string body = j.dump();
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016" PRIx64, XXH3_64bits(body.data(), body.size()));
    j["manifest_xxh3"] = hex;
    fixed = j.dump();
  } catch (const json::exception&) {
    return 0;  // parse_manifest fails the same way (inside its own try)
  }
  check(fixed);
  return 0;
}
