// Name <-> value lookups for enums that have a Name() function and a list of
// all their values, so each enum spells its names exactly once:
//
//   inline constexpr std::array<Color, 2> kAllColors = {kRed, kBlue};
//   std::optional<Color> c = ParseEnumName(text, kAllColors, &ColorName);
#ifndef LORAPLEX_CORE_COMMON_ENUM_NAMES_H_
#define LORAPLEX_CORE_COMMON_ENUM_NAMES_H_

#include <array>
#include <cstddef>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace loraplex {

template <typename Enum, size_t N>
std::optional<Enum> ParseEnumName(absl::string_view name,
                                  const std::array<Enum, N>& values,
                                  absl::string_view (*to_name)(Enum)) {
  for (Enum value : values) {
    if (to_name(value) == name) return value;
  }
  return std::nullopt;
}

// "a, b, c" for error messages.
template <typename Enum, size_t N>
std::string EnumNameList(const std::array<Enum, N>& values,
                         absl::string_view (*to_name)(Enum)) {
  std::string out;
  for (Enum value : values) {
    if (!out.empty()) out += ", ";
    out += std::string(to_name(value));
  }
  return out;
}

}  // namespace loraplex

#endif  // LORAPLEX_CORE_COMMON_ENUM_NAMES_H_
