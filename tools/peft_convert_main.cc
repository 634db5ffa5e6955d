// loraplex-peft-convert: rewrites a PEFT adapter of a Qwen3-MoE base whose
// experts' LoRA is stacked (PEFT's target_parameters on transformers 5, as
// loraplex exports it) with one LoRA per expert's gate_proj, up_proj and
// down_proj instead: the layout vLLM loads for Qwen3-MoE without
// --enable-mixed-moe-lora-format.
//
//   loraplex-peft-convert --base BASE_DIR ADAPTER_DIR OUT_DIR
#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "adapters/peft_adapter.h"
#include "core/common/status_macros.h"
#include "core/model/model_config.h"

namespace loraplex {
namespace {

absl::Status Convert(const std::string& base, const std::string& in,
                     const std::string& out) {
  LORAPLEX_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(base));
  LORAPLEX_ASSIGN_OR_RETURN(PeftAdapter adapter, LoadPeftAdapter(in, config));
  // The weights keep the stored precision (fp64 adapters stay fp64).
  const torch::ScalarType dtype = adapter.modules.empty()
                                      ? torch::kFloat32
                                      : adapter.modules[0].a.scalar_type();
  LoraWeights weights(config, torch::kCPU, dtype);
  LORAPLEX_RETURN_IF_ERROR(weights.Bind(adapter.config).status());
  LORAPLEX_RETURN_IF_ERROR(CopyPeftAdapter(adapter, weights));
  return ExportPeftAdapter(weights, adapter.base_model_name_or_path, out,
                           PeftExpertLayout::kPerExpert);
}

}  // namespace
}  // namespace loraplex

int main(int argc, char** argv) {
  CLI::App app{
      "Rewrite a PEFT adapter of a Qwen3-MoE base with one LoRA per "
      "expert's gate_proj, up_proj and down_proj (the layout vLLM loads)."};
  std::string base, in, out;
  app.add_option("--base", base,
                 "The base model's checkpoint directory (its config.json "
                 "is read)")
      ->required();
  app.add_option("IN", in, "The adapter directory to read (experts stacked)")
      ->required();
  app.add_option("OUT", out, "The directory to write")->required();
  CLI11_PARSE(app, argc, argv);
  const absl::Status status = loraplex::Convert(base, in, out);
  if (!status.ok()) {
    std::cerr << "loraplex-peft-convert: " << status.message() << "\n";
    return 1;
  }
  std::cout << "wrote " << out << "\n";
  return 0;
}
