// One adapter's trainable tensors: for each adapted (layer, projection) an
// A [rank, in] and a B [out, rank] (for a mixture-of-experts layer's
// stacked experts, one of each per expert nested in one pair, see
// LoraModule), leaves that require grad, in fp32 (or
// fp64 for a float64 base, see core/runtime/float_dtype.h); and when the LM
// head is adapted, its A [rank, hidden] and B [vocab, rank].
//
// The tensors are views into storage that is kept across Bind() calls, so a
// slot that is retired and attached again with a rank that fits reuses its
// memory:
//
//   LoraWeights weights(model_config, torch::kCPU);
//   LORAPLEX_RETURN_IF_ERROR(weights.Bind(lora_config));
//   weights.InitPeft(seed);   // A kaiming-uniform(a=√5), B zeros
//   optimizer = BuildSlotOptimizer(opt_config, weights.parameters(),
//                                  weights.parameter_layouts());
#ifndef LORAPLEX_CORE_LORA_LORA_WEIGHTS_H_
#define LORAPLEX_CORE_LORA_LORA_WEIGHTS_H_

#include <torch/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "core/lora/lora_config.h"
#include "core/model/model_config.h"
#include "core/model/model_weights.h"
#include "core/optim/param_layout.h"

namespace loraplex {

struct LoraModule {
  int layer = 0;  // kLmHeadLayer for Projection::kLmHead.
  Projection projection = Projection::kQ;
  torch::Tensor a;  // [rank, in]; the experts' [experts * rank, in].
  torch::Tensor b;  // [out, rank]; the experts' [out, rank * experts].

  // The experts' modules (IsExpertProjection) nest one LoRA per expert as
  // PEFT's target_parameters do: expert e's A is rows e*rank..(e+1)*rank-1
  // of `a`, its B the columns e, e + experts, e + 2*experts, ... of `b`.
  int64_t experts = 1;

  // A as [experts, rank, in] and B as [experts, out, rank] (views; one
  // expert for a plain module).
  torch::Tensor ExpertA() const { return a.view({experts, -1, a.size(1)}); }
  torch::Tensor ExpertB() const {
    return b.view({b.size(0), -1, experts}).permute({2, 0, 1});
  }
};

class LoraWeights {
 public:
  // `dtype`: the base's compute dtype; the weights take Fp32OrFp64 of it.
  LoraWeights(const ModelConfig& model, torch::Device device,
              torch::ScalarType dtype = torch::kFloat32);

  // Shapes the tensors for `config` (validated here, its targets fitted to
  // the model: FitLoraTargets; config() has them fitted), reusing the storage
  // of each (layer, projection) when it is large enough. Values are
  // unspecified until InitPeft() or CopyFrom(). Returns the number of
  // storage blocks that had to be allocated.
  absl::StatusOr<int> Bind(const LoraConfig& config);
  // Drops the tensors (storage kept); bound() becomes false.
  void Unbind();
  bool bound() const { return config_.has_value(); }

  // PEFT's initialisation: A ~ U(-1/√in, 1/√in) (kaiming-uniform with
  // a = √5), B = 0, drawn from a generator seeded with `seed`, module by
  // module in modules() order.
  void InitPeft(uint64_t seed);
  // Zeroes every tensor and its gradient in place.
  void Zero();

  const LoraConfig& config() const { return *config_; }
  double scale() const { return scale_; }
  const ModelConfig& model_config() const { return model_; }
  torch::Device device() const { return device_; }
  torch::ScalarType dtype() const { return dtype_; }

  // Adapted modules, layer-major, projections in Projection order, the LM
  // head's last.
  const std::vector<LoraModule>& modules() const { return modules_; }
  // The module for (layer, projection) of a decoder layer, or nullptr when
  // not adapted.
  const LoraModule* Find(int layer, Projection projection) const;
  // The LM head's module, or nullptr when not adapted.
  const LoraModule* lm_head() const;
  // A and B of every module, in modules() order (A before B).
  std::vector<torch::Tensor> parameters() const;
  // Parallel to parameters(): one matrix each, except the experts' A
  // (ExpertStacking::kRows) and B (kColumns), which hold one per expert.
  std::vector<ParamLayout> parameter_layouts() const;

 private:
  struct Storage {
    torch::Tensor a;  // Flat, capacity rank_capacity * in.
    torch::Tensor b;  // Flat, capacity out * rank_capacity.
  };
  int LmHeadIndex() const {
    return model_.num_hidden_layers * kNumProjectionIds;
  }

  ModelConfig model_;
  torch::Device device_;
  torch::ScalarType dtype_;
  std::optional<LoraConfig> config_;
  double scale_ = 0.0;
  std::vector<LoraModule> modules_;
  // By layer * kNumProjectionIds + projection, then one for the LM head; -1
  // when not adapted.
  std::vector<int> module_index_;
  std::vector<Storage> storage_;  // Same indexing.
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_LORA_LORA_WEIGHTS_H_
