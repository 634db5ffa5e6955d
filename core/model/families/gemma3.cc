// model_type "gemma3_text" (Gemma 3 1B, and the text model of the larger
// ones): sandwich norms (input and post-attention norms around attention,
// pre- and post-feed-forward norms around the MLP), RMSNorm weights applied
// as (1 + w), embeddings scaled by sqrt(hidden_size), per-head q/k norms,
// attention scaled by query_pre_attn_scalar^-0.5, a GELU-tanh MLP, and
// interleaved sliding-window and global layers (five sliding, one global by
// default) whose RoPE bases differ (rope_local_base_freq for the sliding
// ones).
//
// model_type "gemma3" (Gemma3ForConditionalGeneration: Gemma 3 4B-27B with
// their SigLIP vision tower) trains its text model: text_config is read as
// a gemma3_text config (with Gemma3TextConfig's defaults for the keys
// transformers leaves out), the vision tower and projector are skipped.
#include <cmath>

#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

absl::Status ParseGemma3(const ConfigReader& reader, ModelConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(ParseAttentionBias(reader, config));
  config.norm_style = NormStyle::kOnePlusWeight;
  config.norm_placement = NormPlacement::kSandwich;
  config.qk_norm = QkNorm::kPerHead;
  config.scale_embeddings = true;
  if (!reader.Has("hidden_activation") && !reader.Has("hidden_act")) {
    config.activation = MlpActivation::kGeluTanh;
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      double scalar,
      reader.PositiveNumber(reader.root(), "query_pre_attn_scalar", 256, ""));
  config.attention_scale = 1.0 / std::sqrt(scalar);
  LORAPLEX_RETURN_IF_ERROR(ParseSlidingWindow(reader, config));
  if (!reader.root().contains("sliding_window")) config.sliding_window = 4096;
  LORAPLEX_ASSIGN_OR_RETURN(int64_t period,
                            reader.PositiveInt("sliding_window_pattern", 6));
  LORAPLEX_RETURN_IF_ERROR(ParseLayerTypes(reader, period, config));
  // 4.x keys: rope_theta and rope_scaling are the global layers' (read by
  // the common parser); rope_local_base_freq is the sliding layers' base.
  if (!config.sliding_rope.has_value()) {
    RopeConfig local;
    LORAPLEX_ASSIGN_OR_RETURN(
        local.theta, reader.PositiveNumber(reader.root(),
                                           "rope_local_base_freq", 10000, ""));
    config.sliding_rope = local;
  }
  return absl::OkStatus();
}

void WriteGemma3(const ModelConfig& config, nlohmann::json& out) {
  out["attention_bias"] = config.qkv_bias;
  const double scale = config.attention_scale.value_or(1.0);
  out["query_pre_attn_scalar"] = 1.0 / (scale * scale);
}

// Gemma3TextConfig's defaults (transformers' configuration_gemma3.py).
constexpr char kGemma3TextDefaults[] = R"({
  "vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216,
  "num_hidden_layers": 26, "num_attention_heads": 8,
  "num_key_value_heads": 4, "head_dim": 256,
  "hidden_activation": "gelu_pytorch_tanh",
  "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
  "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
  "tie_word_embeddings": true, "rope_theta": 1000000.0,
  "rope_local_base_freq": 10000.0, "attention_bias": false,
  "query_pre_attn_scalar": 256, "sliding_window": 4096,
  "sliding_window_pattern": 6})";

}  // namespace

const ModelFamilySpec& Gemma3Family() {
  // transformers 5 holds the text model at model.language_model (the module
  // path PEFT names); 4.x checkpoints (google/gemma-3-*-it), and 5.x's
  // save_pretrained, store it under language_model.model.
  static const WrappedTextModel wrapped{
      "gemma3_text",
      kGemma3TextDefaults,
      {"tie_word_embeddings", "dtype", "torch_dtype", "bos_token_id",
       "eos_token_id", "pad_token_id"},
      {{"model.language_model.", "lm_head"},
       {"language_model.model.", "language_model.lm_head"}},
      {"model.vision_tower.", "model.multi_modal_projector.", "vision_tower.",
       "multi_modal_projector."}};
  static const ModelFamilySpec spec{
      "gemma3",    {"Gemma3ForConditionalGeneration"},
      ParseGemma3, WriteGemma3,
      false,       &wrapped};
  return spec;
}

const ModelFamilySpec& Gemma3TextFamily() {
  static const ModelFamilySpec spec{
      "gemma3_text", {"Gemma3ForCausalLM"}, ParseGemma3, WriteGemma3};
  return spec;
}

}  // namespace loraplex
