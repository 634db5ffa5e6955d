// Typed, optional fields of one JSON object, for configs that come from
// users: every error names the field with its prefix and says what was
// expected ("optimizer.momentum must be a number, got \"high\""), and keys
// nobody asked for are reported so a typo is never silently ignored.
//
//   JsonFields fields(json, "optimizer.");
//   LORAPLEX_RETURN_IF_ERROR(fields.Number("lr", &config.lr));
//   LORAPLEX_RETURN_IF_ERROR(fields.RejectUnknown());
#ifndef LORAPLEX_CORE_COMMON_JSON_FIELDS_H_
#define LORAPLEX_CORE_COMMON_JSON_FIELDS_H_

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "core/common/enum_names.h"
#include "core/common/json_parse.h"

namespace loraplex {

class JsonFields {
 public:
  // `object` must outlive this reader.
  JsonFields(const nlohmann::json& object, std::string prefix);
  JsonFields(nlohmann::json&& object, std::string prefix) = delete;

  // Each reader leaves *out unchanged when the key is absent (keeping the
  // caller's default) and fails when it is present with the wrong type.
  absl::Status Number(const char* key, double* out);
  absl::Status Integer(const char* key, int64_t* out);
  absl::Status Integer(const char* key, int* out);
  absl::Status Bool(const char* key, bool* out);
  absl::Status String(const char* key, std::string* out);
  // A list of numbers of exactly `size` elements.
  absl::Status NumberList(const char* key, size_t size,
                          std::vector<double>* out);
  // The raw value, or nullptr when absent.
  const nlohmann::json* Raw(const char* key);

  // A string naming one of `values` (by `to_name`).
  template <typename Enum, size_t N>
  absl::Status Choice(const char* key, const std::array<Enum, N>& values,
                      absl::string_view (*to_name)(Enum), Enum* out) {
    const nlohmann::json* raw = Raw(key);
    if (raw == nullptr) return absl::OkStatus();
    std::optional<Enum> value;
    if (raw->is_string()) {
      value = ParseEnumName(raw->get<std::string>(), values, to_name);
    }
    if (!value.has_value()) {
      return Invalid(
          key, absl::StrCat("must be one of ", EnumNameList(values, to_name),
                            "; got ", DescribeJson(*raw)));
    }
    *out = *value;
    return absl::OkStatus();
  }

  // INVALID_ARGUMENT for the input not being an object, or for keys that
  // no reader asked for.
  absl::Status RejectUnknown() const;

  absl::Status Invalid(const char* key, absl::string_view reason) const;

 private:
  const nlohmann::json& object_;
  std::string prefix_;
  std::set<std::string> known_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_JSON_FIELDS_H_
