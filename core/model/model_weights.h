// The frozen tensors of a decoder-only base model and how they are named.
//
// `ModelTensorSpecs` lists every tensor a config implies, with Hugging Face
// names and shapes; `LoadModelWeights` reads a checkpoint directory against
// that list and reports every missing, misshapen or unexpected tensor at once.
#ifndef LORAPLEX_CORE_MODEL_MODEL_WEIGHTS_H_
#define LORAPLEX_CORE_MODEL_MODEL_WEIGHTS_H_

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/model/model_config.h"
#include "core/model/projection.h"

namespace loraplex {

// The checkpoint's storage dtype as a LibTorch scalar type.
torch::ScalarType TorchScalarType(StoredDtype dtype);

// {out_features, in_features} of the projection's weight (of one expert's
// for the experts' projections).
std::array<int64_t, 2> ProjectionShape(const ModelConfig& config,
                                       Projection projection);
bool ProjectionHasBias(const ModelConfig& config, Projection projection);

struct LinearWeights {
  torch::Tensor weight;  // [out, in].
  torch::Tensor bias;    // [out], or undefined.
};

// A layer's norms as the config's NormPlacement and QkNorm call for them;
// those a layout does not have stay undefined.
struct LayerWeights {
  torch::Tensor input_norm;             // [hidden]; not with kPostNorm.
  torch::Tensor post_attention_norm;    // [hidden].
  torch::Tensor pre_feedforward_norm;   // [hidden]; kSandwich only.
  torch::Tensor post_feedforward_norm;  // [hidden]; kPostNorm, kSandwich.
  torch::Tensor q_norm;  // [head_dim] or [heads * head_dim]; with a QkNorm.
  torch::Tensor k_norm;  // [head_dim] or [kv_heads * head_dim].
  // By Projection; those of LayerProjections(config, layer). The experts'
  // (kExpertGateUp, kExpertDown) are stacked: weight [experts, out, in]
  // (possibly a transposed view of what the checkpoint stores), bias
  // [experts, out].
  std::array<LinearWeights, kNumProjectionIds> projections;
  // Mixture-of-experts layers: the router, weight [experts, hidden] and
  // bias [experts] or undefined.
  LinearWeights router;
  // Attention sinks [heads] (ModelConfig::attention_sinks).
  torch::Tensor sinks;

  const LinearWeights& at(Projection p) const {
    return projections[static_cast<int>(p)];
  }
};

struct ModelWeights {
  torch::Tensor embed_tokens;  // [vocab, hidden].
  std::vector<LayerWeights> layers;
  torch::Tensor final_norm;  // [hidden].
  torch::Tensor lm_head;     // [vocab, hidden]; aliases embed_tokens if tied.
};

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// A projection's tensor names in decoder layer `layer`:
// "model.layers.0.self_attn.q_proj.weight" / ".bias"; for the experts the
// stacked parameters "model.layers.0.mlp.experts.gate_up_proj" / "..._bias".
std::string ProjectionWeightName(int64_t layer, Projection projection);
std::string ProjectionBiasName(int64_t layer, Projection projection);

// Every tensor of `config`'s weights, in a fixed order, named and shaped as
// the model holds them. Checkpoints store them so, except the experts'
// stacked weights, which may also be stored transposed
// (MoeConfig::experts_transposed) or one linear layer per expert
// (mlp.experts.{e}.gate_proj/up_proj/down_proj.weight, as the Hub's Qwen3-MoE
// checkpoints and transformers' save_pretrained write them).
std::vector<TensorSpec> ModelTensorSpecs(const ModelConfig& config);

// Builds ModelWeights from tensors named as in ModelTensorSpecs. `fetch`
// returns the tensor for a name (already validated for presence and shape),
// converted as the caller wants.
ModelWeights AssembleModelWeights(
    const ModelConfig& config,
    const std::function<torch::Tensor(const std::string&)>& fetch);

// Loads the safetensors weights in `dir` for `config`, converted to `dtype`
// on `device`, frozen (requires_grad false).
absl::StatusOr<ModelWeights> LoadModelWeights(const std::string& dir,
                                              const ModelConfig& config,
                                              torch::ScalarType dtype,
                                              torch::Device device);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_MODEL_WEIGHTS_H_
