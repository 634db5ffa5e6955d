// The session commands (trainer.h): opening a session and queuing its
// operations reach the trainer's SessionSlots (session_slots.h) at a step
// boundary.
#include <utility>
#include <vector>

#include "server/trainer/trainer.h"

namespace loraplex {

void Trainer::OpenSession(SessionOpenCommand command) {
  std::vector<TrainerCommand> entry;
  entry.push_back(OpenSessionJob{std::move(command)});
  Enqueue(std::move(entry));
}

void Trainer::RunSessionOp(SessionOp op) {
  std::vector<TrainerCommand> entry;
  entry.push_back(SessionWork{std::move(op)});
  Enqueue(std::move(entry));
}

void Trainer::Apply(OpenSessionJob& open) {
  if (ranks_.distributed()) {
    std::exchange(open.command.done, nullptr)(absl::FailedPreconditionError(
        "training sessions do not run data parallel yet"));
    return;
  }
  sessions_.Open(open.command);
}

void Trainer::Apply(SessionWork& work) { sessions_.Queue(std::move(work.op)); }

}  // namespace loraplex
