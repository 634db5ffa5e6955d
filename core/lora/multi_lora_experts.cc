// MultiLoraDelta's terms on a mixture-of-experts layer's stacked experts.
#include <torch/torch.h>

#include <map>
#include <vector>

#include "core/lora/multi_lora.h"

namespace loraplex {

void MultiLoraDelta::ObserveRouting(int layer,
                                    const ExpertRouting& routing) const {
  if (routing_observer_ != nullptr) routing_observer_->Observe(layer, routing);
}

void MultiLoraDelta::AddToExperts(int layer, Projection projection,
                                  const torch::Tensor& x,
                                  const std::vector<int64_t>& counts,
                                  const torch::Tensor& rows,
                                  torch::Tensor& output) const {
  // Segments by the rank of their module for `projection`.
  std::map<int64_t, std::vector<size_t>> buckets;
  torch::ScalarType dtype = torch::kFloat32;
  for (size_t s = 0; s < segments_.size(); ++s) {
    const LoraWeights* weights = segments_[s].weights;
    if (weights == nullptr || segments_[s].rows == 0) continue;
    const LoraModule* module = weights->Find(layer, projection);
    if (module == nullptr) continue;
    buckets[module->a.size(0) / module->experts].push_back(s);
    dtype = weights->dtype();
  }
  if (buckets.empty()) return;
  const int64_t experts = static_cast<int64_t>(counts.size());
  const auto index_options =
      torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  std::vector<int64_t> row_segment;
  for (size_t s = 0; s < segments_.size(); ++s) {
    row_segment.insert(row_segment.end(), segments_[s].rows,
                       static_cast<int64_t>(s));
  }
  const torch::Tensor pair_segment = torch::tensor(row_segment, torch::kInt64)
                                         .to(x.device())
                                         .index_select(0, rows);
  const torch::Tensor pair_expert = PairExperts(counts, x.device());
  const torch::Tensor inputs = x.to(dtype);
  for (const auto& [rank, members] : buckets) {
    // The bucket's groups: (member i, expert e) is group i * experts + e.
    std::vector<int64_t> local(segments_.size(), -1);
    std::vector<torch::Tensor> a, b, scales;
    for (size_t i = 0; i < members.size(); ++i) {
      local[members[i]] = static_cast<int64_t>(i);
      const LoraWeights& weights = *segments_[members[i]].weights;
      const LoraModule* module = weights.Find(layer, projection);
      a.push_back(module->ExpertA());
      b.push_back(module->ExpertB());
      scales.push_back(
          torch::full({experts}, weights.scale(),
                      torch::TensorOptions().dtype(dtype).device(x.device())));
    }
    const int64_t groups = static_cast<int64_t>(members.size()) * experts;
    torch::Tensor pair_local = torch::tensor(local, torch::kInt64)
                                   .to(x.device())
                                   .index_select(0, pair_segment);
    torch::Tensor selected = (pair_local >= 0).nonzero().squeeze(1);
    if (selected.numel() == 0) continue;
    torch::Tensor group = pair_local.index_select(0, selected) * experts +
                          pair_expert.index_select(0, selected);
    auto [sorted_group, order] = group.sort(/*stable=*/true, 0, false);
    torch::Tensor pairs = selected.index_select(0, order);
    torch::Tensor group_counts = torch::bincount(sorted_group, {}, groups);
    const int64_t longest = group_counts.max().item<int64_t>();
    torch::Tensor starts = group_counts.cumsum(0) - group_counts;
    torch::Tensor place =
        sorted_group * longest + (torch::arange(pairs.numel(), index_options) -
                                  starts.index_select(0, sorted_group));
    torch::Tensor padded =
        torch::zeros({groups * longest, inputs.size(1)}, inputs.options())
            .index_copy(0, place, inputs.index_select(0, pairs))
            .view({groups, longest, inputs.size(1)});
    torch::Tensor low = torch::bmm(padded, torch::cat(a).transpose(1, 2)) *
                        torch::cat(scales).view({groups, 1, 1});
    torch::Tensor terms = torch::bmm(low, torch::cat(b).transpose(1, 2));
    output = output.index_add(0, pairs,
                              terms.view({groups * longest, -1})
                                  .index_select(0, place)
                                  .to(output.scalar_type()));
  }
}

}  // namespace loraplex
