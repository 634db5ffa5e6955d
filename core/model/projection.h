// The seven linear projections of a Llama-family decoder layer and the LM
// head — the LoRA targets — and their Hugging Face names. No LibTorch here.
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
};
// The projections of one decoder layer.
inline constexpr int kNumProjections = 7;
// The layer of the LM head's module, which belongs to no layer.
inline constexpr int kLmHeadLayer = -1;
inline constexpr std::array<Projection, kNumProjections> kAllProjections = {
    Projection::kQ,    Projection::kK,  Projection::kV,   Projection::kO,
    Projection::kGate, Projection::kUp, Projection::kDown};
// Every module a LoRA adapter may target: the layers' projections, then the
// LM head (opt-in: vLLM does not load LoRA on lm_head).
inline constexpr std::array<Projection, kNumProjections + 1> kLoraTargets = {
    Projection::kQ,    Projection::kK,  Projection::kV,    Projection::kO,
    Projection::kGate, Projection::kUp, Projection::kDown, Projection::kLmHead};

// Short name as used in PEFT target_modules, e.g. "q_proj", "lm_head".
absl::string_view ProjectionName(Projection projection);
// Module path inside a layer, e.g. "self_attn.q_proj"; "lm_head" for the LM
// head (a module of the whole model).
absl::string_view ProjectionModule(Projection projection);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_PROJECTION_H_
