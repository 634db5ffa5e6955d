// The command that opens a training session in a free slot
// (trainer_commands.h), handed to the trainer's SessionSlots
// (session_slots.h). Rank 0's alone: sessions do not run data parallel.
#ifndef LORAPLEX_SERVER_TRAINER_COMMANDS_OPEN_SESSION_JOB_H_
#define LORAPLEX_SERVER_TRAINER_COMMANDS_OPEN_SESSION_JOB_H_

#include <utility>

#include "absl/status/status.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {

struct OpenSessionJob {
  SessionOpenCommand command;

  template <typename Parts>
  void Apply(Parts& parts) {
    if (parts.ranks.distributed()) {
      std::exchange(command.done, nullptr)(absl::FailedPreconditionError(
          "training sessions do not run data parallel yet"));
      return;
    }
    parts.sessions.Open(command);
  }
  void Abandon(const absl::Status& status) {
    if (command.done) std::exchange(command.done, nullptr)(status);
  }
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_COMMANDS_OPEN_SESSION_JOB_H_
