// The model shapes the device benchmarks run: the published configs of
// Qwen2.5-0.5B ("0.5b"), Qwen2.5-1.5B ("1.5b"), Meta-Llama-3-8B ("8b") and
// Qwen3-30B-A3B ("30b-a3b"), or a built-in preset ("tiny", "small",
// "tiny-moe"), with random weights generated
// where the model runs (no files).
//
//   LORAPLEX_ASSIGN_OR_RETURN(ModelConfig config, ShapeConfig("8b"));
//   std::unique_ptr<LlamaModel> model =
//       RandomModel(config, torch::kBFloat16, device);
#ifndef LORAPLEX_BENCH_MODEL_SHAPES_H_
#define LORAPLEX_BENCH_MODEL_SHAPES_H_

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/model/llama_model.h"
#include "core/model/model_config.h"
#include "core/model/model_presets.h"
#include "core/model/model_weights.h"

namespace loraplex {

// The shapes' config.json files as published (Qwen/Qwen2.5-0.5B,
// Qwen/Qwen2.5-1.5B, meta-llama/Meta-Llama-3-8B, Qwen/Qwen3-30B-A3B).
inline const std::map<std::string, std::string>& PublishedShapeConfigs() {
  static const auto* configs = new std::map<std::string, std::string>{
      {"0.5b",
       R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
           "vocab_size": 151936, "hidden_size": 896,
           "intermediate_size": 4864, "num_hidden_layers": 24,
           "num_attention_heads": 14, "num_key_value_heads": 2,
           "max_position_embeddings": 32768, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "tie_word_embeddings": true})"},
      {"1.5b",
       R"({"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
           "vocab_size": 151936, "hidden_size": 1536,
           "intermediate_size": 8960, "num_hidden_layers": 28,
           "num_attention_heads": 12, "num_key_value_heads": 2,
           "max_position_embeddings": 131072, "rms_norm_eps": 1e-6,
           "rope_theta": 1000000.0, "tie_word_embeddings": true})"},
      {"8b",
       R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
           "vocab_size": 128256, "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8,
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
           "rope_theta": 500000.0, "tie_word_embeddings": false})"},
      {"30b-a3b",
       R"({"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "vocab_size": 151936, "hidden_size": 2048,
           "intermediate_size": 6144, "moe_intermediate_size": 768,
           "num_hidden_layers": 48, "num_attention_heads": 32,
           "num_key_value_heads": 4, "head_dim": 128,
           "num_experts": 128, "num_experts_per_tok": 8,
           "norm_topk_prob": true, "decoder_sparse_step": 1,
           "mlp_only_layers": [], "max_position_embeddings": 40960,
           "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
           "tie_word_embeddings": false})"},
  };
  return *configs;
}

// True for a shape with a published config, false for a preset.
inline bool IsPublishedShape(const std::string& shape) {
  return PublishedShapeConfigs().count(shape) > 0;
}

// The config of "0.5b", "1.5b", "8b" or a preset (PresetConfig).
inline absl::StatusOr<ModelConfig> ShapeConfig(const std::string& shape) {
  auto it = PublishedShapeConfigs().find(shape);
  if (it == PublishedShapeConfigs().end()) return PresetConfig(shape);
  return ParseModelConfig(it->second, shape + " config");
}

// Random weights of `config` on `device`: N(0, 0.02²) matrices, unit norms.
inline std::unique_ptr<LlamaModel> RandomModel(const ModelConfig& config,
                                               torch::ScalarType dtype,
                                               const torch::Device& device) {
  std::map<std::string, std::vector<int64_t>> shapes;
  for (const TensorSpec& spec : ModelTensorSpecs(config)) {
    shapes[spec.name] = spec.shape;
  }
  const auto options = torch::TensorOptions().dtype(dtype).device(device);
  ModelWeights weights =
      AssembleModelWeights(config, [&](const std::string& name) {
        const std::vector<int64_t>& shape = shapes.at(name);
        if (name.find("norm") != std::string::npos && shape.size() == 1) {
          return torch::ones(shape, options);
        }
        return torch::randn(shape, options).mul_(0.02);
      });
  return std::make_unique<LlamaModel>(config, std::move(weights), dtype,
                                      device);
}

}  // namespace loraplex

#endif  // LORAPLEX_BENCH_MODEL_SHAPES_H_
