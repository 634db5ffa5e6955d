// Muon's settings as plain values: the weight-decay and update-scale modes
// (docs/DESIGN.md §4) with the names the API spells them by, the scale factor
// they imply, and the validation MuonOptions and OptimizerConfig share. No
// LibTorch here; the optimizer is in muon.h.
#ifndef LORAPLEX_CORE_OPTIM_MUON_CONFIG_H_
#define LORAPLEX_CORE_OPTIM_MUON_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"
#include "core/optim/newton_schulz_config.h"

namespace loraplex {

enum class MuonWeightDecayMode {
  kDecoupled,    // p -= lr·wd·p (AdamW-style).
  kIndependent,  // p -= wd·p, independent of the learning rate.
  kL2,           // g += wd·p before the momentum update.
};

enum class MuonScaleMode {
  kSpectral,     // sqrt(max(m, n)).
  kUnitRmsNorm,  // sqrt(m / n).
  kShapeScaling  // sqrt(max(1, m / n)).
};

inline constexpr std::array<MuonWeightDecayMode, 3> kAllMuonWeightDecayModes = {
    MuonWeightDecayMode::kDecoupled, MuonWeightDecayMode::kIndependent,
    MuonWeightDecayMode::kL2};
inline constexpr std::array<MuonScaleMode, 3> kAllMuonScaleModes = {
    MuonScaleMode::kSpectral, MuonScaleMode::kUnitRmsNorm,
    MuonScaleMode::kShapeScaling};

absl::string_view MuonWeightDecayModeName(MuonWeightDecayMode mode);
std::optional<MuonWeightDecayMode> ParseMuonWeightDecayMode(
    absl::string_view name);
absl::string_view MuonScaleModeName(MuonScaleMode mode);
std::optional<MuonScaleMode> ParseMuonScaleMode(absl::string_view name);

// The factor applied to NS(u) for an m×n parameter (before
// extra_scale_factor).
double MuonScaleFactor(int64_t rows, int64_t cols, MuonScaleMode mode);

// Empty when these Muon settings are usable, else "<field> ..., got
// <value>" (lr and weight_decay finite and >= 0, momentum in [0, 1),
// extra_scale_factor finite and > 0, ns_steps in [1, 100], then
// NewtonSchulzOptionsError of `ns` with that step count).
std::string MuonSettingsError(double lr, double momentum, double weight_decay,
                              double extra_scale_factor, int64_t ns_steps,
                              NewtonSchulzOptions ns);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_MUON_CONFIG_H_
