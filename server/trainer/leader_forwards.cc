#include "server/trainer/leader_forwards.h"

#include "absl/status/status.h"

namespace loraplex {

LeaderForwards::LeaderForwards(const LlamaModel& model, RankCoordinator& ranks)
    : ranks_(ranks) {
  ShardedBase* base = model.sharded_base();
  if (base == nullptr || !ranks.distributed() || ranks.Broken()) return;
  if (ranks.leader()) {
    leading_.emplace(*base);
    return;
  }
  if (absl::Status served = base->ServeGathers(); !served.ok()) {
    ranks.Fail(served);
  }
}

LeaderForwards::~LeaderForwards() {
  if (!leading_.has_value()) return;
  if (absl::Status ended = leading_->End(); !ended.ok()) ranks_.Fail(ended);
}

}  // namespace loraplex
