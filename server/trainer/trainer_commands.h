// The commands the trainer thread applies between two steps (trainer.h).
// Each command is one type in TrainerCommand, applied by one
// Trainer::Apply overload. When it must read files first, one
// Trainer::ReadFiles overload does that on the checkpoint writer's thread
// before the command reaches the trainer; what it must do with tensors
// before the plan, one Trainer::Prepare overload (rank 0). A command the
// other ranks of a data-parallel run apply too has a plan entry
// (step_plan.h) and says so in PlanEntry and CommandOf; any other command
// is rank 0's alone. Nothing else in the trainer knows the types.
#ifndef LORAPLEX_SERVER_TRAINER_TRAINER_COMMANDS_H_
#define LORAPLEX_SERVER_TRAINER_TRAINER_COMMANDS_H_

#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "adapters/slot_pool.h"
#include "server/jobs/job_trainer.h"
#include "server/trainer/checkpoint.h"
#include "server/trainer/step_plan.h"

namespace loraplex {

// Puts a job into a free slot (reported as kAttached).
struct AttachJob {
  // As the scheduler gave it (rank 0; other ranks know only `request`).
  AttachCommand attach;
  // What the slot pool attaches: from `attach`, or from rank 0's plan.
  SlotAttachRequest request;
  // Read by rank 0 before the plan (Trainer::ReadFiles, Prepare): an
  // error fails the attach; the newer checkpoints that did not verify; the
  // directory of the weights to start from (a checkpoint's or an initial
  // adapter's; empty: fresh ones); the checkpoint to resume (its
  // directory, counters and training state).
  absl::Status prepared;
  std::vector<std::string> rejected;
  std::string weights_dir;
  std::string restore_dir;
  std::optional<CheckpointInfo> restore;
  std::string training_state;
};

// Checkpoints the job's slot, unless it is done, and frees it (kRetired).
struct RetireJob {
  std::string job_id;
};

// Checkpoints the job's slot and frees it (kPaused).
struct PauseJob {
  std::string job_id;
};

// Writes the job's adapter as PEFT files into `dir`, then calls `done`.
// Rank 0's alone.
struct ExportJob {
  std::string job_id;
  std::string dir;
  std::function<void(absl::Status)> done;
};

// Samples from a running job's current weights, adapter files or the base
// (trainer_sampling.cc), decoding between training steps. Rank 0's alone.
struct SampleJob {
  SampleCommand command;
  // Prepare: the adapter files' weights, or why they cannot be used.
  std::shared_ptr<LoraWeights> weights;
  absl::Status prepared;
};

// Opens a training session in a free slot (trainer_sessions.cc). Rank 0's
// alone: sessions do not run data parallel.
struct OpenSessionJob {
  SessionOpenCommand command;
};

// Queues one operation of an open session. Rank 0's alone.
struct SessionWork {
  SessionOp op;
};

using TrainerCommand = std::variant<AttachJob, RetireJob, PauseJob, ExportJob,
                                    SampleJob, OpenSessionJob, SessionWork>;

// What the other ranks apply of `command`: none for rank 0's commands and
// for an attach that failed on rank 0 before the plan.
std::optional<StepPlan::Entry> PlanEntryOf(const TrainerCommand& command);
// The command a plan entry stands for, as the other ranks apply it.
TrainerCommand CommandOf(StepPlan::Entry entry);
// Answers a command that will not be applied (the trainer stops), when
// someone waits for its answer.
void Abandon(TrainerCommand& command, const absl::Status& status);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_TRAINER_COMMANDS_H_
