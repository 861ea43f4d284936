#include "host/table/table_regex.hpp"

#include <locale>
#include <mutex>

#include "host/error.hpp"

namespace embstore {

std::regex compile_table_regex(const std::string& text, const std::string& what) {
  static std::once_flag narrow_cache;
  std::call_once(narrow_cache, [] {
    const auto& ctype = std::use_facet<std::ctype<char>>(std::locale());
    for (int c = 0; c < 256; ++c) (void)ctype.narrow(static_cast<char>(c), '\0');
  });
  try {
    return std::regex(text, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    fail(EMBSTORE_INVALID_ARGUMENT,
         "{}: tables_regex '{}' is not an ECMAScript regular expression: {}", what, text, e.what());
  }
}

}  // namespace embstore
