#include "server/jobs/job_lifecycle.h"

namespace loraplex {

bool IsAllowedStatusChange(JobStatus from, JobStatus to) {
  if (from == to) return true;
  using S = JobStatus;
  switch (from) {
    case S::kValidating:
      return to == S::kQueued || to == S::kFailed;
    case S::kQueued:
      return to == S::kRunning || to == S::kPaused || to == S::kCancelled ||
             to == S::kFailed;
    case S::kRunning:
      return to == S::kQueued || to == S::kPaused || to == S::kSucceeded ||
             to == S::kFailed || to == S::kCancelled;
    case S::kPaused:
      return to == S::kQueued || to == S::kCancelled || to == S::kFailed;
    case S::kSucceeded:
    case S::kFailed:
    case S::kCancelled:
      return false;
  }
  return false;
}

absl::string_view JobPlaceName(JobPlace place) {
  switch (place) {
    case JobPlace::kWaiting:
      return "waiting";
    case JobPlace::kPreparing:
      return "preparing";
    case JobPlace::kPrepared:
      return "prepared";
    case JobPlace::kInTrainer:
      return "in trainer";
    case JobPlace::kPausing:
      return "pausing";
  }
  return "unknown";
}

bool IsAllowedPlaceChange(JobPlace from, JobPlace to) {
  using P = JobPlace;
  switch (from) {
    case P::kWaiting:
      return to == P::kPreparing || to == P::kPrepared;
    case P::kPreparing:
      return to == P::kPrepared || to == P::kWaiting;
    case P::kPrepared:
      return to == P::kInTrainer;
    case P::kInTrainer:
      return to == P::kPausing || to == P::kWaiting;
    case P::kPausing:
      return to == P::kInTrainer || to == P::kWaiting;
  }
  return false;
}

}  // namespace loraplex
