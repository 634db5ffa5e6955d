#include "core/model/model_presets.h"

#include <torch/torch.h>

#include <cmath>
#include <filesystem>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/atomic_file.h"
#include "core/common/status_macros.h"
#include "core/model/model_family.h"
#include "core/model/model_weights.h"
#include "core/safetensors/safetensors.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {
namespace {

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t Fnv1a(absl::string_view text) {
  uint64_t hash = 0xCBF29CE484222325ull;
  for (char c : text) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001B3ull;
  }
  return hash;
}

// Normal(0, stddev) samples from a stream keyed by (seed, name).
torch::Tensor PortableNormal(const std::vector<int64_t>& shape, double stddev,
                             uint64_t seed, absl::string_view name) {
  torch::Tensor out = torch::empty(shape, torch::kFloat32);
  float* data = out.data_ptr<float>();
  const int64_t n = out.numel();
  uint64_t state = seed ^ Fnv1a(name);
  auto uniform = [&]() {  // (0, 1], 53 random bits.
    return (static_cast<double>(SplitMix64(state) >> 11) + 1.0) * 0x1.0p-53;
  };
  for (int64_t i = 0; i < n; i += 2) {
    const double radius = std::sqrt(-2.0 * std::log(uniform()));
    const double angle = 2.0 * M_PI * uniform();
    data[i] = static_cast<float>(stddev * radius * std::cos(angle));
    if (i + 1 < n)
      data[i + 1] = static_cast<float>(stddev * radius * std::sin(angle));
  }
  return out;
}

ModelConfig TinyConfig() {
  ModelConfig config;
  config.model_type = "llama";
  config.vocab_size = ByteTokenizer::kVocabSize;
  config.hidden_size = 64;
  config.intermediate_size = 176;
  config.num_hidden_layers = 2;
  config.num_attention_heads = 4;
  config.num_key_value_heads = 2;
  config.head_dim = 16;
  config.max_position_embeddings = 2048;
  config.rms_norm_eps = 1e-5;
  config.bos_token_id = ByteTokenizer::kBos;
  config.eos_token_id = ByteTokenizer::kEos;
  config.pad_token_id = ByteTokenizer::kPad;
  return config;
}

ModelConfig SmallConfig() {
  ModelConfig config = TinyConfig();
  config.hidden_size = 512;
  config.intermediate_size = 1408;
  config.num_hidden_layers = 4;
  config.num_attention_heads = 8;
  config.num_key_value_heads = 4;
  config.head_dim = 64;
  return config;
}

// tiny's attention (with Qwen3's per-head q/k norms) over a mixture of 8
// experts, 2 per token, in every layer.
ModelConfig TinyMoeConfig() {
  ModelConfig config = TinyConfig();
  config.model_type = "qwen3_moe";
  config.qk_norm = QkNorm::kPerHead;
  config.moe.num_experts = 8;
  config.moe.top_k = 2;
  config.moe.intermediate_size = 64;
  config.moe.norm_topk_prob = true;
  config.moe.sparse_layers.assign(config.num_hidden_layers, true);
  return config;
}

}  // namespace

std::vector<std::string> PresetNames() { return {"tiny", "small", "tiny-moe"}; }

absl::StatusOr<ModelConfig> PresetConfig(absl::string_view preset) {
  if (preset == "tiny") return TinyConfig();
  if (preset == "small") return SmallConfig();
  if (preset == "tiny-moe") return TinyMoeConfig();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown preset \"", preset,
      "\" (choose one of: ", absl::StrJoin(PresetNames(), ", "), ")"));
}

absl::Status WriteRandomModel(const ModelConfig& config, uint64_t seed,
                              const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  fs::create_directories(dir, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot create ", dir, ": ", error.message()));
  }
  std::vector<NamedTensor> tensors;
  for (const TensorSpec& spec : ModelTensorSpecs(config)) {
    torch::Tensor tensor;
    const bool bias = spec.shape.size() == 1 ||
                      absl::EndsWith(spec.name, "bias");  // Experts': 2-D.
    if (spec.shape.size() == 1 && spec.name.find("norm") != std::string::npos) {
      // The identity norm: weight 1, or 0 where it is applied as (1 + w).
      tensor = config.norm_style == NormStyle::kOnePlusWeight
                   ? torch::zeros(spec.shape, torch::kFloat32)
                   : torch::ones(spec.shape, torch::kFloat32);
    } else if (bias) {
      tensor = PortableNormal(spec.shape, 0.02, seed, spec.name);
    } else if (spec.name == "model.embed_tokens.weight") {
      tensor = PortableNormal(spec.shape, 1.0, seed, spec.name);
    } else {
      // Fan-in scaling keeps activations O(1) through the stack (an
      // expert stack's matrices are [experts, out, in]).
      const double fan_in = static_cast<double>(spec.shape.back());
      tensor =
          PortableNormal(spec.shape, 1.0 / std::sqrt(fan_in), seed, spec.name);
      // Checkpoints of such a family store each expert as [in, out].
      if (spec.shape.size() == 3 && config.moe.experts_transposed) {
        tensor = tensor.transpose(1, 2).contiguous();
      }
    }
    // A multimodal wrapper's text model, under transformers 5's paths.
    const WrappedTextModel* wrapped = WrappedTextModelOf(config);
    tensors.push_back({wrapped == nullptr
                           ? spec.name
                           : WrappedName(wrapped->layouts.front(), spec.name),
                       tensor.to(TorchScalarType(config.dtype))});
  }
  const fs::path root(dir);
  LORAPLEX_RETURN_IF_ERROR(WriteSafetensors(
      (root / "model.safetensors").string(), tensors, {{"format", "pt"}}));
  LORAPLEX_RETURN_IF_ERROR(WriteFileAtomically((root / "config.json").string(),
                                               ModelConfigToJson(config)));
  if (config.vocab_size != ByteTokenizer::kVocabSize) return absl::OkStatus();
  return WriteFileAtomically((root / std::string(kByteTokenizerFile)).string(),
                             ByteTokenizer::DescriptionJson());
}

absl::Status WritePresetModel(absl::string_view preset, uint64_t seed,
                              const std::string& dir) {
  LORAPLEX_ASSIGN_OR_RETURN(ModelConfig config, PresetConfig(preset));
  return WriteRandomModel(config, seed, dir);
}

}  // namespace loraplex
