#include "core/optim/newton_schulz_config.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/common/enum_names.h"

namespace loraplex {

const std::vector<NsCoefficients>& BuiltinNsCoefficients(NsCoefficientSet set) {
  static const auto* const kSimple =
      new std::vector<NsCoefficients>{{3.4445, -4.7750, 2.0315}};
  static const auto* const kQuintic =
      new std::vector<NsCoefficients>{{4.0848, -6.8946, 2.9270},
                                      {3.9505, -6.3029, 2.6377},
                                      {3.7418, -5.5913, 2.3037},
                                      {2.8769, -3.1427, 1.2046},
                                      {2.8366, -3.0525, 1.2012}};
  static const auto* const kPolarExpress = new std::vector<NsCoefficients>{
      {8.2051, -22.9019, 16.4607}, {4.0664, -2.8612, 0.5184},
      {3.9096, -2.8234, 0.5250},   {3.2856, -2.4153, 0.4853},
      {2.2779, -1.6198, 0.3985},   {1.8726, -1.2307, 0.3585},
      {1.8564, -1.2132, 0.3568},   {1.8750, -1.2500, 0.3750}};
  static const auto* const kAol =
      new std::vector<NsCoefficients>{{4.0098, -7.0585, 2.4635},
                                      {3.4585, -5.5479, 2.5959},
                                      {2.7573, -3.2939, 1.4254},
                                      {2.7215, -3.0494, 1.3169}};
  static const auto* const kNone = new std::vector<NsCoefficients>{};
  switch (set) {
    case NsCoefficientSet::kSimple:
      return *kSimple;
    case NsCoefficientSet::kQuintic:
      return *kQuintic;
    case NsCoefficientSet::kPolarExpress:
      return *kPolarExpress;
    case NsCoefficientSet::kAol:
      return *kAol;
    case NsCoefficientSet::kCustom:
      break;
  }
  return *kNone;
}

absl::string_view NsCoefficientSetName(NsCoefficientSet set) {
  switch (set) {
    case NsCoefficientSet::kSimple:
      return "simple";
    case NsCoefficientSet::kQuintic:
      return "quintic";
    case NsCoefficientSet::kPolarExpress:
      return "polar_express";
    case NsCoefficientSet::kAol:
      return "aol";
    case NsCoefficientSet::kCustom:
      return "custom";
  }
  return "unknown";
}

std::optional<NsCoefficientSet> ParseNsCoefficientSet(absl::string_view name) {
  return ParseEnumName(name, kAllNsCoefficientSets, &NsCoefficientSetName);
}

absl::string_view NsPrecisionName(NsPrecision precision) {
  return precision == NsPrecision::kBf16 ? "bf16" : "fp32";
}

std::optional<NsPrecision> ParseNsPrecision(absl::string_view name) {
  return ParseEnumName(name, kAllNsPrecisions, &NsPrecisionName);
}

std::string NewtonSchulzOptionsError(const NewtonSchulzOptions& options) {
  if (options.steps < 1) {
    return absl::StrCat("ns_steps must be >= 1, got ", options.steps);
  }
  if (options.coefficient_set == NsCoefficientSet::kCustom) {
    if (options.custom_coefficients.empty()) {
      return "coefficient_set is custom but custom_coefficients is empty";
    }
    for (size_t i = 0; i < options.custom_coefficients.size(); ++i) {
      const NsCoefficients& t = options.custom_coefficients[i];
      if (!std::isfinite(t.a) || !std::isfinite(t.b) || !std::isfinite(t.c)) {
        return absl::StrCat("custom_coefficients[", i, "] is not finite");
      }
    }
  }
  return "";
}

}  // namespace loraplex
