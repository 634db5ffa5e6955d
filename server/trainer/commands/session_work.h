// The command that queues one operation of an open session behind its
// others in the trainer's SessionSlots (trainer_commands.h,
// session_slots.h). Rank 0's alone: it queues the operation before the
// plan, and the plan carries the operations each iteration applies
// (StepPlan::sessions).
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_SESSION_WORK_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_SESSION_WORK_H_

#include <utility>

#include "absl/status/status.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {

struct SessionWork {
  SessionOp op;

  template <typename Parts>
  void Prepare(Parts& parts) {
    parts.sessions.Queue(std::exchange(op, SessionOp{}));
  }
  template <typename Parts>
  void Apply(Parts&) {}  // Queued by Prepare.
  void Abandon(const absl::Status& status) {
    if (op.done) std::exchange(op.done, nullptr)(status);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_SESSION_WORK_H_
