#include "core/model/experts.h"

#include <torch/torch.h>

#include <atomic>
#include <tuple>

#include "core/model/llama_model.h"
#include "core/runtime/float_dtype.h"

namespace loraplex {
namespace {

// An expert's gated activation of its gate_up output [pairs, 2 * width].
torch::Tensor ExpertActivationOf(const MoeConfig& moe,
                                 const torch::Tensor& gate_up) {
  if (moe.activation == ExpertActivation::kSiluHalves) {
    std::vector<torch::Tensor> halves = gate_up.chunk(2, -1);
    return torch::silu(halves[0]) * halves[1];
  }
  using torch::indexing::None;
  using torch::indexing::Slice;
  torch::Tensor gate =
      gate_up.index({"...", Slice(None, None, 2)}).clamp_max(moe.swiglu_limit);
  torch::Tensor up = gate_up.index({"...", Slice(1, None, 2)})
                         .clamp(-moe.swiglu_limit, moe.swiglu_limit);
  return (up + 1) * (gate * torch::sigmoid(gate * moe.swiglu_alpha));
}

}  // namespace

ExpertRouting RouteTokens(const ModelConfig& config,
                          const LinearWeights& router, const torch::Tensor& x) {
  const MoeConfig& moe = config.moe;
  torch::Tensor logits =
      torch::nn::functional::linear(x, router.weight, router.bias);
  torch::Tensor values, experts;
  if (moe.router == RouterStyle::kSoftmaxThenTopK) {
    torch::Tensor probs =
        torch::softmax(logits, -1, Fp32OrFp64(logits.scalar_type()));
    std::tie(values, experts) = torch::topk(probs, moe.top_k, -1);
    if (moe.norm_topk_prob) values = values / values.sum(-1, true);
    values = values.to(x.scalar_type());
  } else {
    torch::Tensor top;
    std::tie(top, experts) = torch::topk(logits, moe.top_k, -1);
    values = torch::softmax(top, -1, top.scalar_type());
  }
  torch::Tensor flat = experts.reshape({-1});
  torch::Tensor order = std::get<1>(flat.sort(/*stable=*/true, 0, false));
  ExpertRouting routing;
  routing.tokens = order.div(moe.top_k, "floor");
  routing.weights = values.reshape({-1}).index_select(0, order);
  torch::Tensor counts = torch::bincount(flat, {}, moe.num_experts).cpu();
  routing.counts.assign(counts.data_ptr<int64_t>(),
                        counts.data_ptr<int64_t>() + counts.numel());
  return routing;
}

namespace {

torch::Tensor LoopLinear(const torch::Tensor& x,
                         const std::vector<int64_t>& counts,
                         const LinearWeights& experts) {
  std::vector<torch::Tensor> groups = x.split_with_sizes(counts);
  std::vector<torch::Tensor> outputs;
  outputs.reserve(groups.size());
  for (size_t e = 0; e < groups.size(); ++e) {
    if (counts[e] == 0) continue;
    const int64_t i = static_cast<int64_t>(e);
    outputs.push_back(torch::nn::functional::linear(
        groups[e], experts.weight[i],
        experts.bias.defined() ? experts.bias[i] : torch::Tensor()));
  }
  if (outputs.empty()) {  // No pairs at all.
    return x.new_zeros({0, experts.weight.size(1)});
  }
  return torch::cat(outputs);
}

torch::Tensor GroupedMmLinear(const torch::Tensor& x,
                              const std::vector<int64_t>& counts,
                              const LinearWeights& experts) {
  std::vector<int64_t> ends(counts.size());
  int64_t end = 0;
  for (size_t e = 0; e < counts.size(); ++e) ends[e] = end += counts[e];
  const torch::Tensor offsets =
      torch::tensor(ends, torch::kInt64).to(torch::kInt32).to(x.device());
  torch::Tensor y = at::_grouped_mm(x, experts.weight.transpose(1, 2), offsets);
  if (!experts.bias.defined()) return y;
  return y + experts.bias.index_select(0, PairExperts(counts, x.device()));
}

// Whether kAuto tries the grouped GEMM: on CUDA, until it has refused once
// (a device or dtype without it), for the dtypes it has.
std::atomic<bool> grouped_mm_refused{false};

}  // namespace

torch::Tensor PairExperts(const std::vector<int64_t>& counts,
                          const torch::Device& device) {
  return torch::repeat_interleave(
             torch::arange(static_cast<int64_t>(counts.size()), torch::kInt64),
             torch::tensor(counts, torch::kInt64))
      .to(device);
}

torch::Tensor GroupedLinear(const torch::Tensor& x,
                            const std::vector<int64_t>& counts,
                            const LinearWeights& experts, ExpertGemm gemm) {
  switch (gemm) {
    case ExpertGemm::kLoop:
      return LoopLinear(x, counts, experts);
    case ExpertGemm::kGroupedMm:
      return GroupedMmLinear(x, counts, experts);
    case ExpertGemm::kAuto:
      break;
  }
  const torch::ScalarType dtype = x.scalar_type();
  if (!x.is_cuda() || grouped_mm_refused.load() ||
      (dtype != torch::kBFloat16 && dtype != torch::kFloat16 &&
       dtype != torch::kFloat32)) {
    return LoopLinear(x, counts, experts);
  }
  try {
    return GroupedMmLinear(x, counts, experts);
  } catch (const c10::OutOfMemoryError&) {
    throw;  // Memory, not the device: the caller handles it as any OOM.
  } catch (const c10::Error&) {
    grouped_mm_refused.store(true);  // This GPU has no grouped GEMM.
    return LoopLinear(x, counts, experts);
  }
}

torch::Tensor RunExperts(const ModelConfig& config, int layer,
                         const LayerWeights& weights, const torch::Tensor& x,
                         const ExpertRouting& routing,
                         const torch::Tensor& rows,
                         const ProjectionDelta* delta) {
  const std::vector<int64_t>& counts = routing.counts;
  if (delta != nullptr) delta->ObserveRouting(layer, routing);
  torch::Tensor inputs = x.index_select(0, routing.tokens);
  torch::Tensor pair_rows = rows.index_select(0, routing.tokens);
  torch::Tensor gate_up =
      GroupedLinear(inputs, counts, weights.at(Projection::kExpertGateUp));
  if (delta != nullptr) {
    delta->AddToExperts(layer, Projection::kExpertGateUp, inputs, counts,
                        pair_rows, gate_up);
  }
  torch::Tensor hidden = ExpertActivationOf(config.moe, gate_up);
  torch::Tensor down =
      GroupedLinear(hidden, counts, weights.at(Projection::kExpertDown));
  if (delta != nullptr) {
    delta->AddToExperts(layer, Projection::kExpertDown, hidden, counts,
                        pair_rows, down);
  }
  down = down * routing.weights.unsqueeze(1);
  return torch::zeros_like(x).index_add(0, routing.tokens,
                                        down.to(x.scalar_type()));
}

}  // namespace loraplex
