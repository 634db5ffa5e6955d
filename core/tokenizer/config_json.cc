#include "core/tokenizer/config_json.h"

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {

// tokenizer.json files nest Sequences two deep at most.
constexpr int kMaxSequenceDepth = 8;

absl::Status ConfigError(const std::string& where, absl::string_view reason) {
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", reason));
}

absl::StatusOr<std::string> ComponentType(const nlohmann::json& config,
                                          const std::string& where) {
  if (!config.is_object() || !config.contains("type") ||
      !config["type"].is_string()) {
    return ConfigError(where, absl::StrCat("must be an object with a string "
                                           "\"type\", got ",
                                           DescribeJson(config)));
  }
  return config["type"].get<std::string>();
}

absl::Status ForEachInSequence(
    const nlohmann::json& config, const char* key, const std::string& where,
    int depth,
    const std::function<absl::Status(const nlohmann::json&, const std::string&,
                                     int)>& add) {
  if (depth >= kMaxSequenceDepth || !config.contains(key) ||
      !config[key].is_array()) {
    return ConfigError(where, absl::StrCat("a Sequence needs a \"", key,
                                           "\" list (nested at most ",
                                           kMaxSequenceDepth, " deep)"));
  }
  const nlohmann::json& list = config[key];
  for (size_t i = 0; i < list.size(); ++i) {
    LORAPLEX_RETURN_IF_ERROR(
        add(list[i], absl::StrCat(where, ".", key, "[", i, "]"), depth + 1));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> BoolField(const nlohmann::json& config, const char* key,
                               bool fallback, const std::string& where) {
  if (!config.contains(key) || config[key].is_null()) return fallback;
  if (!config[key].is_boolean()) {
    return ConfigError(where,
                       absl::StrCat("\"", key, "\" must be true or false, got ",
                                    DescribeJson(config[key])));
  }
  return config[key].get<bool>();
}

absl::StatusOr<std::string> StringField(const nlohmann::json& config,
                                        const char* key,
                                        const std::string& where) {
  if (!config.contains(key) || !config[key].is_string()) {
    return ConfigError(
        where, absl::StrCat("\"", key, "\" must be a string, got ",
                            config.contains(key) ? DescribeJson(config[key])
                                                 : std::string("nothing")));
  }
  return config[key].get<std::string>();
}

// A string of exactly one code point.
absl::StatusOr<char32_t> CharField(const nlohmann::json& config,
                                   const char* key, const std::string& where) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string text, StringField(config, key, where));
  size_t pos = 0;
  if (text.empty() || !IsValidUtf8(text) ||
      (NextCodePoint(text, &pos), pos != text.size())) {
    return ConfigError(where,
                       absl::StrCat("\"", key, "\" must be one character, got ",
                                    DescribeJson(config[key])));
  }
  pos = 0;
  return NextCodePoint(text, &pos);
}

absl::StatusOr<size_t> CountField(const nlohmann::json& config, const char* key,
                                  const std::string& where) {
  if (!config.contains(key) || !config[key].is_number_integer() ||
      (!config[key].is_number_unsigned() && config[key].get<int64_t>() < 0)) {
    return ConfigError(
        where,
        absl::StrCat("\"", key, "\" must be a non-negative integer, got ",
                     config.contains(key) ? DescribeJson(config[key])
                                          : std::string("nothing")));
  }
  return config[key].is_number_unsigned()
             ? config[key].get<size_t>()
             : static_cast<size_t>(config[key].get<int64_t>());
}

}  // namespace loraplex
