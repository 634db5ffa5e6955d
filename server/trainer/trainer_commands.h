// The commands the trainer thread applies between two steps (trainer.h),
// and the dispatch that hands each to its own code.
//
// A command is one header in commands/: its struct with what it carries and
// its hooks, each a member the dispatch calls when the command has it:
//   template <typename Parts> void Apply(Parts& parts);  // required
//     Between two steps, on every rank that applies it: hands the command
//     to the part it concerns (parts.jobs, .sessions, .sampling, .pool,
//     .ranks; TrainerParts, trainer_parts.h).
//   template <typename Parts> void ReadFiles(Parts& parts);
//     Files to read first, on the checkpoint writer's thread, before the
//     command reaches the trainer's inbox (commands sent after it follow
//     it there, so they keep their order). Only an attach has one.
//   template <typename Parts> void Prepare(Parts& parts);
//     Work on rank 0 before the plan: tensors, files the plan carries, a
//     session operation to queue.
//   std::optional<StepPlan::Entry> PlanEntry() const;
//   static constexpr StepPlan::Entry::Kind kPlanKind;
//   static Command FromPlanEntry(StepPlan::Entry entry);
//     A command the other ranks of a data-parallel run apply too: its entry
//     in rank 0's plan (step_plan.h, whose Entry::Kind names it) and the
//     command the other ranks make of it. Without them it is rank 0's alone.
//   void Abandon(const absl::Status& status);
//     Answers whoever waits for it when it will not be applied (the
//     trainer stops); without it nobody waits.
// The hooks that take the parts are member templates so that a command's
// header needs no part's header (the parts' headers name the commands).
//
// Adding a command: its header in commands/ and its name in TrainerCommand
// below (with the #include); then send it with Trainer::Post.
#ifndef LORAPLEX_SERVER_TRAINER_TRAINER_COMMANDS_H_
#define LORAPLEX_SERVER_TRAINER_TRAINER_COMMANDS_H_

#include <optional>
#include <variant>

#include "absl/status/status.h"
#include "server/trainer/commands/attach_job.h"
#include "server/trainer/commands/export_job.h"
#include "server/trainer/commands/open_session_job.h"
#include "server/trainer/commands/pause_job.h"
#include "server/trainer/commands/retire_job.h"
#include "server/trainer/commands/sample_job.h"
#include "server/trainer/commands/session_work.h"
#include "server/trainer/step_plan.h"

namespace loraplex {

// Every command the trainer takes: the one list the dispatch reads.
using TrainerCommand = std::variant<AttachJob, RetireJob, PauseJob, ExportJob,
                                    SampleJob, OpenSessionJob, SessionWork>;

struct TrainerParts;  // trainer_parts.h

// The command's hooks, or nothing where it has none.
bool CommandReadsFiles(const TrainerCommand& command);
void ReadCommandFiles(TrainerCommand& command, TrainerParts& parts);
void PrepareCommand(TrainerCommand& command, TrainerParts& parts);
void ApplyCommand(TrainerCommand& command, TrainerParts& parts);
// What the other ranks apply of `command`: none for rank 0's commands and
// for an attach that failed on rank 0 before the plan.
std::optional<StepPlan::Entry> PlanEntryOf(const TrainerCommand& command);
// The command a plan entry stands for, as the other ranks apply it.
std::optional<TrainerCommand> CommandOf(StepPlan::Entry entry);
// Answers a command that will not be applied (the trainer stops), when
// someone waits for its answer.
void Abandon(TrainerCommand& command, const absl::Status& status);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_TRAINER_COMMANDS_H_
