#include "core/optim/optimizer_config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/enum_names.h"

namespace loraplex {
namespace {

bool InUnitInterval(double value) { return value >= 0.0 && value < 1.0; }

}  // namespace

absl::string_view OptimizerFamilyName(OptimizerFamily family) {
  switch (family) {
    case OptimizerFamily::kAdamW:
      return "adamw";
    case OptimizerFamily::kAdam:
      return "adam";
    case OptimizerFamily::kMuon:
      return "muon";
  }
  return "unknown";
}

std::optional<OptimizerFamily> ParseOptimizerFamily(absl::string_view name) {
  return ParseEnumName(name, kAllOptimizerFamilies, &OptimizerFamilyName);
}

MuonOptions MuonOptionsFromConfig(const OptimizerConfig& config) {
  return MuonOptions(config.lr)
      .momentum(config.momentum)
      .nesterov(config.nesterov)
      .weight_decay(config.weight_decay)
      .weight_decay_mode(config.weight_decay_mode)
      .coefficient_set(config.coefficient_set)
      .custom_coefficients(config.custom_coefficients)
      .ns_steps(config.ns_steps)
      .precision(config.ns_precision)
      .scale_mode(config.scale_mode)
      .extra_scale_factor(config.extra_scale_factor);
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.", parts...));
  };
  if (!std::isfinite(config.lr) || config.lr < 0.0) {
    return invalid("lr must be a finite number >= 0, got ", config.lr);
  }
  if (!std::isfinite(config.weight_decay) || config.weight_decay < 0.0) {
    return invalid("weight_decay must be a finite number >= 0, got ",
                   config.weight_decay);
  }
  if (!InUnitInterval(config.beta1)) {
    return invalid("beta1 must be in [0, 1), got ", config.beta1);
  }
  if (!InUnitInterval(config.beta2)) {
    return invalid("beta2 must be in [0, 1), got ", config.beta2);
  }
  if (!std::isfinite(config.eps) || config.eps <= 0.0) {
    return invalid("eps must be a finite number > 0, got ", config.eps);
  }
  if (config.family == OptimizerFamily::kMuon) {
    // Muon's own validation speaks in field names, so prefixing it gives
    // "optimizer.momentum must be ...".
    const std::string error = MuonOptionsError(MuonOptionsFromConfig(config));
    if (!error.empty()) return invalid(error);
  }
  return absl::OkStatus();
}

}  // namespace loraplex
