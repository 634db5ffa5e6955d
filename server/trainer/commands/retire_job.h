// The retire command (trainer_commands.h): checkpoints the job's slot,
// unless it is done, and frees it (kRetired). Every rank applies it.
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_RETIRE_JOB_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_RETIRE_JOB_H_

#include <optional>
#include <string>
#include <utility>

#include "server/trainer/step_plan.h"

namespace loraplex {

struct RetireJob {
  std::string job_id;

  static constexpr StepPlan::Entry::Kind kPlanKind =
      StepPlan::Entry::Kind::kRetire;
  std::optional<StepPlan::Entry> PlanEntry() const {
    StepPlan::Entry entry;
    entry.kind = kPlanKind;
    entry.job_id = job_id;
    return entry;
  }
  static RetireJob FromPlanEntry(StepPlan::Entry entry) {
    return RetireJob{std::move(entry.job_id)};
  }

  template <typename Parts>
  void Apply(Parts& parts) {
    parts.jobs.Retire(*this);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_RETIRE_JOB_H_
