#include "server/store/records.h"

namespace loraplex {

absl::string_view JobStatusName(JobStatus status) {
  switch (status) {
    case JobStatus::kValidating:
      return "VALIDATING";
    case JobStatus::kQueued:
      return "QUEUED";
    case JobStatus::kRunning:
      return "RUNNING";
    case JobStatus::kSucceeded:
      return "SUCCEEDED";
    case JobStatus::kFailed:
      return "FAILED";
    case JobStatus::kCancelled:
      return "CANCELLED";
    case JobStatus::kPaused:
      return "PAUSED";
  }
  return "UNKNOWN";
}

bool IsTerminal(JobStatus status) {
  return status == JobStatus::kSucceeded || status == JobStatus::kFailed ||
         status == JobStatus::kCancelled;
}

}  // namespace loraplex
