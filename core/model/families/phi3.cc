// model_type "phi3" (Phi-3 / Phi-3.5-mini, Phi-4-mini): Llama's layout with
// q/k/v stored as one qkv_proj matrix and gate/up as one gate_up_proj
// (gate first), adapted as PEFT adapts those modules; LongRoPE scaling
// (rope_scaling.rope_type "longrope": short and long factors, attention
// factor); a leading fraction of each head rotated (partial_rotary_factor,
// Phi-4-mini 0.75); an optional sliding window on every layer; no biases.
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

absl::Status ParsePhi3(const ConfigReader& reader, ModelConfig& config) {
  config.fused_projections = true;
  // Phi3Config's own default.
  LORAPLEX_ASSIGN_OR_RETURN(
      config.rms_norm_eps,
      reader.PositiveNumber(reader.root(), "rms_norm_eps", 1e-5, ""));
  // Dropout on the frozen base's residuals in training, which the base
  // here never applies.
  for (const char* key : {"resid_pdrop", "embd_pdrop", "attention_dropout"}) {
    LORAPLEX_RETURN_IF_ERROR(reader.RefuseUnlessNeutral(
        key, nlohmann::json(0.0),
        "base-model dropout in training is not implemented"));
  }
  return ParseSlidingWindow(reader, config);
}

// The rope settings and sliding_window are written with every family's keys
// (ModelConfigToJson); LongRoPE's original context also stands on its own.
void WritePhi3(const ModelConfig& config, nlohmann::json& out) {
  out["partial_rotary_factor"] = config.rope.partial_rotary_factor;
  out["original_max_position_embeddings"] =
      config.rope.original_max_position_embeddings;
}

}  // namespace

const ModelFamilySpec& Phi3Family() {
  static const ModelFamilySpec spec{"phi3",
                                    {"Phi3ForCausalLM"},
                                    ParsePhi3,
                                    WritePhi3,
                                    /*partial_rotary=*/true};
  return spec;
}

}  // namespace loraplex
