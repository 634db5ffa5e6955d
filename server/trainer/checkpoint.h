// Checkpoints from and into training slots (the files themselves:
// checkpoint_files.h). On the trainer thread: a slot's optimizer state is
// saved (gathered from its owners when data parallel) and its files encoded
// in memory; they are written by the pool checkpointer's writer thread.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::string state, SaveTrainingState(slot));
//   LORAPLEX_ASSIGN_OR_RETURN(CheckpointContents contents,
//       EncodeCheckpoint(slot, info, std::move(state), "base"));
//   LORAPLEX_RETURN_IF_ERROR(WriteCheckpointFiles(dir, contents, 3));
//   ... attach the job with the weights in the checkpoint's dir, then ...
//   LORAPLEX_RETURN_IF_ERROR(RestoreCheckpoint(dir, info, state, slot));
#ifndef LORAPLEX_SERVER_TRAINER_CHECKPOINT_H_
#define LORAPLEX_SERVER_TRAINER_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/train/training_slot.h"
#include "server/checkpoints/checkpoint_files.h"

namespace loraplex {

class DataParallelSlots;

// The files of `slot` (attached and trainable) as the checkpoint `info`
// describes, with `training_state` from SaveTrainingState.
absl::StatusOr<CheckpointContents> EncodeCheckpoint(
    const TrainingSlot& slot, CheckpointInfo info, std::string training_state,
    const std::string& base_model_name);

// EncodeCheckpoint, then WriteCheckpointFiles.
absl::Status WriteCheckpoint(const std::string& job_dir,
                             const TrainingSlot& slot,
                             const CheckpointInfo& info,
                             const std::string& training_state,
                             const std::string& base_model_name, int keep_last,
                             int64_t keep_step = -1);

// training_state.pt's bytes: the slot's optimizer state (every parameter's,
// in the one-process format) and its LR schedule. With `data_parallel` the
// owners' states are gathered: collective, every rank calls it for the
// same slot.
absl::StatusOr<std::string> SaveTrainingState(
    const TrainingSlot& slot, DataParallelSlots* data_parallel = nullptr);

// Loads the optimizer state, schedule, data cursor and counters of the
// checkpoint in `dir` (described by `info`; `training_state` is its
// training_state.pt) into `slot`. The slot must be attached for training
// with the checkpoint's weights and the job's configuration, so its
// optimizer state exists (eagerly, as after attach) and is overwritten in
// place. With `data_parallel`, the slot keeps the state of the parameters
// this rank owns (not collective). Errors say "checkpoint <dir> does not fit
// the job: ..."; INVALID_ARGUMENT when the checkpoint does not fit the slot.
// On error the slot is unusable and should be retired.
absl::Status RestoreCheckpoint(const std::string& dir,
                               const CheckpointInfo& info,
                               const std::string& training_state,
                               TrainingSlot& slot,
                               DataParallelSlots* data_parallel = nullptr);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_CHECKPOINT_H_
