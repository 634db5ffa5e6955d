// JSON form of OptimizerConfig and LrScheduleConfig, as stored with a job
// and accepted from users. Absent fields keep their defaults; unknown
// fields, wrong types, unknown names and out-of-range values are
// INVALID_ARGUMENT naming the field:
//
//   {"family": "muon", "lr": 2e-4, "momentum": 0.95, "nesterov": true,
//    "coefficient_set": "polar_express", "ns_steps": 8,
//    "scale_mode": "spectral", "extra_scale_factor": 0.2,
//    "scalar_optimizer": "lion", "lion_betas": [0.9, 0.99]}
//   {"kind": "cosine", "warmup_steps": 100, "total_steps": 2000}
//
// The returned configs are validated (ValidateOptimizerConfig, including
// the Muon fields whatever the family; ValidateLrScheduleConfig, whose peak
// is the optimizer's lr, checked by LrScheduler::Create); *ToJson writes
// every field.
#ifndef LORAPLEX_CORE_OPTIM_CONFIG_JSON_H_
#define LORAPLEX_CORE_OPTIM_CONFIG_JSON_H_

#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "core/common/json_fields.h"
#include "core/optim/lr_schedule_config.h"
#include "core/optim/optimizer_config.h"

namespace loraplex {

absl::StatusOr<OptimizerConfig> OptimizerConfigFromJson(
    const nlohmann::json& json);
// Reads SOAP's knobs other than its betas ("shampoo_beta",
// "precondition_frequency", "max_precond_dim", "power_iter_steps",
// "use_eigh", "max_update_rms") into `config` where present; no validation.
// Shared with the Tinker API's optimizer_config.
absl::Status ReadSoapKnobs(JsonFields& fields, OptimizerConfig* config);
nlohmann::json OptimizerConfigToJson(const OptimizerConfig& config);

absl::StatusOr<LrScheduleConfig> LrScheduleConfigFromJson(
    const nlohmann::json& json);
nlohmann::json LrScheduleConfigToJson(const LrScheduleConfig& config);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_CONFIG_JSON_H_
