// What rank 0 tells every rank before each trainer iteration of a
// data-parallel server (docs/DESIGN.md §6), so that all ranks make the same
// slot changes at the same step boundary: the slot commands with everything a
// rank needs to apply them (configs, the tokenized training data, the
// checkpoint state to resume), whether to checkpoint the pool first,
// which jobs rank 0 still has in slots, and the training sessions'
// operations.
//
//   rank 0:     std::string bytes = EncodeStepPlan(plan);
//               dist.Broadcast(&bytes, 0);
//   the others: dist.Broadcast(&bytes, 0);
//               LORAPLEX_ASSIGN_OR_RETURN(StepPlan plan,
//               DecodeStepPlan(bytes));
//
// What only rank 0 does is left out: exports, validation, reports, the
// checkpoint files. An attach's initial weights are not in the plan either:
// after every attach rank 0 broadcasts the slot's weights.
//
// The encoding is CBOR (RFC 8949) with the tensors' bytes as byte strings in
// this host's byte order: every rank must run on the same architecture.
#ifndef LORAPLEX_SERVER_TRAINER_STEP_PLAN_H_
#define LORAPLEX_SERVER_TRAINER_STEP_PLAN_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "adapters/slot_pool.h"
#include "server/jobs/job_trainer.h"
#include "server/trainer/checkpoint.h"
#include "server/trainer/session_state_files.h"

namespace loraplex {

struct StepPlan {
  struct Entry {
    enum class Kind { kAttach, kRetire, kPause, kOpenSession };
    Kind kind = Kind::kAttach;
    std::string job_id;
    // kAttach: the slot request; `request.data` null for an evaluation-only
    // attach; `request.initial_weights` is not sent (request.lora must be
    // the weights' config).
    SlotAttachRequest request;
    // kAttach resuming a checkpoint: its counters and cursor, and its
    // training_state.pt.
    std::optional<CheckpointInfo> restore;
    std::string training_state;
    // kPause: whether rank 0 committed the pause checkpoint is agreed on
    // when the pause is applied, not sent here.
    // kOpenSession (job_id: the session's id; request: its LoRA, optimizer,
    // seed and slot): the checkpoint it continues from, when it has one
    // (its optimizer state and meta; rank 0 broadcasts the weights and
    // keeps the gradients).
    std::optional<SavedSessionState> session_state;
  };

  // The server stops: checkpoint the pool and end.
  bool stop = false;
  // Checkpoint every training slot before applying the entries.
  bool checkpoint = false;
  // Every slot rank 0 holds a job in, as it stands before the entries. A
  // rank frees the other slots it holds first (rank 0 ended those jobs
  // alone, e.g. when their validation failed), and checks that its own
  // slots are where rank 0's are.
  struct Active {
    std::string job_id;
    int64_t step = 0;
    std::optional<DataCursorState> cursor;  // Slots that train.
  };
  std::map<int, Active> active;
  std::vector<Entry> entries;
  // The training sessions' operations of this iteration, in the order every
  // rank applies them after the entries (session_slots.h): each session's
  // waiting operations up to and including its next forward/backward call.
  struct SessionStep {
    int slot = -1;
    // `done`, `dir` and `state_meta` are rank 0's: not encoded.
    SessionOp op;
    // kLoadState: the state rank 0 read (as in Entry::session_state);
    // none when rank 0 could not read it or it does not fit the session
    // (then `prepared`, rank 0's and not encoded, says why and no rank
    // loads it).
    std::optional<SavedSessionState> state;
    absl::Status prepared;
  };
  std::vector<SessionStep> sessions;
};

std::string EncodeStepPlan(const StepPlan& plan);
// INVALID_ARGUMENT when `bytes` is not a plan.
absl::StatusOr<StepPlan> DecodeStepPlan(const std::string& bytes);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_STEP_PLAN_H_
