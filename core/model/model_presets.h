// The built-in base models: deterministic random Llama checkpoints that let
// the server, the tools and the tests run with no download.
//
//   LORAPLEX_RETURN_IF_ERROR(WritePresetModel("tiny", /*seed=*/0, out_dir));
//
// The directory gets the exact Hugging Face layout (config.json +
// model.safetensors) plus the byte-level tokenizer description, so it also
// loads in HF transformers. Weights are drawn from a portable generator
// (splitmix64 + Box-Muller) keyed by seed and tensor name: the same seed
// gives the same bytes on every platform and LibTorch version.
#ifndef LORAPLEX_CORE_MODEL_MODEL_PRESETS_H_
#define LORAPLEX_CORE_MODEL_MODEL_PRESETS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/model_config.h"

namespace loraplex {

// Names accepted by PresetConfig: "tiny" (tests, default server model),
// "small" (benchmarks: hidden 512, 4 layers) and "tiny-moe" (tiny's
// attention over 8 experts, 2 per token: qwen3_moe).
std::vector<std::string> PresetNames();

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view preset);

// Writes the preset's checkpoint and tokenizer description into `dir`
// (created if needed).
absl::Status WritePresetModel(absl::string_view preset, uint64_t seed,
                              const std::string& dir);

// Writes a random checkpoint for an arbitrary `config` into `dir`.
absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed,
                              const std::string& dir);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_MODEL_PRESETS_H_
