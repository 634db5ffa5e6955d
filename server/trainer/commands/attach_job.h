// The attach command (trainer_commands.h): puts a job into a free slot
// (reported as kAttached). Its checkpoint files are read on the checkpoint
// writer's thread, its initial weights on rank 0 before the plan; every
// rank of a data-parallel run applies it (StepPlan::Entry::Kind::kAttach).
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_ATTACH_JOB_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_ATTACH_JOB_H_

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "adapters/slot_pool.h"
#include "server/jobs/job_trainer.h"
#include "server/trainer/checkpoint.h"
#include "server/trainer/step_plan.h"

namespace loraplex {

struct AttachJob {
  // As the scheduler gave it (rank 0; other ranks know only `request`).
  AttachCommand attach;
  // What the slot pool attaches: from `attach`, or from rank 0's plan.
  SlotAttachRequest request;
  // Read by rank 0 before the plan (ReadFiles, Prepare): an error fails the
  // attach; the newer checkpoints that did not verify; the directory of the
  // weights to start from (a checkpoint's or an initial adapter's; empty:
  // fresh ones); the checkpoint to resume (its directory, counters and
  // training state).
  absl::Status prepared;
  std::vector<std::string> rejected;
  std::string weights_dir;
  std::string restore_dir;
  std::optional<CheckpointInfo> restore;
  std::string training_state;

  static constexpr StepPlan::Entry::Kind kPlanKind =
      StepPlan::Entry::Kind::kAttach;
  // None when it failed on rank 0 before the plan.
  std::optional<StepPlan::Entry> PlanEntry() const {
    if (!prepared.ok()) return std::nullopt;
    StepPlan::Entry entry;
    entry.kind = kPlanKind;
    entry.job_id = request.job_id;
    entry.request = request;
    entry.request.initial_weights.reset();  // Broadcast after the attach.
    entry.restore = restore;
    entry.training_state = training_state;
    return entry;
  }
  static AttachJob FromPlanEntry(StepPlan::Entry entry) {
    AttachJob attach;
    attach.attach.job_id = entry.job_id;
    attach.request = std::move(entry.request);
    attach.request.job_id = entry.job_id;
    attach.restore = std::move(entry.restore);
    attach.training_state = std::move(entry.training_state);
    return attach;
  }

  template <typename Parts>
  void ReadFiles(Parts& parts) {
    parts.jobs.ReadFiles(*this);
  }
  template <typename Parts>
  void Prepare(Parts& parts) {
    parts.jobs.Prepare(*this);
  }
  template <typename Parts>
  void Apply(Parts& parts) {
    parts.jobs.Attach(*this);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_ATTACH_JOB_H_
