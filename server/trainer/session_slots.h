// The trainer's part for client-driven training sessions (docs/DESIGN.md
// §12): a session holds a slot (SlotState::kSession) with its adapter and
// optimizer; its operations wait here in order. Before each iteration's
// plan rank 0 takes a round: every session's waiting operations up to and
// including its next forward/backward call. Every rank applies the round
// after the iteration's commands, and the calls join the co-batched pass
// beside the jobs' step. Sessions' files (checkpoints, saved states and
// adapters) go through a writer of their own, so a session's call never
// waits behind a job's checkpoint. Trainer thread only.
//
// Data parallel (docs/DESIGN.md §6, §12): every rank holds every session's
// slot (its optimizer state dealt to the owners as a job's is); rank 0 alone
// reads and writes files and answers; the other ranks apply what the plan
// carries (StepPlan::Entry::Kind::kOpenSession, StepPlan::sessions) and
// take part in the collectives: the weights rank 0 loaded are broadcast,
// optimizer steps sum the ranks' gradients, and saved states and
// checkpoints gather the optimizer state from its owners.
//
//   SessionSlots sessions(pool, owners, ranks, options, slots_changed);
//   sessions.Queue(std::move(op));                     // rank 0
//   std::vector<StepPlan::SessionStep> round = sessions.TakeRound();
//   ... the plan carries the round; every rank: ...
//   sessions.Open(open_command);                       // answers it
//   std::vector<SessionCall> calls = sessions.ApplyRound(round);
//   ... RunCoBatchPass(model, slots, sessions.PassOf(calls), ...) ...
//   sessions.Answer(calls, outputs);
#ifndef LORAPLEX_SERVER_TRAINER_SESSION_SLOTS_H_
#define LORAPLEX_SERVER_TRAINER_SESSION_SLOTS_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adapters/slot_pool.h"
#include "core/train/co_batch_step.h"
#include "server/checkpoints/pool_checkpointer.h"
#include "server/jobs/job_trainer.h"
#include "server/trainer/commands/open_session_job.h"
#include "server/trainer/rank_coordinator.h"
#include "server/trainer/slot_owners.h"
#include "server/trainer/step_plan.h"

namespace loraplex {

struct SessionSlotsOptions {
  // base_model_name_or_path written into saved adapters' configs.
  std::string base_model_name;
  // Checkpoints go to <checkpoint_root>/<session id>/
  // (session_checkpoints.h), after every checkpoint_interval-th optimizer
  // step and at CheckpointAll(); empty root or interval 0: only at
  // CheckpointAll() (empty root: never).
  std::string checkpoint_root;
  int64_t checkpoint_interval = 1;
  // Told of each checkpoint written or failed (on the writer's thread; a
  // failed one leaves the previous one in place).
  std::function<void(const std::string& session_id, int64_t seq_id,
                     const absl::Status& written)>
      on_checkpoint;
};

// A session's forward/backward call taken into an iteration's pass.
struct SessionCall {
  int slot = -1;
  SessionOp op;
  uint64_t dropout_seed = 0;
};

class SessionSlots {
 public:
  // `pool`, `owners` and `ranks` are the trainer's (they must outlive
  // this); `slots_changed` runs after a slot was taken or freed here.
  SessionSlots(SlotPool& pool, SlotOwners& owners, RankCoordinator& ranks,
               SessionSlotsOptions options,
               std::function<void()> slots_changed);

  // Data parallel: the trainer's gradient sync (set once, before any
  // session opens).
  void set_sync(const StepSync* sync) { sync_ = sync; }

  // Rank 0, before the plan: reads the checkpoint the session continues
  // from (open.prepared says whether it could).
  void Prepare(OpenSessionJob& open);
  // Opens the session in a free slot (from its checkpoint when it has one)
  // and answers open.command.done with the slot.
  void Open(OpenSessionJob& open);
  // Rank 0: queues the operation behind the session's others (NOT_FOUND
  // when it holds no slot).
  void Queue(SessionOp op);
  // Some session has operations waiting.
  bool pending() const;
  // Rank 0, before the plan: takes each session's waiting operations up to
  // and including its next forward/backward call (reading the states that
  // LoadState operations load; one that cannot be read is answered here).
  std::vector<StepPlan::SessionStep> TakeRound();
  // Every rank: applies the round's operations in order, and returns the
  // forward/backward calls for this iteration's pass.
  std::vector<SessionCall> ApplyRound(
      std::vector<StepPlan::SessionStep>& round);
  // Answers the round's operations that were not applied with `status`.
  static void AbandonRound(std::vector<StepPlan::SessionStep>& round,
                           const absl::Status& status);
  // The calls as the co-batched pass takes them (pointing into `calls`).
  std::vector<ForwardBackwardCall> PassOf(std::vector<SessionCall>& calls);
  // Answers the calls from the pass's outputs, or with its error.
  void Answer(std::vector<SessionCall>& calls,
              absl::StatusOr<std::vector<ForwardBackwardOutput>> outputs);
  // Answers every operation still waiting with `status`.
  void Abandon(const absl::Status& status);
  // Every open session's checkpoint, gradients included (stopping). Every
  // rank calls it.
  void CheckpointAll();
  // Returns once every file queued so far is written.
  void Flush() { writer_.Flush(); }
  // Writes what is queued and stops the writer (files queued later are
  // written on the caller's thread).
  void Stop() { writer_.Stop(); }

 private:
  void Apply(int slot, StepPlan::SessionStep& step);
  // Writes the session's checkpoint (off this thread) when rank 0 `wanted`
  // one and something happened since the last, with its gradients when
  // `gradients`, then runs `then` there (written or not; at once when not
  // wanted). Every rank calls it: rank 0 decides for all.
  void Checkpoint(int slot, bool gradients, std::function<void()> then,
                  bool wanted);

  SlotPool& pool_;
  SlotOwners& owners_;
  RankCoordinator& ranks_;
  const StepSync* sync_ = nullptr;
  SessionSlotsOptions options_;
  std::function<void()> slots_changed_;
  // Writes sessions' checkpoints, saved states and adapters (its own
  // thread; options_.checkpoint_root is its root). Rank 0's.
  PoolCheckpointer writer_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_SESSION_SLOTS_H_
