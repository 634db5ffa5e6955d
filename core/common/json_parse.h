// Parsing untrusted JSON (config.json, safetensors headers, index files).
//
// nlohmann::json parses any depth and keeps the last of duplicate keys; its
// dump() recurses, so a hostile file of nested brackets could exhaust the
// stack while an error message is being written. These helpers bound the
// depth, report duplicate keys of the top-level object, and describe values
// briefly for error messages.
//
//   LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json root,
//                             ParseUntrustedJson(text, path, {.max_depth =
//                             8}));
#ifndef LORAPLEX_CORE_COMMON_JSON_PARSE_H_
#define LORAPLEX_CORE_COMMON_JSON_PARSE_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

struct JsonParseOptions {
  int max_depth = 16;  // Nesting of objects and arrays allowed.
  bool reject_duplicate_top_level_keys = false;
};

// Parses `text`; errors are INVALID_ARGUMENT and start with `label`.
absl::StatusOr<nlohmann::json> ParseUntrustedJson(
    absl::string_view text, const std::string& label,
    const JsonParseOptions& options = {});

// Reads and parses a whole file; NOT_FOUND when it cannot be read.
absl::StatusOr<nlohmann::json> ReadUntrustedJsonFile(
    const std::string& path, const JsonParseOptions& options = {});

// A short description of `value` for error messages: scalars as JSON
// (truncated), containers by their type.
std::string DescribeJson(const nlohmann::json& value);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_JSON_PARSE_H_
