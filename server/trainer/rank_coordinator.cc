#include "server/trainer/rank_coordinator.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"

namespace loraplex {

RankCoordinator::RankCoordinator(DistContext* dist)
    : dist_(dist),
      data_parallel_(dist != nullptr && dist->world_size() > 1
                         ? std::make_unique<DataParallelSlots>(dist)
                         : nullptr) {}

bool RankCoordinator::Broken() {
  if (failure_.ok() && distributed() && !dist_->failure().ok()) {
    failure_ = dist_->failure();
  }
  return !failure_.ok();
}

void RankCoordinator::Fail(absl::Status status) {
  if (failure_.ok() && !status.ok()) failure_ = std::move(status);
}

void RankCoordinator::FailIfDistributed(const absl::Status& status) {
  if (distributed()) Fail(status);
}

std::optional<std::chrono::milliseconds> RankCoordinator::HeartbeatInterval()
    const {
  if (!distributed()) return std::nullopt;
  return std::clamp(
      std::chrono::duration_cast<std::chrono::milliseconds>(dist_->timeout()) /
          4,
      std::chrono::milliseconds(100), std::chrono::milliseconds(10000));
}

void RankCoordinator::SendPlan(const StepPlan& plan) {
  if (!distributed()) return;
  std::string bytes = EncodeStepPlan(plan);
  Fail(dist_->Broadcast(&bytes, 0));
}

absl::StatusOr<StepPlan> RankCoordinator::ReceivePlan() {
  if (!distributed() || leader()) {
    return absl::FailedPreconditionError(
        "only ranks other than 0 of a data-parallel run follow a plan");
  }
  std::string bytes;
  LORAPLEX_RETURN_IF_ERROR(dist_->Broadcast(&bytes, 0));
  return DecodeStepPlan(bytes);
}

absl::StatusOr<int> RankCoordinator::CountFailed(bool failed) {
  if (!distributed()) return failed ? 1 : 0;
  return dist_->CountRanks(failed);
}

absl::Status RankCoordinator::AgreeOnOutcome(const absl::Status& status,
                                             const std::string& what,
                                             bool diverged_if_not) {
  if (!distributed()) return status;
  LORAPLEX_ASSIGN_OR_RETURN(int failed, CountFailed(!status.ok()));
  const bool apart = failed > 0 && failed < world_size();
  if (!status.ok()) {
    if (apart && diverged_if_not) Fail(status);
    return status;
  }
  if (failed == 0) return absl::OkStatus();
  absl::Status elsewhere = absl::InternalError(absl::StrCat(
      what, " failed on ", failed, " other rank(s); see their logs"));
  if (diverged_if_not) Fail(elsewhere);
  return elsewhere;
}

absl::StatusOr<bool> RankCoordinator::LeaderSays(bool value) {
  if (!distributed()) return value;
  int64_t said = value ? 1 : 0;
  LORAPLEX_RETURN_IF_ERROR(dist_->BroadcastValue(&said, 0));
  return said != 0;
}

absl::Status RankCoordinator::BroadcastFromLeader(
    std::vector<torch::Tensor>& params) {
  if (!distributed()) return absl::OkStatus();
  return dist_->BroadcastFromOwners(params, std::vector<int>(params.size(), 0));
}

}  // namespace loraplex
