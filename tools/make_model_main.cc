// loraplex-make-model: writes a built-in base model (deterministic from a
// seed) in the Hugging Face checkpoint layout.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <string>

#include "core/model/model_presets.h"
#include "core/model/model_weights.h"

int main(int argc, char** argv) {
  CLI::App app{
      "Write a built-in random Llama-family model (config.json, "
      "model.safetensors, tokenizer description) to a directory."};
  std::string preset = "tiny";
  uint64_t seed = 0;
  std::string out;
  app.add_option("--preset", preset, "Model size")
      ->check(CLI::IsMember(loraplex::PresetNames()))
      ->capture_default_str();
  app.add_option("--seed", seed, "Seed of the weights")->capture_default_str();
  app.add_option("--out", out, "Output directory")->required();
  CLI11_PARSE(app, argc, argv);

  absl::Status status = loraplex::WritePresetModel(preset, seed, out);
  if (!status.ok()) {
    std::cerr << "loraplex-make-model: " << status.message() << "\n";
    return 1;
  }
  const loraplex::ModelConfig config = *loraplex::PresetConfig(preset);
  int64_t parameters = 0;
  for (const auto& spec : loraplex::ModelTensorSpecs(config)) {
    int64_t numel = 1;
    for (int64_t dim : spec.shape) numel *= dim;
    parameters += numel;
  }
  std::cout << "wrote " << preset << " model (seed " << seed << ", "
            << parameters << " parameters, hidden " << config.hidden_size
            << ", " << config.num_hidden_layers << " layers) to " << out
            << "\n";
  return 0;
}
