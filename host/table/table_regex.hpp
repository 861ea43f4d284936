// The regular expressions that select tables by name (warm start's sources, a follower's
// tables): RE2 syntax, compiled the same way everywhere, whole names matched. RE2 and not
// std::regex because these come from callers: RE2 parses without recursion and matches in time
// linear in the name, where std::regex's compiler overflowed the stack on deep nesting and its
// backtracking took minutes on patterns such as (a+)+$.
#pragma once

#include <memory>
#include <string>

namespace re2 {
class RE2;
}  // namespace re2

namespace embstore {

class TableRegex {
 public:
  // Throws Error(INVALID_ARGUMENT) naming `what` when text is longer than
  // EMBSTORE_MAX_TABLES_REGEX_BYTES or does not compile (bad syntax, backreferences and
  // lookaround, which RE2 leaves out, or a program over the memory bound).
  static TableRegex compile(const std::string& text, const std::string& what);

  TableRegex(TableRegex&&) noexcept;
  TableRegex& operator=(TableRegex&&) noexcept;
  ~TableRegex();

  // Whether the regex matches the whole of name. Safe from several threads at once.
  bool matches(const std::string& name) const;

 private:
  explicit TableRegex(std::unique_ptr<const re2::RE2> re);

  std::unique_ptr<const re2::RE2> re_;
};

}  // namespace embstore
