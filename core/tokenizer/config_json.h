// Reading the component objects of a tokenizer.json ({"type": ..., ...}):
// errors that name where in the file the problem is, and the Sequence
// wrapper every component kind has.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::string type,
//                             ComponentType(config, "normalizer"));
//   if (type == "Sequence") {
//     return ForEachInSequence(config, "normalizers", where, depth, add);
//   }
#ifndef LORAPLEX_CORE_TOKENIZER_CONFIG_JSON_H_
#define LORAPLEX_CORE_TOKENIZER_CONFIG_JSON_H_

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

// INVALID_ARGUMENT "`where`: `reason`".
absl::Status ConfigError(const std::string& where, absl::string_view reason);

// The string "type" of a component object.
absl::StatusOr<std::string> ComponentType(const nlohmann::json& config,
                                          const std::string& where);

// `key` of `config`: true or false; `fallback` when absent or null.
absl::StatusOr<bool> BoolField(const nlohmann::json& config, const char* key,
                               bool fallback, const std::string& where);

// A string `key`.
absl::StatusOr<std::string> StringField(const nlohmann::json& config,
                                        const char* key,
                                        const std::string& where);
// A string `key` of exactly one code point.
absl::StatusOr<char32_t> CharField(const nlohmann::json& config,
                                   const char* key, const std::string& where);
// A non-negative integer `key`.
absl::StatusOr<size_t> CountField(const nlohmann::json& config, const char* key,
                                  const std::string& where);

// Calls `add(item, where_of_item, depth + 1)` for each element of the
// Sequence's list `key` ("normalizers", "pretokenizers", ...), which may
// nest at most 8 deep.
absl::Status ForEachInSequence(
    const nlohmann::json& config, const char* key, const std::string& where,
    int depth,
    const std::function<absl::Status(const nlohmann::json&, const std::string&,
                                     int)>& add);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_CONFIG_JSON_H_
