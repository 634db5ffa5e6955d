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
//   LORAPLEX_ASSIGN_OR_RETURN(auto files, SessionStateFiles(slot, meta,
//                                                           /*gradients=*/true));
//   LORAPLEX_ASSIGN_OR_RETURN(SessionCounters counters,
//                             LoadSessionCheckpoint(dir, slot));
#ifndef LORAPLEX_SERVER_TRAINER_SESSION_STATE_FILES_H_
#define LORAPLEX_SERVER_TRAINER_SESSION_STATE_FILES_H_

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/train/training_slot.h"

namespace loraplex {

// The files of the slot's state with `meta` (a JSON object); with
// `gradients`, the accumulated gradients too (when any parameter has one).
absl::StatusOr<std::map<std::string, std::string>> SessionStateFiles(
    const TrainingSlot& slot, nlohmann::json meta, bool gradients);

// Loads a saved state into the slot: its weights, and with_optimizer its
// optimizer state and step count; gradients are cleared. Checked whole
// (LoRA config, optimizer family and shapes) before anything changes.
absl::Status LoadSessionState(const std::string& dir, bool with_optimizer,
                              TrainingSlot& slot);

// What a checkpoint says beside its tensors.
struct SessionCounters {
  int64_t calls = 0;
  int64_t seq_id = 0;
};

// Loads a checkpoint: LoadSessionState with the optimizer, then its
// gradients (when it has them; checked against the parameters' shapes).
absl::StatusOr<SessionCounters> LoadSessionCheckpoint(const std::string& dir,
                                                      TrainingSlot& slot);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_TRAINER_SESSION_STATE_FILES_H_
