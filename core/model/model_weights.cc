#include "core/model/model_weights.h"

#include <torch/torch.h>

#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/model/checkpoint_weights.h"
#include "core/model/model_family.h"

namespace loraplex {
namespace {

std::string LayerPrefix(int64_t layer) {
  return absl::StrCat("model.layers.", layer, ".");
}

}  // namespace

torch::ScalarType TorchScalarType(StoredDtype dtype) {
  switch (dtype) {
    case StoredDtype::kFloat32:
      break;
    case StoredDtype::kBFloat16:
      return torch::kBFloat16;
    case StoredDtype::kFloat16:
      return torch::kFloat16;
  }
  return torch::kFloat32;
}

std::array<int64_t, 2> ProjectionShape(const ModelConfig& config,
                                       Projection projection) {
  const int64_t hidden = config.hidden_size;
  const int64_t q_width = config.num_attention_heads * config.head_dim;
  const int64_t kv_width = config.num_key_value_heads * config.head_dim;
  switch (projection) {
    case Projection::kQ:
      return {q_width, hidden};
    case Projection::kK:
    case Projection::kV:
      return {kv_width, hidden};
    case Projection::kO:
      return {hidden, q_width};
    case Projection::kGate:
    case Projection::kUp:
      return {config.intermediate_size, hidden};
    case Projection::kDown:
      return {hidden, config.intermediate_size};
    case Projection::kQkv:
      return {q_width + 2 * kv_width, hidden};
    case Projection::kGateUp:
      return {2 * config.intermediate_size, hidden};
    case Projection::kExpertGateUp:
      return {2 * config.moe.intermediate_size, hidden};
    case Projection::kExpertDown:
      return {hidden, config.moe.intermediate_size};
    case Projection::kLmHead:
      return {config.vocab_size, hidden};
  }
  return {0, 0};
}

bool ProjectionHasBias(const ModelConfig& config, Projection projection) {
  switch (projection) {
    case Projection::kQ:
    case Projection::kK:
    case Projection::kV:
    case Projection::kQkv:
      return config.qkv_bias;
    case Projection::kO:
      return config.o_bias;
    case Projection::kLmHead:
      return false;
    case Projection::kExpertGateUp:
    case Projection::kExpertDown:
      return config.moe.expert_bias;
    default:
      return config.mlp_bias;
  }
}

namespace {

// A layer's norm tensors with the field of LayerWeights each fills, in
// checkpoint order.
struct LayerNorm {
  const char* module;
  torch::Tensor LayerWeights::*field;
  int64_t width;
};

std::vector<LayerNorm> LayerNorms(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  std::vector<LayerNorm> norms;
  if (config.norm_placement != NormPlacement::kPostNorm) {
    norms.push_back({"input_layernorm", &LayerWeights::input_norm, hidden});
  }
  norms.push_back(
      {"post_attention_layernorm", &LayerWeights::post_attention_norm, hidden});
  if (config.norm_placement == NormPlacement::kSandwich) {
    norms.push_back({"pre_feedforward_layernorm",
                     &LayerWeights::pre_feedforward_norm, hidden});
  }
  if (config.norm_placement != NormPlacement::kPreNorm) {
    norms.push_back({"post_feedforward_layernorm",
                     &LayerWeights::post_feedforward_norm, hidden});
  }
  switch (config.qk_norm) {
    case QkNorm::kNone:
      break;
    case QkNorm::kPerHead:
      norms.push_back(
          {"self_attn.q_norm", &LayerWeights::q_norm, config.head_dim});
      norms.push_back(
          {"self_attn.k_norm", &LayerWeights::k_norm, config.head_dim});
      break;
    case QkNorm::kWholeProjection:
      norms.push_back({"self_attn.q_norm", &LayerWeights::q_norm,
                       config.num_attention_heads * config.head_dim});
      norms.push_back({"self_attn.k_norm", &LayerWeights::k_norm,
                       config.num_key_value_heads * config.head_dim});
      break;
  }
  return norms;
}

}  // namespace

std::string ProjectionWeightName(int64_t layer, Projection projection) {
  const std::string module =
      LayerPrefix(layer) + std::string(ProjectionModule(projection));
  // The experts are stacked parameters of one module, not linear layers.
  return IsExpertProjection(projection) ? module : module + ".weight";
}

std::string ProjectionBiasName(int64_t layer, Projection projection) {
  const std::string module =
      LayerPrefix(layer) + std::string(ProjectionModule(projection));
  return IsExpertProjection(projection) ? module + "_bias" : module + ".bias";
}

std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& config) {
  const int64_t hidden = config.hidden_size;
  const int64_t experts = config.moe.num_experts;
  std::vector<TensorSpec> specs;
  specs.push_back({"model.embed_tokens.weight", {config.vocab_size, hidden}});
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = LayerPrefix(layer);
    for (const LayerNorm& norm : LayerNorms(config)) {
      specs.push_back(
          {absl::StrCat(prefix, norm.module, ".weight"), {norm.width}});
    }
    if (config.attention_sinks) {
      specs.push_back(
          {prefix + "self_attn.sinks", {config.num_attention_heads}});
    }
    if (LayerIsSparse(config, layer)) {
      const std::string router = prefix + config.moe.router_module;
      specs.push_back({router + ".weight", {experts, hidden}});
      if (config.moe.router_bias)
        specs.push_back({router + ".bias", {experts}});
    }
    for (Projection p : LayerProjections(config, layer)) {
      const auto [out, in] = ProjectionShape(config, p);
      const bool stacked = IsExpertProjection(p);
      specs.push_back({ProjectionWeightName(layer, p),
                       stacked ? std::vector<int64_t>{experts, out, in}
                               : std::vector<int64_t>{out, in}});
      if (ProjectionHasBias(config, p)) {
        specs.push_back({ProjectionBiasName(layer, p),
                         stacked ? std::vector<int64_t>{experts, out}
                                 : std::vector<int64_t>{out}});
      }
    }
  }
  specs.push_back({"model.norm.weight", {hidden}});
  if (!config.tie_word_embeddings) {
    specs.push_back({"lm_head.weight", {config.vocab_size, hidden}});
  }
  return specs;
}

ModelWeights AssembleModelWeights(
    const ModelConfig& config,
    const std::function<torch::Tensor(const std::string&)>& fetch) {
  ModelWeights weights;
  weights.embed_tokens = fetch("model.embed_tokens.weight");
  for (int64_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    const std::string prefix = LayerPrefix(layer);
    LayerWeights lw;
    for (const LayerNorm& norm : LayerNorms(config)) {
      lw.*norm.field = fetch(absl::StrCat(prefix, norm.module, ".weight"));
    }
    if (config.attention_sinks) lw.sinks = fetch(prefix + "self_attn.sinks");
    if (LayerIsSparse(config, layer)) {
      const std::string router = prefix + config.moe.router_module;
      lw.router.weight = fetch(router + ".weight");
      if (config.moe.router_bias) lw.router.bias = fetch(router + ".bias");
    }
    for (Projection p : LayerProjections(config, layer)) {
      LinearWeights& linear = lw.projections[static_cast<int>(p)];
      linear.weight = fetch(ProjectionWeightName(layer, p));
      if (ProjectionHasBias(config, p)) {
        linear.bias = fetch(ProjectionBiasName(layer, p));
      }
    }
    weights.layers.push_back(std::move(lw));
  }
  weights.final_norm = fetch("model.norm.weight");
  weights.lm_head = config.tie_word_embeddings ? weights.embed_tokens
                                               : fetch("lm_head.weight");
  return weights;
}

absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& dir,
                                              const ModelConfig& config,
                                              torch::ScalarType dtype,
                                              torch::Device device) {
  LORAPLEX_ASSIGN_OR_RETURN(CheckpointWeights checkpoint,
                            CheckpointWeights::Open(dir, config, dtype));
  absl::Status load_status;
  ModelWeights weights = AssembleModelWeights(
      config, [&](const std::string& name) -> torch::Tensor {
        absl::StatusOr<torch::Tensor> loaded = checkpoint.Load(name, device);
        if (!loaded.ok()) {
          if (load_status.ok()) load_status = loaded.status();
          return torch::Tensor();
        }
        return *std::move(loaded);
      });
  LORAPLEX_RETURN_IF_ERROR(load_status);
  return weights;
}

}  // namespace loraplex
