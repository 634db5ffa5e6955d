#include "core/train/expert_token_counter.h"

#include <torch/torch.h>

namespace loraplex {

ExpertTokenCounter::ExpertTokenCounter(const ModelConfig& config,
                                       const torch::Tensor& lengths,
                                       int64_t seq,
                                       const std::vector<int64_t>& row_owner,
                                       int64_t owners)
    : experts_(config.moe.num_experts), owners_(owners) {
  const auto options =
      torch::TensorOptions().dtype(torch::kInt64).device(lengths.device());
  const torch::Tensor owner =
      torch::tensor(row_owner, torch::kInt64).to(lengths.device());
  const torch::Tensor real =
      torch::arange(seq, options).unsqueeze(0) < lengths.unsqueeze(1);
  token_owner_ = torch::where(real, owner.unsqueeze(1).expand({-1, seq}),
                              torch::full({}, -1, options))
                     .reshape({-1});
}

void ExpertTokenCounter::Observe(int layer, const ExpertRouting& routing) {
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens = routing.tokens;
  // Padding goes to one extra bin, dropped below.
  const torch::Tensor pair_expert =
      PairExperts(routing.counts, tokens.device());
  const torch::Tensor owner = token_owner_.index_select(0, tokens);
  const int64_t bins = owners_ * experts_;
  const torch::Tensor bin =
      torch::where(owner >= 0, owner * experts_ + pair_expert,
                   torch::full({}, bins, owner.options()));
  layers_[layer] = torch::zeros({bins + 1}, owner.options())
                       .index_add_(0, bin, torch::ones_like(bin))
                       .narrow(0, 0, bins);
}

void ExpertTokenCounter::AddTo(
    std::vector<std::vector<int64_t>>& totals) const {
  if (layers_.empty()) return;
  torch::Tensor sum;
  for (const auto& [layer, counts] : layers_) {
    sum = sum.defined() ? sum + counts : counts;
  }
  const torch::Tensor cpu = sum.to(torch::kCPU, torch::kInt64).contiguous();
  const int64_t* values = cpu.data_ptr<int64_t>();
  totals.resize(static_cast<size_t>(owners_));
  for (int64_t o = 0; o < owners_; ++o) {
    std::vector<int64_t>& total = totals[static_cast<size_t>(o)];
    total.resize(static_cast<size_t>(experts_), 0);
    for (int64_t e = 0; e < experts_; ++e) {
      total[static_cast<size_t>(e)] += values[o * experts_ + e];
    }
  }
}

}  // namespace loraplex
