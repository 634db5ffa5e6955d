#include "server/jobs/job_lifecycle.h"

#include <gtest/gtest.h>

#include <set>
#include <utility>

namespace loraplex {
namespace {

using S = JobStatus;
using P = JobPlace;

TEST(JobLifecycleTest, StatusChangesFollowTheTable) {
  const std::set<std::pair<S, S>> allowed = {
      {S::kValidating, S::kQueued}, {S::kValidating, S::kFailed},
      {S::kQueued, S::kRunning},    {S::kQueued, S::kPaused},
      {S::kQueued, S::kCancelled},  {S::kQueued, S::kFailed},
      {S::kRunning, S::kQueued},    {S::kRunning, S::kPaused},
      {S::kRunning, S::kSucceeded}, {S::kRunning, S::kFailed},
      {S::kRunning, S::kCancelled}, {S::kPaused, S::kQueued},
      {S::kPaused, S::kCancelled},  {S::kPaused, S::kFailed}};
  for (S from : kAllJobStatuses) {
    for (S to : kAllJobStatuses) {
      const bool expected = from == to || allowed.count({from, to}) > 0;
      EXPECT_EQ(IsAllowedStatusChange(from, to), expected)
          << JobStatusName(from) << " -> " << JobStatusName(to);
    }
  }
}

TEST(JobLifecycleTest, FinishedJobsNeverChangeAgain) {
  for (S done : {S::kSucceeded, S::kFailed, S::kCancelled}) {
    for (S to : kAllJobStatuses) {
      if (to == done) continue;
      EXPECT_FALSE(IsAllowedStatusChange(done, to))
          << JobStatusName(done) << " -> " << JobStatusName(to);
    }
  }
}

TEST(JobLifecycleTest, PlacesFollowTheTable) {
  const P all[] = {P::kWaiting, P::kPreparing, P::kPrepared, P::kInTrainer,
                   P::kPausing};
  const std::set<std::pair<P, P>> allowed = {
      {P::kWaiting, P::kPreparing},  {P::kWaiting, P::kPrepared},
      {P::kPreparing, P::kPrepared}, {P::kPreparing, P::kWaiting},
      {P::kPrepared, P::kInTrainer}, {P::kInTrainer, P::kPausing},
      {P::kInTrainer, P::kWaiting},  {P::kPausing, P::kInTrainer},
      {P::kPausing, P::kWaiting}};
  for (P from : all) {
    for (P to : all) {
      EXPECT_EQ(IsAllowedPlaceChange(from, to), allowed.count({from, to}) > 0)
          << JobPlaceName(from) << " -> " << JobPlaceName(to);
    }
  }
}

}  // namespace
}  // namespace loraplex
