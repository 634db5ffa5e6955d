#include "core/common/json_parse.h"

#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"

namespace loraplex {

absl::StatusOr<nlohmann::json> ParseUntrustedJson(
    absl::string_view text, const std::string& label,
    const JsonParseOptions& options) {
  using Event = nlohmann::json::parse_event_t;
  bool too_deep = false;
  std::set<std::string> seen;
  std::string duplicate;
  auto on_event = [&](int depth, Event event, nlohmann::json& parsed) {
    if ((event == Event::object_start || event == Event::array_start) &&
        depth >= options.max_depth) {
      too_deep = true;
    }
    if (options.reject_duplicate_top_level_keys && event == Event::key &&
        depth == 1 && duplicate.empty() && parsed.is_string()) {
      std::string key = parsed.get<std::string>();
      if (!seen.insert(key).second) duplicate = std::move(key);
    }
    // Discard what lies too deep so no deep structure is ever built.
    return !too_deep;
  };
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": not valid JSON: ", e.what()));
  }
  if (too_deep) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": JSON nested deeper than ", options.max_depth, " levels"));
  }
  if (!duplicate.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": key \"", duplicate, "\" appears more than once"));
  }
  return root;
}

absl::StatusOr<nlohmann::json> ReadUntrustedJsonFile(
    const std::string& path, const JsonParseOptions& options) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseUntrustedJson(text, path, options);
}

std::string DescribeJson(const nlohmann::json& value) {
  if (value.is_structured()) return absl::StrCat("a JSON ", value.type_name());
  std::string text =
      value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  constexpr size_t kMax = 64;
  if (text.size() > kMax) text = text.substr(0, kMax) + "...";
  return text;
}

}  // namespace loraplex
