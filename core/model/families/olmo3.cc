// model_type "olmo3" (OLMo 3): OLMo 2's layout (olmo2.cc) with
// sliding-window layers: layer_types, by default three sliding layers then
// one full, as transformers builds them; RoPE per layer type.
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {

absl::Status ParseOlmoLayout(const ConfigReader& reader, ModelConfig& config);

namespace {

absl::Status ParseOlmo3(const ConfigReader& reader, ModelConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(ParseOlmoLayout(reader, config));
  LORAPLEX_RETURN_IF_ERROR(ParseSlidingWindow(reader, config));
  if (!reader.root().contains("sliding_window")) config.sliding_window = 4096;
  // 4.x keys: rope_scaling is the full layers' alone; the sliding ones keep
  // plain RoPE at the same base, as transformers converts them.
  if (!config.sliding_rope.has_value()) {
    RopeConfig plain;
    plain.theta = config.rope.theta;
    config.sliding_rope = plain;
  }
  return ParseLayerTypes(reader, /*period=*/4, config);
}

void WriteOlmo3(const ModelConfig& config, nlohmann::json& out) {
  out["attention_bias"] = config.qkv_bias;
}

}  // namespace

const ModelFamilySpec& Olmo3Family() {
  static const ModelFamilySpec spec{
      "olmo3", {"Olmo3ForCausalLM"}, ParseOlmo3, WriteOlmo3};
  return spec;
}

}  // namespace loraplex
