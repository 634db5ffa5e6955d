// model_type "qwen3" (Qwen3 dense, 0.6B-32B): Qwen2's layout without q/k/v
// biases, with RMSNorm over each head of the queries and keys before RoPE
// (q_norm, k_norm of width head_dim) and an explicit head_dim. Layers from
// max_window_layers on attend through sliding_window when
// use_sliding_window is set, as transformers builds layer_types.
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

absl::Status ParseQwen3(const ConfigReader& reader, ModelConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(ParseAttentionBias(reader, config));
  config.qk_norm = QkNorm::kPerHead;
  LORAPLEX_ASSIGN_OR_RETURN(bool windowed,
                            reader.Bool("use_sliding_window", false));
  if (!windowed) {
    config.sliding_window.reset();
    config.sliding_layers.assign(config.num_hidden_layers, false);
    return absl::OkStatus();
  }
  LORAPLEX_RETURN_IF_ERROR(ParseSlidingWindow(reader, config));
  if (!config.sliding_window.has_value()) config.sliding_window = 4096;
  if (reader.Has("layer_types")) return ParseLayerTypes(reader, 0, config);
  LORAPLEX_ASSIGN_OR_RETURN(
      int64_t first_windowed,
      reader.PositiveInt("max_window_layers", config.num_hidden_layers));
  config.sliding_layers.assign(config.num_hidden_layers, false);
  for (int64_t i = first_windowed; i < config.num_hidden_layers; ++i) {
    config.sliding_layers[i] = true;
  }
  return absl::OkStatus();
}

void WriteQwen3(const ModelConfig& config, nlohmann::json& out) {
  out["attention_bias"] = config.qkv_bias;
  out["use_sliding_window"] = config.sliding_window.has_value();
}

}  // namespace

const ModelFamilySpec& Qwen3Family() {
  static const ModelFamilySpec spec{
      "qwen3", {"Qwen3ForCausalLM"}, ParseQwen3, WriteQwen3};
  return spec;
}

}  // namespace loraplex
