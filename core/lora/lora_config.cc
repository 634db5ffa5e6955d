#include "core/lora/lora_config.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/enum_names.h"
#include "core/common/json_fields.h"
#include "core/common/number_checks.h"
#include "core/common/status_macros.h"

namespace loraplex {

bool LoraConfig::Targets(Projection projection) const {
  return std::find(targets.begin(), targets.end(), projection) != targets.end();
}

absl::Status ValidateLoraConfig(const LoraConfig& config) {
  if (config.rank < 1 || config.rank > kMaxLoraRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.rank must be in [1, ", kMaxLoraRank, "], got ", config.rank));
  }
  if (!IsFinitePositive(config.alpha)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.alpha must be a finite number > 0, got ", config.alpha));
  }
  if (!(config.dropout >= 0.0 && config.dropout < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.dropout must be in [0, 1), got ", config.dropout));
  }
  if (config.targets.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora.target_modules must name at least one of ",
                     EnumNameList(kLoraTargets, &ProjectionName)));
  }
  for (size_t i = 1; i < config.targets.size(); ++i) {
    if (!ProjectionLess(config.targets[i - 1], config.targets[i])) {
      return absl::InvalidArgumentError(
          "lora.target_modules must not repeat a module");
    }
  }
  return absl::OkStatus();
}

double LoraScale(const LoraConfig& config) {
  const double r = static_cast<double>(config.rank);
  return config.use_rslora ? config.alpha / std::sqrt(r) : config.alpha / r;
}

absl::StatusOr<std::vector<Projection>> ParseTargetModules(
    const nlohmann::json& names, absl::string_view field) {
  if (!names.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must be a list of module names, got ", DescribeJson(names)));
  }
  std::vector<Projection> targets;
  for (const nlohmann::json& name : names) {
    std::optional<Projection> projection;
    if (name.is_string()) {
      projection =
          ParseEnumName(name.get<std::string>(), kLoraTargets, &ProjectionName);
    }
    if (!projection.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " names an unsupported module ", DescribeJson(name),
          "; supported: ", EnumNameList(kLoraTargets, &ProjectionName)));
    }
    targets.push_back(*projection);
  }
  std::sort(targets.begin(), targets.end(), ProjectionLess);
  return targets;
}

absl::StatusOr<LoraConfig> LoraConfigFromJson(const nlohmann::json& json) {
  LoraConfig config;
  JsonFields fields(json, "lora.");
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("rank", &config.rank));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("alpha", &config.alpha));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("dropout", &config.dropout));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("use_rslora", &config.use_rslora));
  if (const nlohmann::json* raw = fields.Raw("target_modules")) {
    LORAPLEX_ASSIGN_OR_RETURN(config.targets,
                              ParseTargetModules(*raw, "lora.target_modules"));
  }
  LORAPLEX_RETURN_IF_ERROR(fields.RejectUnknown());
  LORAPLEX_RETURN_IF_ERROR(ValidateLoraConfig(config));
  return config;
}

nlohmann::json LoraConfigToJson(const LoraConfig& config) {
  nlohmann::json targets = nlohmann::json::array();
  for (Projection p : config.targets) {
    targets.push_back(std::string(ProjectionName(p)));
  }
  return {{"rank", config.rank},
          {"alpha", config.alpha},
          {"dropout", config.dropout},
          {"use_rslora", config.use_rslora},
          {"target_modules", targets}};
}

namespace {

// `targets` on a mixture-of-experts model: gate_proj with up_proj adapt the
// experts' stacked gate_up_proj too, down_proj their down_proj, so the
// default targets adapt every MLP; the dense layers' names stay only when
// the model has dense layers. The experts' names need experts.
absl::StatusOr<std::vector<Projection>> FitExpertTargets(
    const ModelConfig& model, const std::vector<Projection>& targets,
    double dropout) {
  auto has = [&](Projection p) {
    return std::find(targets.begin(), targets.end(), p) != targets.end();
  };
  const bool sparse = HasSparseLayers(model);
  if (!sparse) {
    for (Projection p : {Projection::kExpertGateUp, Projection::kExpertDown}) {
      if (has(p)) {
        return absl::InvalidArgumentError(
            absl::StrCat("lora.target_modules names ", ProjectionName(p),
                         ", but model_type ", model.model_type,
                         " has no mixture-of-experts layers"));
      }
    }
    return targets;
  }
  if (has(Projection::kGate) != has(Projection::kUp)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.target_modules: model_type ", model.model_type,
        " stores each expert's gate_proj and up_proj as one matrix, "
        "experts.gate_up_proj, adapted as a whole: name both gate_proj and "
        "up_proj, or experts.gate_up_proj"));
  }
  const bool dense = HasDenseLayers(model);
  std::vector<Projection> fitted;
  for (Projection target : targets) {
    const bool mlp = target == Projection::kGate || target == Projection::kUp ||
                     target == Projection::kDown;
    if (!mlp || dense) fitted.push_back(target);
    if (target == Projection::kGate)
      fitted.push_back(Projection::kExpertGateUp);
    if (target == Projection::kDown) fitted.push_back(Projection::kExpertDown);
  }
  std::sort(fitted.begin(), fitted.end(), ProjectionLess);
  fitted.erase(std::unique(fitted.begin(), fitted.end()), fitted.end());
  const bool experts =
      std::any_of(fitted.begin(), fitted.end(),
                  [](Projection p) { return IsExpertProjection(p); });
  if (experts && dropout > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.dropout must be 0 when the experts are adapted (model_type ",
        model.model_type,
        "): LoRA on stacked experts has no dropout, as in PEFT; got ",
        dropout));
  }
  return fitted;
}

}  // namespace

absl::StatusOr<std::vector<Projection>> FitLoraTargets(
    const ModelConfig& model, const std::vector<Projection>& requested,
    double dropout) {
  LORAPLEX_ASSIGN_OR_RETURN(const std::vector<Projection> targets,
                            FitExpertTargets(model, requested, dropout));
  auto has = [&](Projection p) {
    return std::find(targets.begin(), targets.end(), p) != targets.end();
  };
  struct Group {
    Projection fused;
    std::vector<Projection> parts;
    std::string Parts() const {
      std::vector<std::string> names;
      for (Projection part : parts) names.emplace_back(ProjectionName(part));
      return absl::StrJoin(names, ", ");
    }
  };
  const Group groups[] = {
      {Projection::kQkv, {Projection::kQ, Projection::kK, Projection::kV}},
      {Projection::kGateUp, {Projection::kGate, Projection::kUp}}};
  if (!model.fused_projections) {
    for (const Group& group : groups) {
      if (has(group.fused)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "lora.target_modules names ", ProjectionName(group.fused),
            ", which model_type ", model.model_type,
            " does not have: name its parts, ", group.Parts()));
      }
    }
    return targets;
  }
  for (const Group& group : groups) {
    int named = 0;
    for (Projection part : group.parts) named += has(part) ? 1 : 0;
    if (named != 0 && named != static_cast<int>(group.parts.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "lora.target_modules: model_type ", model.model_type, " stores ",
          group.Parts(), " as one matrix, ", ProjectionName(group.fused),
          ", adapted as a whole: name ", ProjectionName(group.fused),
          " (or all of its parts)"));
    }
  }
  // Each target as the module that holds it, once.
  std::vector<Projection> fitted;
  for (Projection target : targets) {
    Projection module = target;
    for (const Group& group : groups) {
      if (std::find(group.parts.begin(), group.parts.end(), target) !=
          group.parts.end()) {
        module = group.fused;
      }
    }
    if (std::find(fitted.begin(), fitted.end(), module) == fitted.end()) {
      fitted.push_back(module);
    }
  }
  std::sort(fitted.begin(), fitted.end(), ProjectionLess);
  return fitted;
}

}  // namespace loraplex
