// adapter_config.json of a PEFT LoRA adapter, read without LibTorch:
// the settings an adapter here can express, checked, or INVALID_ARGUMENT
// naming the file (`label`) and the problem.
#ifndef LORAPLEX_ADAPTERS_PEFT_CONFIG_H_
#define LORAPLEX_ADAPTERS_PEFT_CONFIG_H_

#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/lora/lora_config.h"
#include "core/model/model_family.h"
#include "core/model/projection.h"

namespace loraplex {

// "model.layers.3.self_attn.q_proj", or "lm_head".
std::string PeftModuleName(int layer, Projection projection);

// The LoRA settings of a parsed adapter_config.json for the base model
// `model`; its base_model_name_or_path goes to *base_model. Unsupported
// settings (DoRA, bias, rank or alpha patterns, modules to save, target
// modules other than the projections of every layer that has them and
// lm_head) are refused. target_parameters name the experts' stacked
// parameters of a mixture-of-experts model (mlp.experts.gate_up_proj,
// mlp.experts.down_proj). For a multimodal wrapper, module paths may also
// name the text model under any of its layouts.
absl::StatusOr<LoraConfig> ParsePeftConfig(const nlohmann::json& json,
                                           const ModelConfig& model,
                                           const std::string& label,
                                           std::string* base_model);

// ParsePeftConfig of the text of an adapter_config.json (untrusted JSON).
absl::StatusOr<LoraConfig> ParsePeftConfigText(absl::string_view text,
                                               const ModelConfig& model,
                                               const std::string& label);

}  // namespace loraplex

#endif  // LORAPLEX_ADAPTERS_PEFT_CONFIG_H_
