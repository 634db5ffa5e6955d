// How the trainer's ranks work together (docs/DESIGN.md §6), behind one
// interface for the three roles: the only process, rank 0 of a data-parallel
// run (the leader: it takes the commands, reads and writes files, reports
// and broadcasts each iteration's plan), and the other ranks (followers,
// which apply rank 0's plans). Alone, every agreement is this process's own
// answer and nothing is sent.
//
//   RankCoordinator ranks(options.dist);
//   if (ranks.leader()) ranks.SendPlan(plan);          // no-op alone
//   absl::StatusOr<int> failed = ranks.CountFailed(!attached.ok());
//   if (ranks.Broken()) return;                        // a collective failed
//
// A failure of the ranks (a collective that failed or timed out, a rank
// that diverged) is recorded once; from then on Broken() is true and the
// trainer stops without reporting more.
#ifndef LORAPLEX_SERVER_TRAINER_RANK_COORDINATOR_H_
#define LORAPLEX_SERVER_TRAINER_RANK_COORDINATOR_H_

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adapters/data_parallel_slots.h"
#include "core/dist/process_group.h"
#include "server/trainer/step_plan.h"

namespace loraplex {

class RankCoordinator {
 public:
  // `dist` (may be null: one process) must outlive the coordinator.
  explicit RankCoordinator(DistContext* dist);

  // Rank 0 or the only process.
  bool leader() const { return dist_ == nullptr || dist_->is_root(); }
  // More than one rank.
  bool distributed() const { return data_parallel_ != nullptr; }
  int rank() const { return dist_ == nullptr ? 0 : dist_->rank(); }
  int world_size() const { return dist_ == nullptr ? 1 : dist_->world_size(); }
  // The parameter claims and gradient sync of a data-parallel pool; null
  // for one process.
  DataParallelSlots* data_parallel() { return data_parallel_.get(); }

  // Whether the ranks can no longer work together (picks up a failure the
  // process group saw).
  bool Broken();
  const absl::Status& failure() const { return failure_; }
  // Records `status` as the ranks' failure unless one is recorded already.
  void Fail(absl::Status status);
  // Records `status` when distributed and it is not OK: a step of this rank
  // failed, and the others wait in a collective it skipped.
  void FailIfDistributed(const absl::Status& status);

  // How long an idle leader waits before sending a plan anyway (the others
  // wait for it in a collective that times out); unset alone.
  std::optional<std::chrono::milliseconds> HeartbeatInterval() const;
  // Leader: sends `plan` to the other ranks (nothing alone).
  void SendPlan(const StepPlan& plan);
  // Followers: the leader's next plan.
  absl::StatusOr<StepPlan> ReceivePlan();
  // How many ranks, this one included, pass `failed` true; alone 0 or 1.
  // An error means the ranks are broken.
  absl::StatusOr<int> CountFailed(bool failed);
  // Whether every rank's `status` is OK: OK, this rank's error, or an
  // INTERNAL error saying "<what> failed on N other rank(s)". With
  // `diverged_if_not`, an outcome that differs between the ranks leaves
  // them apart: every rank fails (Broken). Alone, `status`. A collective
  // that fails gives its error (the ranks are broken).
  absl::Status AgreeOnOutcome(const absl::Status& status,
                              const std::string& what, bool diverged_if_not);
  // The leader's `value` (alone: `value`). An error means the ranks are
  // broken.
  absl::StatusOr<bool> LeaderSays(bool value);
  // The leader's values of `params` become every rank's (nothing alone).
  absl::Status BroadcastFromLeader(std::vector<torch::Tensor>& params);

 private:
  DistContext* dist_;
  std::unique_ptr<DataParallelSlots> data_parallel_;  // World size > 1.
  absl::Status failure_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_RANK_COORDINATOR_H_
