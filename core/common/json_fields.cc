#include "core/common/json_fields.h"

#include <limits>
#include <utility>

#include "absl/strings/str_join.h"

namespace loraplex {

JsonFields::JsonFields(const nlohmann::json& object, std::string prefix)
    : object_(object), prefix_(std::move(prefix)) {}

const nlohmann::json* JsonFields::Raw(const char* key) {
  known_.insert(key);
  if (!object_.is_object()) return nullptr;
  auto it = object_.find(key);
  return it == object_.end() ? nullptr : &*it;
}

absl::Status JsonFields::Invalid(const char* key,
                                 absl::string_view reason) const {
  return absl::InvalidArgumentError(absl::StrCat(prefix_, key, " ", reason));
}

absl::Status JsonFields::Number(const char* key, double* out) {
  const nlohmann::json* value = Raw(key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number()) {
    return Invalid(
        key, absl::StrCat("must be a number, got ", DescribeJson(*value)));
  }
  *out = value->get<double>();
  return absl::OkStatus();
}

absl::Status JsonFields::Integer(const char* key, int64_t* out) {
  const nlohmann::json* value = Raw(key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_number_integer()) {
    return Invalid(
        key, absl::StrCat("must be an integer, got ", DescribeJson(*value)));
  }
  if (value->is_number_unsigned() &&
      value->get<uint64_t>() >
          static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    return Invalid(key,
                   absl::StrCat("is out of range, got ", DescribeJson(*value)));
  }
  *out = value->get<int64_t>();
  return absl::OkStatus();
}

absl::Status JsonFields::Integer(const char* key, int* out) {
  int64_t wide = *out;
  absl::Status status = Integer(key, &wide);
  if (!status.ok()) return status;
  if (wide < std::numeric_limits<int>::min() ||
      wide > std::numeric_limits<int>::max()) {
    return Invalid(key, absl::StrCat("is out of range, got ", wide));
  }
  *out = static_cast<int>(wide);
  return absl::OkStatus();
}

absl::Status JsonFields::Bool(const char* key, bool* out) {
  const nlohmann::json* value = Raw(key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_boolean()) {
    return Invalid(
        key, absl::StrCat("must be true or false, got ", DescribeJson(*value)));
  }
  *out = value->get<bool>();
  return absl::OkStatus();
}

absl::Status JsonFields::String(const char* key, std::string* out) {
  const nlohmann::json* value = Raw(key);
  if (value == nullptr) return absl::OkStatus();
  if (!value->is_string()) {
    return Invalid(
        key, absl::StrCat("must be a string, got ", DescribeJson(*value)));
  }
  *out = value->get<std::string>();
  return absl::OkStatus();
}

absl::Status JsonFields::NumberList(const char* key, size_t size,
                                    std::vector<double>* out) {
  const nlohmann::json* value = Raw(key);
  if (value == nullptr) return absl::OkStatus();
  bool ok = value->is_array() && value->size() == size;
  for (size_t i = 0; ok && i < size; ++i) ok = (*value)[i].is_number();
  if (!ok) {
    return Invalid(key, absl::StrCat("must be a list of ", size,
                                     " numbers, got ", DescribeJson(*value)));
  }
  out->clear();
  for (const auto& element : *value) out->push_back(element.get<double>());
  return absl::OkStatus();
}

absl::Status JsonFields::RejectUnknown() const {
  if (!object_.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix_.empty() ? "config" : prefix_.substr(0, prefix_.size() - 1),
        " must be a JSON object, got ", DescribeJson(object_)));
  }
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (known_.count(it.key()) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          prefix_, it.key(),
          " is not a known field (known: ", absl::StrJoin(known_, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

}  // namespace loraplex
