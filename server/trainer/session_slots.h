// The trainer's part for client-driven training sessions (docs/DESIGN.md
// §12): a session holds a slot (SlotState::kSession) with its adapter and
// optimizer; its operations wait here in order, and each iteration takes
// every session's next forward/backward call into the co-batched pass
// beside the jobs' step, after applying the steps, saves and closes queued
// before it. Sessions' files (checkpoints, saved states and adapters) go
// through a writer of their own, so a session's call never waits behind a
// job's checkpoint. Trainer thread only, rank 0 only.
//
//   SessionSlots sessions(pool, owners, options, slots_changed);
//   sessions.Open(command);              // answers command.done
//   sessions.Queue(std::move(op));
//   std::vector<SessionCall> calls = sessions.TakeCalls();
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
#include "server/trainer/slot_owners.h"

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
  // `pool` and `owners` are the trainer's (they must outlive this);
  // `slots_changed` runs after a slot was taken or freed here.
  SessionSlots(SlotPool& pool, SlotOwners& owners, SessionSlotsOptions options,
               std::function<void()> slots_changed);

  // Opens the session in a free slot (from its checkpoint when
  // command.restore_dir is set) and answers command.done with the slot.
  void Open(SessionOpenCommand& command);
  // Queues the operation behind the session's others (NOT_FOUND when it
  // holds no slot).
  void Queue(SessionOp op);
  // Some session has operations waiting.
  bool pending() const;
  // Applies each session's waiting operations in order up to its next
  // forward/backward call, and returns those calls for this iteration's
  // pass.
  std::vector<SessionCall> TakeCalls();
  // The calls as the co-batched pass takes them (pointing into `calls`).
  std::vector<ForwardBackwardCall> PassOf(std::vector<SessionCall>& calls);
  // Answers the calls from the pass's outputs, or with its error.
  void Answer(std::vector<SessionCall>& calls,
              absl::StatusOr<std::vector<ForwardBackwardOutput>> outputs);
  // Answers every operation still waiting with `status`.
  void Abandon(const absl::Status& status);
  // Every open session's checkpoint, gradients included (stopping).
  void CheckpointAll();
  // Returns once every file queued so far is written.
  void Flush() { writer_.Flush(); }
  // Writes what is queued and stops the writer (files queued later are
  // written on the caller's thread).
  void Stop() { writer_.Stop(); }

 private:
  void Apply(int slot, SessionOp op);
  // Writes the session's checkpoint (off this thread), with its gradients
  // when `gradients`, then runs `then` there (written or not).
  void Checkpoint(int slot, bool gradients, std::function<void()> then);

  SlotPool& pool_;
  SlotOwners& owners_;
  SessionSlotsOptions options_;
  std::function<void()> slots_changed_;
  // Writes sessions' checkpoints, saved states and adapters (its own
  // thread; options_.checkpoint_root is its root).
  PoolCheckpointer writer_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_SESSION_SLOTS_H_
