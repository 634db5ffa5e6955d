// Router statistics of a co-batched pass (docs/DESIGN.md §8): how many of
// each owner's real tokens (padding excluded) each expert received, summed
// over the mixture-of-experts layers. A token counts once per expert it is
// routed to, so an owner's counts add up to top_k × its tokens × the
// sparse layers.
//
//   ExpertTokenCounter counter(config, lengths, seq, row_owner, owners);
//   delta.set_routing_observer(&counter);
//   model.ForwardHidden(input_ids, lengths, &delta);   // and its backward
//   counter.AddTo(per_owner_counts);
#ifndef LORAPLEX_CORE_TRAIN_EXPERT_TOKEN_COUNTER_H_
#define LORAPLEX_CORE_TRAIN_EXPERT_TOKEN_COUNTER_H_

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <vector>

#include "core/model/experts.h"
#include "core/model/model_config.h"

namespace loraplex {

class ExpertTokenCounter : public RoutingObserver {
 public:
  // One forward pass over right-padded rows [rows, seq] with `lengths`
  // (int64 [rows], on the model's device) real tokens each; row r belongs
  // to owner row_owner[r] < owners.
  ExpertTokenCounter(const ModelConfig& config, const torch::Tensor& lengths,
                     int64_t seq, const std::vector<int64_t>& row_owner,
                     int64_t owners);

  // Counts one layer's routing. A layer seen again (a checkpointed layer
  // recomputed in the backward pass routes its tokens the same way) replaces
  // its counts, so nothing is counted twice.
  void Observe(int layer, const ExpertRouting& routing) override;

  // Adds each owner's counts, summed over the layers seen, to totals[owner]
  // (sized to the experts when empty). One read from the device.
  void AddTo(std::vector<std::vector<int64_t>>& totals) const;

 private:
  int64_t experts_;
  int64_t owners_;
  torch::Tensor token_owner_;  // int64 [rows * seq]: owner, -1 for padding.
  std::map<int, torch::Tensor> layers_;  // int64 [owners * experts] each.
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_EXPERT_TOKEN_COUNTER_H_
