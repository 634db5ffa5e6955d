#include "server/sessions/session_lifecycle.h"

namespace loraplex {

bool IsAllowedSessionStateChange(SessionState from, SessionState to) {
  if (from == to) return true;
  using S = SessionState;
  switch (from) {
    case S::kOpening:
      return to == S::kOpen || to == S::kClosed;
    case S::kOpen:
      return to == S::kClosing || to == S::kOpening || to == S::kClosed;
    case S::kClosing:
      return to == S::kClosed || to == S::kOpen || to == S::kOpening;
    case S::kClosed:
      return false;
  }
  return false;
}

}  // namespace loraplex
