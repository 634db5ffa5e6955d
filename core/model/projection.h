// The linear projections of a decoder layer and the LM head — the LoRA
// targets — and their Hugging Face names: the seven of the Llama layout, and
// the fused qkv_proj and gate_up_proj of layouts that store q/k/v and
// gate/up as one matrix each (Phi-3). No LibTorch here.
//
//   for (Projection p : kAllProjections) std::cout << ProjectionName(p);
#ifndef LORAPLEX_CORE_MODEL_PROJECTION_H_
#define LORAPLEX_CORE_MODEL_PROJECTION_H_

#include <array>

#include "absl/strings/string_view.h"

namespace loraplex {

enum class Projection {
  kQ,     // self_attn.q_proj: hidden -> heads * head_dim.
  kK,     // self_attn.k_proj: hidden -> kv_heads * head_dim.
  kV,     // self_attn.v_proj: hidden -> kv_heads * head_dim.
  kO,     // self_attn.o_proj: heads * head_dim -> hidden.
  kGate,  // mlp.gate_proj: hidden -> intermediate.
  kUp,    // mlp.up_proj: hidden -> intermediate.
  kDown,  // mlp.down_proj: intermediate -> hidden.
  // lm_head: hidden -> vocab, after the last layer. Not a layer's
  // projection: kAllProjections and kNumProjections leave it out.
  kLmHead,
  // Fused layouts (ModelConfig::fused_projections): one matrix whose output
  // is q, k and v (gate and up) side by side, and one LoRA module on it, A
  // shared by its parts, as PEFT adapts the module. After kLmHead so that
  // the ids of the others (dropout seeds) stay as they were.
  kQkv,     // self_attn.qkv_proj: hidden -> (heads + 2 kv_heads) * head_dim.
  kGateUp,  // mlp.gate_up_proj: hidden -> 2 * intermediate.
  // Mixture-of-experts layers (ModelConfig::moe): every expert's stacked
  // weights as transformers 5 holds them, one LoRA module per projection
  // whose A [experts·rank, in] and B [out, experts·rank] nest each
  // expert's A and B as PEFT's target_parameters do (lora_weights.h).
  kExpertGateUp,  // mlp.experts.gate_up_proj: hidden -> 2 * moe_intermediate.
  kExpertDown,    // mlp.experts.down_proj: moe_intermediate -> hidden.
};
// The projections of one decoder layer of the Llama layout.
inline constexpr int kNumProjections = 7;
// Every Projection value (for tables indexed by projection).
inline constexpr int kNumProjectionIds =
    static_cast<int>(Projection::kExpertDown) + 1;
// The layer of the LM head's module, which belongs to no layer.
inline constexpr int kLmHeadLayer = -1;
inline constexpr std::array<Projection, kNumProjections> kAllProjections = {
    Projection::kQ,    Projection::kK,  Projection::kV,   Projection::kO,
    Projection::kGate, Projection::kUp, Projection::kDown};
// The projections of one decoder layer of a fused layout.
inline constexpr std::array<Projection, 4> kFusedProjections = {
    Projection::kQkv, Projection::kO, Projection::kGateUp, Projection::kDown};
// Every projection some layout's layer has, in ProjectionLess order.
inline constexpr std::array<Projection, 11> kLayerProjections = {
    Projection::kQ,           Projection::kK,      Projection::kV,
    Projection::kQkv,         Projection::kO,      Projection::kGate,
    Projection::kUp,          Projection::kGateUp, Projection::kDown,
    Projection::kExpertGateUp, Projection::kExpertDown};
// Every module a LoRA adapter may target: the layers' projections, then the
// LM head (opt-in: vLLM does not load LoRA on lm_head).
inline constexpr std::array<Projection, kNumProjectionIds> kLoraTargets = {
    Projection::kQ,           Projection::kK,          Projection::kV,
    Projection::kQkv,         Projection::kO,          Projection::kGate,
    Projection::kUp,          Projection::kGateUp,     Projection::kDown,
    Projection::kExpertGateUp, Projection::kExpertDown, Projection::kLmHead};

// The order modules are listed in: a layer's projections as they run (q, k,
// v, qkv, o, gate, up, gate_up, down, experts' gate_up, experts' down), the
// LM head last.
bool ProjectionLess(Projection a, Projection b);

// Short name as used in PEFT target_modules, e.g. "q_proj", "lm_head"; the
// experts' "experts.gate_up_proj" and "experts.down_proj" (PEFT
// target_parameters name them "mlp.experts.gate_up_proj", ...).
absl::string_view ProjectionName(Projection projection);
// Module path inside a layer, e.g. "self_attn.q_proj"; "lm_head" for the LM
// head (a module of the whole model); for the experts the stacked
// parameter's path, "mlp.experts.gate_up_proj".

// Whether the projection is a mixture-of-experts layer's stacked experts.
inline constexpr bool IsExpertProjection(Projection projection) {
  return projection == Projection::kExpertGateUp ||
         projection == Projection::kExpertDown;
}
absl::string_view ProjectionModule(Projection projection);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_PROJECTION_H_
