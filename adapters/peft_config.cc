#include "adapters/peft_config.h"

#include <algorithm>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/enum_names.h"
#include "core/common/json_fields.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

// Settings PEFT supports that an adapter here cannot express: each must be
// absent or hold its neutral value.
absl::Status CheckNeutral(const nlohmann::json& config, const char* key,
                          const std::string& label) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null() || *it == false ||
      ((it->is_object() || it->is_array()) && it->empty())) {
    return absl::OkStatus();
  }
  if (std::string(key) == "bias" && *it == "none") return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(label, ": ", key, " = ", DescribeJson(*it),
                   " is not supported (only plain LoRA adapters are)"));
}

// PEFT's matching rule for target_modules and exclude_modules entries: a
// module is named when its full name equals the entry or ends with "." +
// the entry ("q_proj", "self_attn.q_proj", "model.layers.0.self_attn.q_proj").
bool PeftEntryNames(absl::string_view module, absl::string_view entry) {
  return module == entry ||
         (module.size() > entry.size() && absl::EndsWith(module, entry) &&
          module[module.size() - entry.size() - 1] == '.');
}

// Whether `entry` names the text model's module `module` (as a text
// model names it, or under a layout of the wrapper).
bool EntryNamesModule(const std::string& module, absl::string_view entry,
                      const WrappedTextModel* wrapped) {
  if (PeftEntryNames(module, entry)) return true;
  if (wrapped == nullptr) return false;
  for (const WrappedTextModel::Layout& layout : wrapped->layouts) {
    if (PeftEntryNames(WrappedName(layout, module), entry)) return true;
  }
  return false;
}

// The (layer, projection) modules of `model` a list of entries names; `key`
// is the field read: target_modules and exclude_modules name linear
// modules (and the LM head), target_parameters the experts' stacked
// parameters. Each entry must name at least one of them.
absl::StatusOr<std::set<std::pair<Projection, int>>> NamedModules(
    const nlohmann::json& entries, const char* key, const ModelConfig& model,
    const std::string& label) {
  const WrappedTextModel* wrapped = WrappedTextModelOf(model);
  const bool parameters = std::string(key) == "target_parameters";
  const int num_layers = static_cast<int>(model.num_hidden_layers);
  std::set<std::pair<Projection, int>> named;
  for (const nlohmann::json& entry : entries) {
    bool any = false;
    if (entry.is_string()) {
      const std::string& text = entry.get_ref<const std::string&>();
      for (int layer = 0; layer < num_layers; ++layer) {
        for (Projection p : LayerProjections(model, layer)) {
          if (IsExpertProjection(p) == parameters &&
              EntryNamesModule(PeftModuleName(layer, p), text, wrapped)) {
            named.insert({p, layer});
            any = true;
          }
        }
      }
      if (!parameters &&
          EntryNamesModule(PeftModuleName(kLmHeadLayer, Projection::kLmHead),
                           text, wrapped)) {
        named.insert({Projection::kLmHead, kLmHeadLayer});
        any = true;
      }
    }
    if (!any && parameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": target_parameters names an unsupported parameter ",
          DescribeJson(entry), "; supported: ",
          HasSparseLayers(model)
              ? "mlp.experts.gate_up_proj and mlp.experts.down_proj of the "
                "mixture-of-experts layers"
              : absl::StrCat("none (model_type ", model.model_type,
                             " has no mixture-of-experts layers)")));
    }
    if (!any) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": ", key, " names an unsupported module ",
          DescribeJson(entry),
          "; supported: ", EnumNameList(kLayerProjections, &ProjectionName),
          " of layers 0-", num_layers - 1,
          ", by name, suffix (\"mlp.up_proj\") or full path "
          "(\"model.layers.0.mlp.up_proj\"), and lm_head"));
    }
  }
  return named;
}

// target_modules minus exclude_modules, as projections that cover every
// layer. An adapter on some layers only cannot be held by a slot, so it is
// refused rather than imported as something else.
absl::StatusOr<std::vector<Projection>> ParsePeftTargets(
    const nlohmann::json& json, const ModelConfig& model,
    const std::string& label) {
  const int num_layers = static_cast<int>(model.num_hidden_layers);
  auto targets = json.find("target_modules");
  const bool all_linear = targets != json.end() && *targets == "all-linear";
  if (all_linear && !HasSparseLayers(model)) {
    return std::vector<Projection>(kAllProjections.begin(),
                                   kAllProjections.end());
  }
  if (!all_linear && (targets == json.end() || !targets->is_array())) {
    return absl::InvalidArgumentError(absl::StrCat(
        label, ": target_modules ",
        targets != json.end() && targets->is_string()
            ? "as a regular expression is not supported; list the modules"
            : "must be a list of module names"));
  }
  std::set<std::pair<Projection, int>> named;
  if (all_linear) {
    // PEFT's all-linear adapts the linear layers; a mixture's experts are
    // stacked parameters, adapted only through target_parameters.
    for (int layer = 0; layer < num_layers; ++layer) {
      for (Projection p : LayerProjections(model, layer)) {
        if (!IsExpertProjection(p)) named.insert({p, layer});
      }
    }
  } else {
    LORAPLEX_ASSIGN_OR_RETURN(
        named, NamedModules(*targets, "target_modules", model, label));
  }
  if (auto parameters = json.find("target_parameters");
      parameters != json.end() && !parameters->is_null() &&
      !(parameters->is_array() && parameters->empty())) {
    if (!parameters->is_array()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": target_parameters must be a list of parameter names"));
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        auto experts,
        NamedModules(*parameters, "target_parameters", model, label));
    named.insert(experts.begin(), experts.end());
  }
  if (auto exclude = json.find("exclude_modules");
      exclude != json.end() && !exclude->is_null()) {
    if (!exclude->is_array()) {
      return absl::InvalidArgumentError(
          absl::StrCat(label,
                       ": exclude_modules must be a list of module names (a "
                       "regular expression is not supported)"));
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        auto excluded, NamedModules(*exclude, "exclude_modules", model, label));
    for (const auto& module : excluded) named.erase(module);
  }
  std::vector<Projection> projections;
  for (Projection p : kLayerProjections) {
    std::vector<int> layers, having;  // Named, and those that have p.
    for (int layer = 0; layer < num_layers; ++layer) {
      if (named.count({p, layer}) > 0) layers.push_back(layer);
      const std::vector<Projection> present = LayerProjections(model, layer);
      if (std::find(present.begin(), present.end(), p) != present.end()) {
        having.push_back(layer);
      }
    }
    if (layers.empty()) continue;
    if (layers != having) {
      const std::string of =
          static_cast<int>(having.size()) == num_layers
              ? absl::StrCat("the base model's ", num_layers, " layers")
              : absl::StrCat("the ", having.size(),
                             " layers of the base model that have it");
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": ",
          IsExpertProjection(p) ? "target_parameters" : "target_modules",
          " covers ", ProjectionName(p), " on ", layers.size(), " of ", of,
          " (", absl::StrJoin(layers, ", "),
          "); adapters on some layers only are not supported: cover every "
          "layer"));
    }
    projections.push_back(p);
  }
  if (named.count({Projection::kLmHead, kLmHeadLayer}) > 0) {
    projections.push_back(Projection::kLmHead);
  }
  return projections;
}

}  // namespace

std::string PeftModuleName(int layer, Projection projection) {
  if (projection == Projection::kLmHead) return "lm_head";
  return absl::StrCat("model.layers.", layer, ".",
                      ProjectionModule(projection));
}

absl::StatusOr<LoraConfig> ParsePeftConfig(const nlohmann::json& json,
                                           const ModelConfig& model,
                                           const std::string& label,
                                           std::string* base_model) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": not an object"));
  }
  // PEFT writes many more keys; only these are read (no RejectUnknown).
  JsonFields fields(json, label + ": ");
  auto peft_type = json.find("peft_type");
  if (peft_type == json.end() || *peft_type != "LORA") {
    return fields.Invalid(
        "peft_type",
        absl::StrCat("must be \"LORA\", got ", peft_type == json.end()
                                                   ? std::string("nothing")
                                                   : DescribeJson(*peft_type)));
  }
  auto task = json.find("task_type");
  if (task != json.end() && !task->is_null() && *task != "CAUSAL_LM") {
    return fields.Invalid(
        "task_type",
        absl::StrCat("must be \"CAUSAL_LM\", got ", DescribeJson(*task)));
  }
  for (const char* key :
       {"bias", "use_dora", "fan_in_fan_out", "rank_pattern", "alpha_pattern",
        "modules_to_save", "layers_to_transform", "layers_pattern", "lora_bias",
        "trainable_token_indices", "layer_replication",
        "alora_invocation_tokens"}) {
    LORAPLEX_RETURN_IF_ERROR(CheckNeutral(json, key, label));
  }
  // Initialisations that rewrite the base weights (PiSSA, OLoRA, CorDA,
  // LoftQ) give adapters that only fit the rewritten base.
  if (auto init = json.find("init_lora_weights");
      init != json.end() && !init->is_boolean() && *init != "gaussian" &&
      *init != "eva") {
    return fields.Invalid(
        "init_lora_weights",
        absl::StrCat("= ", DescribeJson(*init),
                     " is not supported (it changes the base "
                     "weights the adapter was trained against)"));
  }
  LoraConfig config;
  config.rank = 0;  // Required: an absent "r" fails the range check below.
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("r", &config.rank));
  if (config.rank < 1 || config.rank > kMaxLoraRank) {
    const nlohmann::json* r = fields.Raw("r");
    return fields.Invalid(
        "r",
        absl::StrCat("must be an integer in [1, ", kMaxLoraRank, "], got ",
                     r == nullptr ? std::string("nothing") : DescribeJson(*r)));
  }
  config.alpha = 8.0;  // PEFT's default.
  LORAPLEX_RETURN_IF_ERROR(fields.Number("lora_alpha", &config.alpha));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("lora_dropout", &config.dropout));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("use_rslora", &config.use_rslora));
  LORAPLEX_ASSIGN_OR_RETURN(config.targets,
                            ParsePeftTargets(json, model, label));
  if (absl::Status s = ValidateLoraConfig(config); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": ", s.message()));
  }
  auto fitted = FitLoraTargets(model, config.targets, config.dropout);
  if (!fitted.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(label, ": ", fitted.status().message()));
  }
  // Here gate_proj with up_proj (down_proj) adapt the experts too; an
  // adapter on the dense layers' MLP alone cannot be held.
  for (Projection p : *fitted) {
    if (IsExpertProjection(p) && !config.Targets(p)) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, ": adapts the dense layers' ",
          p == Projection::kExpertDown ? "down_proj" : "gate_proj and up_proj",
          " but not the experts' ", ProjectionModule(p), "; model_type ",
          model.model_type,
          " adapts them together here: add it to target_parameters or drop "
          "the dense layers' MLP from target_modules"));
    }
  }
  if (auto base = json.find("base_model_name_or_path");
      base != json.end() && base->is_string()) {
    *base_model = base->get<std::string>();
  }
  return config;
}

absl::StatusOr<LoraConfig> ParsePeftConfigText(absl::string_view text,
                                               const ModelConfig& model,
                                               const std::string& label) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json json,
                            ParseUntrustedJson(text, label));
  std::string base_model;
  return ParsePeftConfig(json, model, label, &base_model);
}

}  // namespace loraplex
