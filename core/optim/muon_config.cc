#include "core/optim/muon_config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "core/common/enum_names.h"
#include "core/common/number_checks.h"

namespace loraplex {

absl::string_view MuonWeightDecayModeName(MuonWeightDecayMode mode) {
  switch (mode) {
    case MuonWeightDecayMode::kDecoupled:
      return "decoupled";
    case MuonWeightDecayMode::kIndependent:
      return "independent";
    case MuonWeightDecayMode::kL2:
      return "l2";
  }
  return "unknown";
}

std::optional<MuonWeightDecayMode> ParseMuonWeightDecayMode(
    absl::string_view name) {
  return ParseEnumName(name, kAllMuonWeightDecayModes,
                       &MuonWeightDecayModeName);
}

absl::string_view MuonScaleModeName(MuonScaleMode mode) {
  switch (mode) {
    case MuonScaleMode::kSpectral:
      return "spectral";
    case MuonScaleMode::kUnitRmsNorm:
      return "unit_rms_norm";
    case MuonScaleMode::kShapeScaling:
      return "shape_scaling";
  }
  return "unknown";
}

std::optional<MuonScaleMode> ParseMuonScaleMode(absl::string_view name) {
  return ParseEnumName(name, kAllMuonScaleModes, &MuonScaleModeName);
}

double MuonScaleFactor(int64_t rows, int64_t cols, MuonScaleMode mode) {
  const double m = static_cast<double>(rows);
  const double n = static_cast<double>(cols);
  switch (mode) {
    case MuonScaleMode::kSpectral:
      return std::sqrt(std::max(m, n));
    case MuonScaleMode::kUnitRmsNorm:
      return std::sqrt(m / n);
    case MuonScaleMode::kShapeScaling:
      return std::sqrt(std::max(1.0, m / n));
  }
  return 1.0;
}

std::string MuonSettingsError(double lr, double momentum, double weight_decay,
                              double extra_scale_factor, int64_t ns_steps,
                              NewtonSchulzOptions ns) {
  if (!IsFiniteNonNegative(lr)) {
    return absl::StrCat("lr must be a finite number >= 0, got ", lr);
  }
  if (!InUnitInterval(momentum)) {
    return absl::StrCat("momentum must be in [0, 1), got ", momentum);
  }
  if (!IsFiniteNonNegative(weight_decay)) {
    return absl::StrCat("weight_decay must be a finite number >= 0, got ",
                        weight_decay);
  }
  if (!IsFinitePositive(extra_scale_factor)) {
    return absl::StrCat("extra_scale_factor must be a finite number > 0, got ",
                        extra_scale_factor);
  }
  if (ns_steps < 1 || ns_steps > 100) {
    return absl::StrCat("ns_steps must be in [1, 100], got ", ns_steps);
  }
  ns.steps = static_cast<int>(ns_steps);
  return NewtonSchulzOptionsError(ns);
}

}  // namespace loraplex
