// model_type "llama" (Llama 2/3/3.1/3.2/3.3 and the many models saved in its
// layout): pre-norm SwiGLU decoder, optional attention and MLP biases.
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

absl::Status ParseLlama(const ConfigReader& reader, ModelConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(ParseAttentionBias(reader, config));
  LORAPLEX_ASSIGN_OR_RETURN(config.mlp_bias, reader.Bool("mlp_bias", false));
  return absl::OkStatus();
}

void WriteLlama(const ModelConfig& config, nlohmann::json& out) {
  out["attention_bias"] = config.qkv_bias;
  out["mlp_bias"] = config.mlp_bias;
}

}  // namespace

const ModelFamilySpec& LlamaFamily() {
  static const ModelFamilySpec spec{
      "llama", {"LlamaForCausalLM"}, ParseLlama, WriteLlama};
  return spec;
}

}  // namespace loraplex
