// JSON read from a checkpoint directory (manifests, leases): nesting is limited while parsing,
// so that nothing afterwards recurses deeper than that (nlohmann's parser is iterative, its
// dump and comparisons are not: 200 KB of '[' overflowed the stack of every reader).
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace embstore::io {

struct JsonTooDeep : std::runtime_error {
  explicit JsonTooDeep(int max_depth)
      : std::runtime_error("JSON nested deeper than " + std::to_string(max_depth) + " levels") {}
};

// Parses text; throws nlohmann::json::exception for bad JSON, JsonTooDeep past max_depth.
inline nlohmann::json parse_bounded_json(const std::string& text, int max_depth) {
  return nlohmann::json::parse(
      text, [max_depth](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
        if (depth > max_depth) throw JsonTooDeep(max_depth);
        return true;
      });
}

}  // namespace embstore::io
