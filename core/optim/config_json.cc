#include "core/optim/config_json.h"

#include <string>
#include <vector>

#include "core/common/json_fields.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

// Reads "custom_coefficients": [[a, b, c], ...].
absl::Status ReadCustomCoefficients(JsonFields& fields,
                                    std::vector<NsCoefficients>* out) {
  const nlohmann::json* value = fields.Raw("custom_coefficients");
  if (value == nullptr) return absl::OkStatus();
  std::vector<NsCoefficients> tuples;
  bool ok = value->is_array() && value->size() <= 100;
  for (size_t i = 0; ok && i < value->size(); ++i) {
    const nlohmann::json& t = (*value)[i];
    ok = t.is_array() && t.size() == 3 && t[0].is_number() &&
         t[1].is_number() && t[2].is_number();
    if (ok) {
      tuples.push_back(
          {t[0].get<double>(), t[1].get<double>(), t[2].get<double>()});
    }
  }
  if (!ok) {
    return fields.Invalid(
        "custom_coefficients",
        absl::StrCat("must be a list of at most 100 [a, b, c] number "
                     "triples, got ",
                     DescribeJson(*value)));
  }
  *out = std::move(tuples);
  return absl::OkStatus();
}

}  // namespace

absl::Status ReadSoapKnobs(JsonFields& fields, OptimizerConfig* config) {
  LORAPLEX_RETURN_IF_ERROR(
      fields.Number("shampoo_beta", &config->shampoo_beta));
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("precondition_frequency",
                                          &config->precondition_frequency));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Integer("max_precond_dim", &config->max_precond_dim));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Integer("power_iter_steps", &config->power_iter_steps));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("use_eigh", &config->use_eigh));
  return fields.Number("max_update_rms", &config->max_update_rms);
}

absl::StatusOr<OptimizerConfig> OptimizerConfigFromJson(
    const nlohmann::json& json) {
  OptimizerConfig config;
  JsonFields fields(json, "optimizer.");
  LORAPLEX_RETURN_IF_ERROR(fields.Choice("family", kAllOptimizerFamilies,
                                         &OptimizerFamilyName, &config.family));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("lr", &config.lr));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("weight_decay", &config.weight_decay));
  std::vector<double> betas = {config.beta1, config.beta2};
  LORAPLEX_RETURN_IF_ERROR(fields.NumberList("betas", 2, &betas));
  config.beta1 = betas[0];
  config.beta2 = betas[1];
  LORAPLEX_RETURN_IF_ERROR(fields.Number("eps", &config.eps));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("momentum", &config.momentum));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("nesterov", &config.nesterov));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Choice("weight_decay_mode", kAllMuonWeightDecayModes,
                    &MuonWeightDecayModeName, &config.weight_decay_mode));
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("ns_steps", &config.ns_steps));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Choice("coefficient_set", kAllNsCoefficientSets,
                    &NsCoefficientSetName, &config.coefficient_set));
  LORAPLEX_RETURN_IF_ERROR(
      ReadCustomCoefficients(fields, &config.custom_coefficients));
  LORAPLEX_RETURN_IF_ERROR(fields.Choice("ns_precision", kAllNsPrecisions,
                                         &NsPrecisionName,
                                         &config.ns_precision));
  LORAPLEX_RETURN_IF_ERROR(fields.Choice("scale_mode", kAllMuonScaleModes,
                                         &MuonScaleModeName,
                                         &config.scale_mode));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Number("extra_scale_factor", &config.extra_scale_factor));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Choice("scalar_optimizer", kAllScalarOptimizers,
                    &ScalarOptimizerName, &config.scalar_optimizer));
  std::vector<double> lion_betas = {config.lion_beta1, config.lion_beta2};
  LORAPLEX_RETURN_IF_ERROR(fields.NumberList("lion_betas", 2, &lion_betas));
  config.lion_beta1 = lion_betas[0];
  config.lion_beta2 = lion_betas[1];
  std::vector<double> soap_betas = {config.soap_beta1, config.soap_beta2};
  LORAPLEX_RETURN_IF_ERROR(fields.NumberList("soap_betas", 2, &soap_betas));
  config.soap_beta1 = soap_betas[0];
  config.soap_beta2 = soap_betas[1];
  LORAPLEX_RETURN_IF_ERROR(ReadSoapKnobs(fields, &config));
  LORAPLEX_RETURN_IF_ERROR(fields.RejectUnknown());
  LORAPLEX_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  return config;
}

nlohmann::json OptimizerConfigToJson(const OptimizerConfig& config) {
  nlohmann::json custom = nlohmann::json::array();
  for (const NsCoefficients& t : config.custom_coefficients) {
    custom.push_back({t.a, t.b, t.c});
  }
  return {
      {"family", std::string(OptimizerFamilyName(config.family))},
      {"lr", config.lr},
      {"weight_decay", config.weight_decay},
      {"betas", {config.beta1, config.beta2}},
      {"eps", config.eps},
      {"momentum", config.momentum},
      {"nesterov", config.nesterov},
      {"weight_decay_mode",
       std::string(MuonWeightDecayModeName(config.weight_decay_mode))},
      {"ns_steps", config.ns_steps},
      {"coefficient_set",
       std::string(NsCoefficientSetName(config.coefficient_set))},
      {"custom_coefficients", custom},
      {"ns_precision", std::string(NsPrecisionName(config.ns_precision))},
      {"scale_mode", std::string(MuonScaleModeName(config.scale_mode))},
      {"extra_scale_factor", config.extra_scale_factor},
      {"scalar_optimizer",
       std::string(ScalarOptimizerName(config.scalar_optimizer))},
      {"lion_betas", {config.lion_beta1, config.lion_beta2}},
      {"soap_betas", {config.soap_beta1, config.soap_beta2}},
      {"shampoo_beta", config.shampoo_beta},
      {"precondition_frequency", config.precondition_frequency},
      {"max_precond_dim", config.max_precond_dim},
      {"power_iter_steps", config.power_iter_steps},
      {"use_eigh", config.use_eigh},
      {"max_update_rms", config.max_update_rms},
  };
}

absl::StatusOr<LrScheduleConfig> LrScheduleConfigFromJson(
    const nlohmann::json& json) {
  LrScheduleConfig config;
  JsonFields fields(json, "schedule.");
  LORAPLEX_RETURN_IF_ERROR(fields.Choice("kind", kAllLrScheduleKinds,
                                         &LrScheduleKindName, &config.kind));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("init_lr", &config.init_lr));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("min_lr", &config.min_lr));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Integer("warmup_steps", &config.warmup_steps));
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("total_steps", &config.total_steps));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Number("decay_fraction", &config.decay_fraction));
  LORAPLEX_RETURN_IF_ERROR(fields.RejectUnknown());
  LORAPLEX_RETURN_IF_ERROR(ValidateLrScheduleConfig(config));
  return config;
}

nlohmann::json LrScheduleConfigToJson(const LrScheduleConfig& config) {
  return {
      {"kind", std::string(LrScheduleKindName(config.kind))},
      {"init_lr", config.init_lr},
      {"min_lr", config.min_lr},
      {"warmup_steps", config.warmup_steps},
      {"total_steps", config.total_steps},
      {"decay_fraction", config.decay_fraction},
  };
}

}  // namespace loraplex
