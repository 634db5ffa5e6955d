#include "core/optim/optimizer_config.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/common/enum_names.h"
#include "core/common/number_checks.h"

namespace loraplex {

absl::string_view OptimizerFamilyName(OptimizerFamily family) {
  switch (family) {
    case OptimizerFamily::kAdamW:
      return "adamw";
    case OptimizerFamily::kAdam:
      return "adam";
    case OptimizerFamily::kMuon:
      return "muon";
    case OptimizerFamily::kLion:
      return "lion";
    case OptimizerFamily::kSoap:
      return "soap";
  }
  return "unknown";
}

std::optional<OptimizerFamily> ParseOptimizerFamily(absl::string_view name) {
  return ParseEnumName(name, kAllOptimizerFamilies, &OptimizerFamilyName);
}

absl::string_view ScalarOptimizerName(ScalarOptimizer scalar) {
  switch (scalar) {
    case ScalarOptimizer::kAdamW:
      return "adamw";
    case ScalarOptimizer::kLion:
      return "lion";
  }
  return "unknown";
}

std::optional<ScalarOptimizer> ParseScalarOptimizer(absl::string_view name) {
  return ParseEnumName(name, kAllScalarOptimizers, &ScalarOptimizerName);
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& config) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer.", parts...));
  };
  // Muon's own validation covers lr, weight_decay and every Muon knob and
  // speaks in field names, so prefixing it gives "optimizer.momentum must
  // be ...". The Muon knobs are checked for every family: a bad value is a
  // mistake even where it is unused.
  NewtonSchulzOptions ns;
  ns.coefficient_set = config.coefficient_set;
  ns.custom_coefficients = config.custom_coefficients;
  ns.precision = config.ns_precision;
  const std::string error =
      MuonSettingsError(config.lr, config.momentum, config.weight_decay,
                        config.extra_scale_factor, config.ns_steps, ns);
  if (!error.empty()) return invalid(error);
  if (config.lr == 0.0) {
    return invalid("lr must be > 0 (0 would train nothing), got 0");
  }
  // Named as the API and the JSON form spell them.
  if (!InUnitInterval(config.beta1)) {
    return invalid("betas[0] must be in [0, 1), got ", config.beta1);
  }
  if (!InUnitInterval(config.beta2)) {
    return invalid("betas[1] must be in [0, 1), got ", config.beta2);
  }
  if (!InUnitInterval(config.lion_beta1)) {
    return invalid("lion_betas[0] must be in [0, 1), got ", config.lion_beta1);
  }
  if (!InUnitInterval(config.lion_beta2)) {
    return invalid("lion_betas[1] must be in [0, 1), got ", config.lion_beta2);
  }
  if (!InUnitInterval(config.soap_beta1)) {
    return invalid("soap_betas[0] must be in [0, 1), got ", config.soap_beta1);
  }
  if (!InUnitInterval(config.soap_beta2)) {
    return invalid("soap_betas[1] must be in [0, 1), got ", config.soap_beta2);
  }
  if (!InUnitInterval(config.shampoo_beta)) {
    return invalid("shampoo_beta must be in [0, 1), got ", config.shampoo_beta);
  }
  if (config.precondition_frequency < 1) {
    return invalid("precondition_frequency must be >= 1, got ",
                   config.precondition_frequency);
  }
  if (config.max_precond_dim < 0) {
    return invalid("max_precond_dim must be >= 0 (0: no limit), got ",
                   config.max_precond_dim);
  }
  if (config.power_iter_steps < 1 || config.power_iter_steps > 100) {
    return invalid("power_iter_steps must be in [1, 100], got ",
                   config.power_iter_steps);
  }
  if (!(config.max_update_rms >= 0.0 && std::isfinite(config.max_update_rms))) {
    return invalid(
        "max_update_rms must be a finite number >= 0 (0: no "
        "clipping), got ",
        config.max_update_rms);
  }
  if (!IsFinitePositive(config.eps)) {
    return invalid("eps must be a finite number > 0, got ", config.eps);
  }
  return absl::OkStatus();
}

}  // namespace loraplex
