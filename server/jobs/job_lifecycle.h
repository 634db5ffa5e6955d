// A job's lifecycle as the scheduler owns it, in two parts:
//  - its JobStatus (stored; what clients see, each change with its reason in
//    the job's events): the changes the transition table allows, which the
//    scheduler checks before it stores one;
//  - its JobPlace (in memory): where a live job is on its way into a slot
//    and out of it, one value instead of a flag per step.
//
//   if (!IsAllowedStatusChange(stored, job.status)) ...  // A bug: refused.
//   if (!IsAllowedPlaceChange(job.place, JobPlace::kInTrainer)) ...
//
// No LibTorch, no gRPC.
#ifndef LORAPLEX_SERVER_JOBS_JOB_LIFECYCLE_H_
#define LORAPLEX_SERVER_JOBS_JOB_LIFECYCLE_H_

#include "absl/strings/string_view.h"
#include "server/store/records.h"

namespace loraplex {

// Whether a job may go from `from` to `to` (the same status again is a
// metrics update, always allowed):
//   VALIDATING -> QUEUED, FAILED
//   QUEUED     -> RUNNING, PAUSED, CANCELLED, FAILED
//   RUNNING    -> QUEUED (a restart), PAUSED, SUCCEEDED, FAILED, CANCELLED
//   PAUSED     -> QUEUED (resumed), CANCELLED, FAILED
//   SUCCEEDED, FAILED, CANCELLED: final.
bool IsAllowedStatusChange(JobStatus from, JobStatus to);

// Where a live job is, beside its status.
enum class JobPlace {
  kWaiting,    // Queued or paused, without its data (read back from the
               // store, or paused: the data is prepared again on resume).
  kPreparing,  // Next in line: its data being read and tokenized.
  kPrepared,   // Its data ready; handed to the trainer at the next fill.
  kInTrainer,  // Attach sent: holds a slot reservation until it leaves.
  kPausing,    // In the trainer, a PauseJob waiting for its checkpoint.
};

// "waiting", "preparing", ...
absl::string_view JobPlaceName(JobPlace place);

// Whether a live job may move from `from` to `to`:
//   waiting   -> preparing, prepared
//   preparing -> prepared, waiting (paused or failed meanwhile)
//   prepared  -> in trainer
//   in trainer -> pausing, waiting (it left the trainer)
//   pausing   -> in trainer (not paused), waiting (paused, or it left)
bool IsAllowedPlaceChange(JobPlace from, JobPlace to);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_JOBS_JOB_LIFECYCLE_H_
