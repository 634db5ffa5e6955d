// The command that opens a training session in a free slot
// (trainer_commands.h), handed to the trainer's SessionSlots
// (session_slots.h). Rank 0 reads the checkpoint it continues from before
// the plan; every rank of a data-parallel run opens it
// (StepPlan::Entry::Kind::kOpenSession).
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_OPEN_SESSION_JOB_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_OPEN_SESSION_JOB_H_

#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "server/jobs/job_trainer.h"
#include "server/trainer/session_state_files.h"
#include "server/trainer/step_plan.h"

namespace loraplex {

struct OpenSessionJob {
  // As the session service gave it (the other ranks: what the plan says).
  SessionOpenCommand command;
  // Rank 0, before the plan: reading command.restore_dir (an error fails
  // the open there alone), and the checkpoint it read.
  absl::Status prepared;
  std::optional<SavedSessionState> restore;

  static constexpr StepPlan::Entry::Kind kPlanKind =
      StepPlan::Entry::Kind::kOpenSession;
  std::optional<StepPlan::Entry> PlanEntry() const {
    if (!prepared.ok()) return std::nullopt;
    StepPlan::Entry entry;
    entry.kind = kPlanKind;
    entry.job_id = command.session_id;
    entry.request.lora = command.lora;
    entry.request.optimizer = command.optimizer;
    entry.request.training.seed = command.seed;
    entry.request.preferred_slot = command.preferred_slot;
    entry.session_state = restore;
    return entry;
  }
  static OpenSessionJob FromPlanEntry(StepPlan::Entry entry) {
    OpenSessionJob open;
    open.command.session_id = std::move(entry.job_id);
    open.command.lora = std::move(entry.request.lora);
    open.command.optimizer = std::move(entry.request.optimizer);
    open.command.seed = entry.request.training.seed;
    open.command.preferred_slot = entry.request.preferred_slot;
    open.restore = std::move(entry.session_state);
    return open;
  }

  template <typename Parts>
  void Prepare(Parts& parts) {
    parts.sessions.Prepare(*this);
  }
  template <typename Parts>
  void Apply(Parts& parts) {
    parts.sessions.Open(*this);
  }
  void Abandon(const absl::Status& status) {
    if (command.done) std::exchange(command.done, nullptr)(status);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_OPEN_SESSION_JOB_H_
