// The pause command (trainer_commands.h): checkpoints the job's slot and
// frees it (kPaused). Every rank applies it.
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_PAUSE_JOB_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_PAUSE_JOB_H_

#include <optional>
#include <string>
#include <utility>

#include "server/trainer/step_plan.h"

namespace loraplex {

struct PauseJob {
  std::string job_id;

  static constexpr StepPlan::Entry::Kind kPlanKind =
      StepPlan::Entry::Kind::kPause;
  std::optional<StepPlan::Entry> PlanEntry() const {
    StepPlan::Entry entry;
    entry.kind = kPlanKind;
    entry.job_id = job_id;
    return entry;
  }
  static PauseJob FromPlanEntry(StepPlan::Entry entry) {
    return PauseJob{std::move(entry.job_id)};
  }

  template <typename Parts>
  void Apply(Parts& parts) {
    parts.jobs.Pause(*this);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_PAUSE_JOB_H_
