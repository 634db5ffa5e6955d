// The frozen Llama-family decoder every adapter trains on (DESIGN.md §2).
//
// Loads a Hugging Face checkpoint directory (config.json + safetensors, single
// or sharded) and runs the decoder over right-padded batches:
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto model, LlamaModel::Load(dir, {}));
//   LORAPLEX_ASSIGN_OR_RETURN(torch::Tensor logits,
//                             model->Forward(input_ids, lengths));
//
// RMSNorm is computed in fp32, attention softmax in fp32; weights stay in the
// compute dtype (fp32 or bf16) and never require gradients.
#ifndef LORAPLEX_CORE_MODEL_LLAMA_MODEL_H_
#define LORAPLEX_CORE_MODEL_LLAMA_MODEL_H_

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "core/model/model_config.h"
#include "core/model/model_weights.h"
#include "core/model/rope.h"

namespace loraplex {

struct ModelLoadOptions {
  torch::Device device = torch::kCPU;
  // Compute dtype (fp32 or bf16). Unset: the checkpoint's dtype, with fp16
  // checkpoints computed in fp32.
  std::optional<torch::ScalarType> dtype;
};

class LlamaModel {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(
      const std::string& dir, const ModelLoadOptions& options);

  LlamaModel(ModelConfig config, ModelWeights weights, torch::ScalarType dtype,
             torch::Device device);

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  torch::ScalarType dtype() const { return dtype_; }
  torch::Device device() const { return device_; }

  // input_ids: int64 [batch, seq], right-padded, every id in [0, vocab).
  // lengths: int64 [batch], each in [1, seq]: the valid prefix of each row.
  // Returns fp32 logits [batch, seq, vocab]; rows past their length hold
  // values that must be ignored.
  absl::StatusOr<torch::Tensor> Forward(const torch::Tensor& input_ids,
                                        const torch::Tensor& lengths) const;

  // As Forward, but returns the final normed hidden states [batch, seq,
  // hidden] in the compute dtype, for losses computed in chunks.
  absl::StatusOr<torch::Tensor> ForwardHidden(
      const torch::Tensor& input_ids, const torch::Tensor& lengths) const;

  // LM head applied to hidden states; fp32 logits.
  torch::Tensor Logits(const torch::Tensor& hidden) const;

 private:
  absl::Status ValidateBatch(const torch::Tensor& input_ids,
                             const torch::Tensor& lengths) const;
  torch::Tensor AttentionMask(const torch::Tensor& lengths,
                              int64_t seq_len) const;
  torch::Tensor RmsNorm(const torch::Tensor& x,
                        const torch::Tensor& weight) const;
  torch::Tensor Attention(const LayerWeights& layer, const torch::Tensor& x,
                          const RopeTables& rope,
                          const torch::Tensor& mask) const;
  torch::Tensor Mlp(const LayerWeights& layer, const torch::Tensor& x) const;
  torch::Tensor HiddenStates(const torch::Tensor& input_ids,
                             const torch::Tensor& lengths) const;

  ModelConfig config_;
  ModelWeights weights_;
  torch::ScalarType dtype_;
  torch::Device device_;
  RotaryEmbedding rotary_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_LLAMA_MODEL_H_
