// A mixture-of-experts MLP (ModelConfig::moe; docs/DESIGN.md §2): the
// router picks each token's experts, the tokens are grouped by expert, and
// each expert's gate_up and down projections run over its group; adapter
// terms come from ProjectionDelta::AddToExperts on the grouped inputs, so
// co-batched adapters share every expert's base GEMM.
//
//   ExpertRouting routing = RouteTokens(config, weights.router, x2d);
//   torch::Tensor y = RunExperts(config, layer, weights, x2d, routing,
//                                rows, delta);
#ifndef LORAPLEX_CORE_MODEL_EXPERTS_H_
#define LORAPLEX_CORE_MODEL_EXPERTS_H_

#include <torch/types.h>

#include <cstdint>
#include <vector>

#include "core/model/model_config.h"
#include "core/model/model_weights.h"

namespace loraplex {

class ProjectionDelta;

// Where one layer's tokens go: the (token, expert) pairs, top_k per token,
// sorted by expert (tokens ascending within an expert, the order
// transformers adds the experts' outputs in).
struct ExpertRouting {
  torch::Tensor tokens;         // int64 [pairs]: each pair's token.
  torch::Tensor weights;        // [pairs]: its router weight (x's dtype).
  std::vector<int64_t> counts;  // Pairs per expert, on the CPU.
};

// Sees each mixture-of-experts layer's routing during a forward pass, as
// ProjectionDelta::ObserveRouting hands it on (e.g. to count the tokens each
// expert receives: core/train/expert_token_counter.h).
class RoutingObserver {
 public:
  virtual ~RoutingObserver() = default;
  virtual void Observe(int layer, const ExpertRouting& routing) = 0;
};

// Routes the tokens x [tokens, hidden] as config.moe.router says: softmax
// (in fp32, fp64 for an fp64 model) then the top k, renormalised when
// norm_topk_prob (Qwen3-MoE); or the top k logits then their softmax
// (gpt-oss).
ExpertRouting RouteTokens(const ModelConfig& config,
                          const LinearWeights& router, const torch::Tensor& x);

// The experts' weighted outputs [tokens, hidden] for x [tokens, hidden]
// routed by `routing`. rows: int64 [tokens], each token's row in the batch
// (for the adapters' segments); `delta` may be null, else it sees the
// routing (ProjectionDelta::ObserveRouting) and adds the experts' adapter
// terms.
torch::Tensor RunExperts(const ModelConfig& config, int layer,
                         const LayerWeights& weights, const torch::Tensor& x,
                         const ExpertRouting& routing,
                         const torch::Tensor& rows,
                         const ProjectionDelta* delta);

// Each pair's expert, int64 [pairs] on `device`, for pairs grouped by
// `counts` (counts[e] pairs of expert e, in expert order). Built on the CPU
// from the counts and copied: no device sync.
torch::Tensor PairExperts(const std::vector<int64_t>& counts,
                          const torch::Device& device);

// How GroupedLinear runs its per-expert GEMMs.
enum class ExpertGemm {
  // LibTorch's grouped GEMM (at::_grouped_mm) on CUDA where the device and
  // dtype have it (sm90+; bf16, fp16, fp32), else the loop.
  kAuto,
  // One GEMM per expert with tokens.
  kLoop,
  // at::_grouped_mm (fp32, bf16, fp16; on the CPU too, where it is no
  // faster): for tests of the path kAuto takes on a GPU.
  kGroupedMm,
};

// The experts' weight [experts, out, in] applied to the pairs grouped by
// `counts`: x [pairs, in] -> [pairs, out], each group by its own expert's
// matrix (and bias [experts, out] when defined).
torch::Tensor GroupedLinear(const torch::Tensor& x,
                            const std::vector<int64_t>& counts,
                            const LinearWeights& experts,
                            ExpertGemm gemm = ExpertGemm::kAuto);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_EXPERTS_H_
