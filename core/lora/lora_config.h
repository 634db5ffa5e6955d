// One adapter's LoRA settings (docs/DESIGN.md §3): rank, alpha, rsLoRA, dropout
// and which of the seven projections (and, optionally, the LM head) it
// adapts.
//
//   LORAPLEX_ASSIGN_OR_RETURN(LoraConfig lora, LoraConfigFromJson(json));
//   double scale = LoraScale(lora);  // alpha / r, or alpha / sqrt(r)
#ifndef LORAPLEX_CORE_LORA_LORA_CONFIG_H_
#define LORAPLEX_CORE_LORA_LORA_CONFIG_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/model_config.h"
#include "core/model/projection.h"

namespace loraplex {

// The largest rank a slot accepts.
inline constexpr int64_t kMaxLoraRank = 256;

struct LoraConfig {
  int64_t rank = 8;
  double alpha = 16.0;
  // Probability of zeroing an input element of the LoRA branch in training.
  double dropout = 0.0;
  // Scale alpha / sqrt(rank) instead of alpha / rank (Kalajdzievski 2023).
  bool use_rslora = false;
  // Adapted modules in ProjectionLess order, no duplicates: the layers'
  // projections, and Projection::kLmHead last when the LM head is adapted.
  // The default, Llama's seven, fits a fused layout too (FitLoraTargets).
  std::vector<Projection> targets = {kAllProjections.begin(),
                                     kAllProjections.end()};

  bool Targets(Projection projection) const;
  bool TargetsLmHead() const { return Targets(Projection::kLmHead); }
};

// INVALID_ARGUMENT naming the field: "lora.rank must be in [1, 256], got 0".
absl::Status ValidateLoraConfig(const LoraConfig& config);

// The factor applied to B·A·x.
double LoraScale(const LoraConfig& config);

// A JSON list of module names ("q_proj", ...) as projections, sorted into
// ProjectionLess order (duplicates kept). Errors start with `field`:
// "lora.target_modules names an unsupported module \"embed_tokens\"; ...".
absl::StatusOr<std::vector<Projection>> ParseTargetModules(
    const nlohmann::json& names, absl::string_view field);

// {"rank", "alpha", "dropout", "use_rslora", "target_modules": ["q_proj",
// ...]}; absent fields keep their defaults, unknown ones are rejected.
// Target names are sorted into ProjectionLess order.
absl::StatusOr<LoraConfig> LoraConfigFromJson(const nlohmann::json& json);
nlohmann::json LoraConfigToJson(const LoraConfig& config);

// `targets` as the layers of `model` have them. On a fused layout
// (ModelConfig::fused_projections) q_proj, k_proj and v_proj together become
// qkv_proj, and gate_proj with up_proj gate_up_proj, so the default targets
// (Llama's seven) fit every layout. A module the layout does not have, or
// part of a fused one alone, is INVALID_ARGUMENT naming
// lora.target_modules. On a mixture-of-experts model gate_proj with up_proj
// also adapt the experts' experts.gate_up_proj and down_proj their
// experts.down_proj (the dense layers' names are kept only where the model
// has dense layers); adapting the experts needs `dropout` 0 (as PEFT).
absl::StatusOr<std::vector<Projection>> FitLoraTargets(
    const ModelConfig& model, const std::vector<Projection>& targets,
    double dropout = 0.0);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_LORA_LORA_CONFIG_H_
