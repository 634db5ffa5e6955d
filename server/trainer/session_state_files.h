// A training session's state as files, made and loaded on the trainer
// thread: what SaveState writes (and LoadState and CreateSession's
// from_state read), and the session checkpoints that carry an open session
// through a restart (server/checkpoints/session_checkpoints.h).
//
//   adapter_config.json, adapter_model.safetensors  the adapter (PEFT)
//   optimizer.pt                                    the optimizer's state
//   session_state.json     `meta` with "steps" added; a checkpoint's also
//                          has "calls" (forward/backward calls so far: the
//                          dropout seeds) and "seq_id" (its last operation)
//   gradients.pt           a checkpoint's gradients accumulated since the
//                          last optimizer step, when there are any
//
// Data parallel, rank 0 reads a state and sends the others its optimizer
// state and meta; the weights reach them by broadcast after the load.
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto files, SessionStateFiles(slot, meta,
//                                                           /*gradients=*/true));
//   LORAPLEX_ASSIGN_OR_RETURN(SavedSessionState state,
//       ReadSessionState(dir, model, /*with_optimizer=*/true,
//                        /*checkpoint=*/true));
//   LORAPLEX_ASSIGN_OR_RETURN(SessionCounters counters,
//                             LoadSessionCheckpoint(state, slot));
#ifndef LORAPLEX_SERVER_TRAINER_SESSION_STATE_FILES_H_
#define LORAPLEX_SERVER_TRAINER_SESSION_STATE_FILES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "adapters/data_parallel_slots.h"
#include "adapters/peft_adapter.h"
#include "core/train/dist_hooks.h"
#include "core/train/training_slot.h"

namespace loraplex {

// The files of the slot's state with `meta` (a JSON object); with
// `gradients`, the accumulated gradients too (when any parameter has one).
// Data parallel (`data_parallel` and `sync`), collective: the optimizer
// state is gathered from its owners and the gradients summed over the
// ranks, so the files are one process's; ABORTED when that part failed on
// this rank (the ranks no longer make the same calls).
absl::StatusOr<std::map<std::string, std::string>> SessionStateFiles(
    const TrainingSlot& slot, nlohmann::json meta, bool gradients,
    DataParallelSlots* data_parallel = nullptr, const StepSync* sync = nullptr);

// A saved state or checkpoint as rank 0 read it from its directory.
struct SavedSessionState {
  // The adapter, checked against the base model; null on the other ranks
  // of a data-parallel run (they get the weights by broadcast).
  std::shared_ptr<const PeftAdapter> adapter;
  std::string optimizer;  // optimizer.pt; empty when not read.
  std::string meta;       // session_state.json.
  std::string gradients;  // A checkpoint's gradients.pt; empty: none.
};

// Reads the state in `dir`: its adapter and meta, with_optimizer its
// optimizer state, and a `checkpoint`'s gradients when it has them.
absl::StatusOr<SavedSessionState> ReadSessionState(const std::string& dir,
                                                   const ModelConfig& model,
                                                   bool with_optimizer,
                                                   bool checkpoint);

// INVALID_ARGUMENT unless the state's adapter (rank 0's) has the LoRA
// config of the slot's weights.
absl::Status CheckStateFits(const SavedSessionState& state,
                            const TrainingSlot& slot);

// Loads a state into the slot: its weights (when state.adapter is set),
// and with_optimizer its optimizer state and step count; gradients are
// cleared. Checked whole (LoRA config, optimizer family and shapes) before
// anything changes. With `data_parallel`, the slot keeps the optimizer
// state of the parameters this rank owns (not collective).
absl::Status LoadSessionState(const SavedSessionState& state,
                              bool with_optimizer, TrainingSlot& slot,
                              DataParallelSlots* data_parallel = nullptr);

// What a checkpoint says beside its tensors.
struct SessionCounters {
  int64_t calls = 0;
  int64_t seq_id = 0;
};

// Loads a checkpoint: LoadSessionState with the optimizer, then its
// gradients (when it has them; checked against the parameters' shapes).
absl::StatusOr<SessionCounters> LoadSessionCheckpoint(
    const SavedSessionState& state, TrainingSlot& slot,
    DataParallelSlots* data_parallel = nullptr);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_SESSION_STATE_FILES_H_
