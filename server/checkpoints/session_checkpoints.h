// Where training sessions' checkpoints live and which one a restart loads.
// A session's state (its adapter, optimizer state, step and dropout-call
// counters, the gradients accumulated since its last step, and the seq_id
// of the last operation in it) is written every
// --session-checkpoint-interval optimizer steps and at shutdown into
//
//   <root>/<session id>/seq-<seq_id, 12 digits>/
//
// staged beside it and published by one rename, so a crash leaves complete
// directories only (and `.staged` leftovers, which are ignored and
// removed). The newest one is loaded after a restart; older ones go once a
// newer one is written. No LibTorch here: the trainer encodes the files.
//
//   std::optional<SessionCheckpoint> latest = LatestSessionCheckpoint(
//       root, session_id);
#ifndef LORAPLEX_SERVER_CHECKPOINTS_SESSION_CHECKPOINTS_H_
#define LORAPLEX_SERVER_CHECKPOINTS_SESSION_CHECKPOINTS_H_

#include <cstdint>
#include <optional>
#include <string>

namespace loraplex {

struct SessionCheckpoint {
  int64_t seq_id = 0;  // The last operation it includes.
  std::string dir;
};

// <root>/<session_id>/seq-<seq_id>.
std::string SessionCheckpointDir(const std::string& root,
                                 const std::string& session_id, int64_t seq_id);

// The newest published checkpoint of the session, if any.
std::optional<SessionCheckpoint> LatestSessionCheckpoint(
    const std::string& root, const std::string& session_id);

// Removes the session's checkpoints older than `seq_id` and any staged
// leftovers.
void RemoveSessionCheckpointsBefore(const std::string& root,
                                    const std::string& session_id,
                                    int64_t seq_id);

// Removes every checkpoint of the session (it closed).
void RemoveSessionCheckpoints(const std::string& root,
                              const std::string& session_id);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_CHECKPOINTS_SESSION_CHECKPOINTS_H_
