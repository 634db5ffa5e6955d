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

absl::string_view SessionStateName(SessionState state) {
  switch (state) {
    case SessionState::kOpening:
      return "OPENING";
    case SessionState::kOpen:
      return "OPEN";
    case SessionState::kClosing:
      return "CLOSING";
    case SessionState::kClosed:
      return "CLOSED";
  }
  return "UNKNOWN";
}

std::optional<SessionState> SessionStateFromName(absl::string_view name) {
  for (SessionState state : {SessionState::kOpening, SessionState::kOpen,
                             SessionState::kClosing, SessionState::kClosed}) {
    if (SessionStateName(state) == name) return state;
  }
  return std::nullopt;
}

}  // namespace loraplex
