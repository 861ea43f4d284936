// The ECMAScript regular expressions that select tables by name (warm start's sources, a
// follower's tables): compiled the same way everywhere, whole names matched.
#pragma once

#include <regex>
#include <string>

namespace embstore {

// Throws Error(INVALID_ARGUMENT) naming `what` when text does not compile. Safe to call from
// several threads at once (ranks as threads compile their regexes together): libstdc++'s
// regex scanner fills the locale's narrow() cache as it goes, so the cache is filled once
// first, and compiling only reads it.
std::regex compile_table_regex(const std::string& text, const std::string& what);

}  // namespace embstore
