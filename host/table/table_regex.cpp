#include "host/table/table_regex.hpp"

#include <re2/re2.h>

#include <cstdint>

#include "host/error.hpp"

namespace embstore {
namespace {

// A table regex is at most EMBSTORE_MAX_TABLES_REGEX_BYTES long, so a sane one compiles to a
// few thousand instructions; 1 MiB bounds what a hostile one (nested counted repetitions, large
// classes) may take, and what RE2 keeps for its DFA cache when matching (past it, RE2 falls
// back to its NFA, still linear in the name).
constexpr int64_t kMaxMem = int64_t{1} << 20;

RE2::Options options() {
  RE2::Options o;
  // Table names are ASCII ([A-Za-z0-9_.-]): Latin-1 matches them byte for byte, as std::regex
  // did, without the UTF-8 decoding automaton that '.' and classes would otherwise compile to.
  o.set_encoding(RE2::Options::EncodingLatin1);
  o.set_max_mem(kMaxMem);
  o.set_never_capture(true);  // only whether it matches is asked
  o.set_log_errors(false);    // a caller's bad regex is its error status, not a log line
  return o;
}

}  // namespace

TableRegex TableRegex::compile(const std::string& text, const std::string& what) {
  if (text.size() > EMBSTORE_MAX_TABLES_REGEX_BYTES) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "{}: tables_regex is {} bytes, more than EMBSTORE_MAX_TABLES_REGEX_BYTES ({}); it "
         "begins '{}'",
         what, text.size(), EMBSTORE_MAX_TABLES_REGEX_BYTES, text.substr(0, 64));
  }
  auto re = std::make_unique<const RE2>(text, options());
  if (!re->ok()) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "{}: tables_regex '{}' is not an RE2 regular expression (no backreferences or "
         "lookaround): {}",
         what, text, re->error());
  }
  return TableRegex(std::move(re));
}

TableRegex::TableRegex(std::unique_ptr<const RE2> re) : re_(std::move(re)) {}
TableRegex::TableRegex(TableRegex&&) noexcept = default;
TableRegex& TableRegex::operator=(TableRegex&&) noexcept = default;
TableRegex::~TableRegex() = default;

bool TableRegex::matches(const std::string& name) const { return RE2::FullMatch(name, *re_); }

}  // namespace embstore
