#include "server/sessions/session_lifecycle.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace loraplex {
namespace {

using S = SessionState;

TEST(SessionLifecycleTest, StateChangesFollowTheTable) {
  const std::set<std::pair<S, S>> allowed = {
      {S::kOpening, S::kOpen}, {S::kOpening, S::kClosed},
      {S::kOpen, S::kClosing}, {S::kOpen, S::kOpening},
      {S::kOpen, S::kClosed},  {S::kClosing, S::kClosed},
      {S::kClosing, S::kOpen}, {S::kClosing, S::kOpening}};
  for (S from : kAllSessionStates) {
    for (S to : kAllSessionStates) {
      const bool expected = from == to || allowed.count({from, to}) > 0;
      EXPECT_EQ(IsAllowedSessionStateChange(from, to), expected)
          << SessionStateName(from) << " -> " << SessionStateName(to);
    }
  }
}

TEST(SessionLifecycleTest, AClosedSessionNeverOpensAgain) {
  EXPECT_FALSE(IsAllowedSessionStateChange(S::kClosed, S::kOpening));
  EXPECT_FALSE(IsAllowedSessionStateChange(S::kClosed, S::kOpen));
  EXPECT_FALSE(IsAllowedSessionStateChange(S::kClosed, S::kClosing));
  // A session is closed before it is closing only through a restart.
  EXPECT_FALSE(IsAllowedSessionStateChange(S::kOpening, S::kClosing));
}

}  // namespace
}  // namespace loraplex
