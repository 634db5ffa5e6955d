// model_type "olmo2" (OLMo 2): norms after attention and after the MLP, on
// their outputs before the residual add (no input norm), RMSNorm over the
// whole query and key projections (widths heads·head_dim and
// kv_heads·head_dim), and norm weights applied before the cast back to the
// compute dtype.
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {

// OLMo 3 shares this layout and adds sliding-window layers (olmo3.cc).
absl::Status ParseOlmoLayout(const ConfigReader& reader, ModelConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(ParseAttentionBias(reader, config));
  config.norm_placement = NormPlacement::kPostNorm;
  config.norm_style = NormStyle::kScaleThenCast;
  config.qk_norm = QkNorm::kWholeProjection;
  if (!reader.Has("rms_norm_eps")) config.rms_norm_eps = 1e-5;
  return absl::OkStatus();
}

namespace {

void WriteOlmo2(const ModelConfig& config, nlohmann::json& out) {
  out["attention_bias"] = config.qkv_bias;
}

}  // namespace

const ModelFamilySpec& Olmo2Family() {
  static const ModelFamilySpec spec{
      "olmo2", {"Olmo2ForCausalLM"}, ParseOlmoLayout, WriteOlmo2};
  return spec;
}

}  // namespace loraplex
