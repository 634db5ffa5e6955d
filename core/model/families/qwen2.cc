// model_type "qwen2" (Qwen2, Qwen2.5, QwQ, the DeepSeek-R1 Qwen distills):
// Llama's layout with biases on the q, k and v projections.
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

absl::Status ParseQwen2(const ConfigReader& reader, ModelConfig& config) {
  config.qkv_bias = true;
  LORAPLEX_ASSIGN_OR_RETURN(bool windowed,
                            reader.Bool("use_sliding_window", false));
  if (windowed) {
    return reader.Error("use_sliding_window",
                        "true is not supported for qwen2");
  }
  return absl::OkStatus();
}

void WriteQwen2(const ModelConfig& /*config*/, nlohmann::json& out) {
  out["use_sliding_window"] = false;
}

}  // namespace

const ModelFamilySpec& Qwen2Family() {
  static const ModelFamilySpec spec{
      "qwen2", {"Qwen2ForCausalLM"}, ParseQwen2, WriteQwen2};
  return spec;
}

}  // namespace loraplex
