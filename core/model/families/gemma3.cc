// model_type "gemma3_text" (Gemma 3 1B, and the text model of the larger
// ones): sandwich norms (input and post-attention norms around attention,
// pre- and post-feed-forward norms around the MLP), RMSNorm weights applied
// as (1 + w), embeddings scaled by sqrt(hidden_size), per-head q/k norms,
// attention scaled by query_pre_attn_scalar^-0.5, a GELU-tanh MLP, and
// interleaved sliding-window and global layers (five sliding, one global by
// default) whose RoPE bases differ (rope_local_base_freq for the sliding
// ones).
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

}  // namespace

const ModelFamilySpec& Gemma3TextFamily() {
  static const ModelFamilySpec spec{
      "gemma3_text", {"Gemma3ForCausalLM"}, ParseGemma3, WriteGemma3};
  return spec;
}

}  // namespace loraplex
