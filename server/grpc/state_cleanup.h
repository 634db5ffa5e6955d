// Bounded disk for the state dir: what an interrupted write left behind
// (a dataset or adapter no record names, temporary files, staged
// directories) is removed at start-up, and finished jobs keep only their
// newest checkpoints.
//
//   LORAPLEX_ASSIGN_OR_RETURN(StateCleanup removed,
//                             CleanUpState(state_dir, store, /*keep=*/1));
#ifndef LORAPLEX_SERVER_GRPC_STATE_CLEANUP_H_
#define LORAPLEX_SERVER_GRPC_STATE_CLEANUP_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "server/store/job_store.h"

namespace loraplex {

struct StateCleanup {
  int64_t orphans = 0;  // Files and directories of interrupted writes.
  int64_t finished_checkpoints = 0;  // Checkpoints of finished jobs.
};

// Run before anything else uses the state dir (nothing is being written):
// removes <state>/tmp/*, datasets/*.tmp.*, datasets/<id>.jsonl and
// adapters/<id>/ that no record names, adapters/*.staged, checkpoints/<id>/
// of jobs no record names, and all but the newest
// `keep_finished_checkpoints` checkpoints of every finished job.
absl::StatusOr<StateCleanup> CleanUpState(const std::string& state_dir,
                                          JobStore& store,
                                          int keep_finished_checkpoints);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_STATE_CLEANUP_H_
