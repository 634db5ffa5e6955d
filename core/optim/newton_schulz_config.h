// Newton–Schulz settings as plain values: the coefficient sets of
// docs/DESIGN.md §4 and their tables, the iteration count and the precision,
// with names as the API spells them and validation. No LibTorch here;
// NewtonSchulz (newton_schulz.h) runs the iteration.
//
//   NewtonSchulzOptions ns{.coefficient_set = NsCoefficientSet::kPolarExpress,
//                          .steps = 8};
//   if (std::string error = NewtonSchulzOptionsError(ns); !error.empty()) ...
#ifndef LORAPLEX_CORE_OPTIM_NEWTON_SCHULZ_CONFIG_H_
#define LORAPLEX_CORE_OPTIM_NEWTON_SCHULZ_CONFIG_H_

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace loraplex {

// One iteration's polynomial coefficients (a, b, c).
struct NsCoefficients {
  double a = 0.0;
  double b = 0.0;
  double c = 0.0;
};

enum class NsCoefficientSet {
  kSimple,        // One tuple, cycled (Keller Jordan's Muon).
  kQuintic,       // Five tuples, cycled (Megatron-LM default).
  kPolarExpress,  // Eight tuples; the last repeats past the end.
  kAol,           // Four tuples, cycled.
  kCustom,        // The caller's own list, cycled.
};

enum class NsPrecision {
  kFp32,  // Whole iteration in fp32.
  kBf16,  // Loop in bf16 ("medium" matmul precision); result back in fp32.
};

inline constexpr std::array<NsCoefficientSet, 5> kAllNsCoefficientSets = {
    NsCoefficientSet::kSimple, NsCoefficientSet::kQuintic,
    NsCoefficientSet::kPolarExpress, NsCoefficientSet::kAol,
    NsCoefficientSet::kCustom};
inline constexpr std::array<NsPrecision, 2> kAllNsPrecisions = {
    NsPrecision::kFp32, NsPrecision::kBf16};

struct NewtonSchulzOptions {
  NsCoefficientSet coefficient_set = NsCoefficientSet::kQuintic;
  // Used only with kCustom; must then be non-empty.
  std::vector<NsCoefficients> custom_coefficients;
  int steps = 5;  // At least 1.
  NsPrecision precision = NsPrecision::kFp32;
};

// The published table of a built-in set (empty for kCustom).
const std::vector<NsCoefficients>& BuiltinNsCoefficients(NsCoefficientSet set);

absl::string_view NsCoefficientSetName(NsCoefficientSet set);
std::optional<NsCoefficientSet> ParseNsCoefficientSet(absl::string_view name);
absl::string_view NsPrecisionName(NsPrecision precision);
std::optional<NsPrecision> ParseNsPrecision(absl::string_view name);

// Empty when the options are usable, else the reason ("ns_steps must be
// >= 1, got 0").
std::string NewtonSchulzOptionsError(const NewtonSchulzOptions& options);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_NEWTON_SCHULZ_CONFIG_H_
