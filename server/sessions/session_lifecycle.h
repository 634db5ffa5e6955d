// A session's lifecycle as the SessionManager owns it: the SessionState
// changes the transition table allows. The manager checks every change
// against it before it makes or stores one; a change the table refuses is
// a bug (answered INTERNAL and logged, nothing stored).
//
//   if (!IsAllowedSessionStateChange(info.state, SessionState::kOpen)) ...
//
// No LibTorch, no gRPC.
#ifndef LORAPLEX_SERVER_SESSIONS_SESSION_LIFECYCLE_H_
#define LORAPLEX_SERVER_SESSIONS_SESSION_LIFECYCLE_H_

#include "server/store/records.h"

namespace loraplex {

// Every SessionState, in lifecycle order.
inline constexpr SessionState kAllSessionStates[] = {
    SessionState::kOpening, SessionState::kOpen, SessionState::kClosing,
    SessionState::kClosed};

// Whether a session may go from `from` to `to` (the same state again, with
// a new reason, is always allowed):
//   OPENING -> OPEN, CLOSED (not opened, or caught opening by a restart)
//   OPEN    -> CLOSING, OPENING (restored after a restart), CLOSED (not
//              restored after a restart)
//   CLOSING -> CLOSED, OPEN (the close or the idle save failed), OPENING
//              (restored after a restart)
//   CLOSED: final.
bool IsAllowedSessionStateChange(SessionState from, SessionState to);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_SESSIONS_SESSION_LIFECYCLE_H_
