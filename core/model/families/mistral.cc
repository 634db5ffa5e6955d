// model_type "mistral" (Mistral 7B, Mistral Small, Ministral in its text
// layout): Llama's layout with an optional sliding window on every layer.
#include "core/common/status_macros.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

absl::Status ParseMistral(const ConfigReader& reader, ModelConfig& config) {
  return ParseSlidingWindow(reader, config);
}

// sliding_window is written with every family's keys (ModelConfigToJson).
void WriteMistral(const ModelConfig& /*config*/, nlohmann::json& /*out*/) {}

}  // namespace

const ModelFamilySpec& MistralFamily() {
  static const ModelFamilySpec spec{
      "mistral", {"MistralForCausalLM"}, ParseMistral, WriteMistral};
  return spec;
}

}  // namespace loraplex
