// libFuzzer target: an uploaded adapter_config.json.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "adapters/peft_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Four layers, the first dense and the others mixtures of experts, so
  // that target_modules and target_parameters both have modules to name.
  static const loraplex::ModelConfig* const model = [] {
    auto* config = new loraplex::ModelConfig();
    config->model_type = "qwen3_moe";
    config->num_hidden_layers = 4;
    config->moe.num_experts = 4;
    config->moe.top_k = 2;
    config->moe.sparse_layers = {false, true, true, true};
    return config;
  }();
  loraplex::ParsePeftConfigText(
      absl::string_view(reinterpret_cast<const char*>(data), size), *model,
      "adapter_config.json")
      .IgnoreError();
  return 0;
}
