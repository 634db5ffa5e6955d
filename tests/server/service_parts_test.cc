// The service's small concurrent parts on their own: the job event hub, the
// work queue, and the bearer-token authenticator.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "server/common/work_queue.h"
#include "server/edges/sample_admissions.h"
#include "server/edges/tenant_auth.h"
#include "server/jobs/job_event_hub.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

TEST(JobEventHubTest, NotifyWakesOnlyTheJobsListeners) {
  JobEventHub hub;
  int a_calls = 0;
  int b_calls = 0;
  const int64_t a = hub.Subscribe("job-a", [&] { ++a_calls; });
  hub.Subscribe("job-b", [&] { ++b_calls; });
  hub.Notify("job-a");
  hub.Notify("job-a");
  hub.Notify("job-c");
  EXPECT_EQ(a_calls, 2);
  EXPECT_EQ(b_calls, 0);
  hub.NotifyAll();
  EXPECT_EQ(a_calls, 3);
  EXPECT_EQ(b_calls, 1);
  hub.Unsubscribe(a);
  hub.Notify("job-a");
  hub.NotifyAll();
  EXPECT_EQ(a_calls, 3);
  EXPECT_EQ(b_calls, 2);
}

TEST(JobEventHubTest, UnsubscribeWaitsForARunningListener) {
  JobEventHub hub;
  absl::Notification entered;
  absl::Notification release;
  std::atomic<bool> finished{false};
  const int64_t token = hub.Subscribe("job", [&] {
    entered.Notify();
    release.WaitForNotification();
    finished = true;
  });
  std::thread notifier([&] { hub.Notify("job"); });
  entered.WaitForNotification();
  std::thread unsubscriber([&] {
    hub.Unsubscribe(token);
    // The listener's owner may go away now: it is not running.
    EXPECT_TRUE(finished.load());
  });
  release.Notify();
  unsubscriber.join();
  notifier.join();
}

TEST(WorkQueueTest, RunsPostedWorkOnItsThreads) {
  std::atomic<int> done{0};
  std::vector<std::thread::id> ids(8);
  {
    WorkQueue work(2);
    for (int i = 0; i < 8; ++i) {
      work.Post([&, i] {
        ids[i] = std::this_thread::get_id();
        ++done;
      });
    }
  }  // The destructor runs what was posted, then joins.
  EXPECT_EQ(done.load(), 8);
  for (const std::thread::id& id : ids) {
    EXPECT_NE(id, std::this_thread::get_id());
  }
}

TEST(WorkQueueTest, WorkPostedBeforeDestructionStillRuns) {
  std::atomic<int> done{0};
  absl::Notification started;
  absl::Notification release;
  {
    WorkQueue work(1);
    work.Post([&] {
      started.Notify();
      release.WaitForNotification();
      ++done;
    });
    started.WaitForNotification();
    // Queued behind a busy thread when the queue is destroyed.
    for (int i = 0; i < 3; ++i) work.Post([&] { ++done; });
    release.Notify();
  }
  EXPECT_EQ(done.load(), 4);
}

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

TEST(TenantAuthenticatorTest, MapsBearerTokensToTenants) {
  absl::StatusOr<TenantAuthenticator> auth =
      TenantAuthenticator::FromTokensText(
          "# tenants\n\nann  ann-token-0123456789\nbob\tbob-token-0123456789\n",
          "tokens.txt");
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE(auth->requires_tokens());
  const std::string bob = "Bearer bob-token-0123456789";
  const std::string lower = "bearer ann-token-0123456789 ";
  EXPECT_EQ(*auth->Authenticate(Metadata{{"authorization", bob}}), "bob");
  EXPECT_EQ(*auth->Authenticate(Metadata{{"authorization", lower}}), "ann");

  const std::string unknown = "Bearer not-a-token-0123456789";
  const std::string basic = "Basic ann-token-0123456789";
  for (const Metadata& metadata :
       {Metadata{}, Metadata{{"authorization", unknown}},
        Metadata{{"authorization", basic}}}) {
    EXPECT_EQ(auth->Authenticate(metadata).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  // The HTTP Authorization header of OpenAI clients, the same way.
  EXPECT_EQ(*auth->AuthenticateBearer(bob), "bob");
  EXPECT_EQ(*auth->AuthenticateBearer(lower), "ann");
  for (const std::optional<std::string>& header :
       {std::optional<std::string>(), std::optional<std::string>(unknown),
        std::optional<std::string>(basic)}) {
    EXPECT_EQ(auth->AuthenticateBearer(header).status().code(),
              absl::StatusCode::kUnauthenticated);
  }
  EXPECT_THAT(auth->AuthenticateBearer(std::nullopt).status().message(),
              HasSubstr("Authorization: Bearer <token>"));
}

// One quota per tenant whichever API its sampling requests come through
// (the gRPC sampler and the OpenAI API share one SampleAdmissions).
TEST(SampleAdmissionsTest, CountsEachTenantsRequestsInFlight) {
  SampleAdmissions admissions(2);
  EXPECT_TRUE(admissions.Enter("ann").ok());
  EXPECT_TRUE(admissions.Enter("ann").ok());
  const absl::Status full = admissions.Enter("ann");
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(full.message(), HasSubstr("at most 2 sample requests"));
  EXPECT_TRUE(admissions.Enter("bob").ok());  // Another tenant's own quota.
  admissions.Leave("ann");
  EXPECT_TRUE(admissions.Enter("ann").ok());
  EXPECT_EQ(admissions.Enter("ann").code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(TenantAuthenticatorTest, WithoutTokensEveryCallerIsTheDefaultTenant) {
  const TenantAuthenticator auth = TenantAuthenticator::SingleTenant();
  EXPECT_FALSE(auth.requires_tokens());
  EXPECT_EQ(*auth.Authenticate(Metadata{}), kDefaultTenant);
  EXPECT_EQ(*auth.AuthenticateBearer(std::nullopt), kDefaultTenant);
  EXPECT_EQ(*auth.AuthenticateBearer("Bearer anything"), kDefaultTenant);
}

TEST(TenantAuthenticatorTest, BadTokensFilesNameTheLineAndTheReason) {
  const std::map<std::string, std::string> cases = {
      {"ann\n", "t line 1: expected \"<tenant> <token>\""},
      {"\nann short\n", "t line 2: tokens must be at least 16 characters"},
      {"a/b token-0123456789abc\n", "t line 1: a tenant name may only hold"},
      {"ann token-0123456789abc\nbob token-0123456789abc\n",
       "t line 2: this token is already given to another line"},
      {"# nothing\n", "t holds no \"<tenant> <token>\" line"},
  };
  for (const auto& [text, error] : cases) {
    absl::StatusOr<TenantAuthenticator> auth =
        TenantAuthenticator::FromTokensText(text, "t");
    ASSERT_FALSE(auth.ok()) << text;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(auth.status().message(), HasSubstr(error)) << text;
  }
  EXPECT_EQ(TenantAuthenticator::FromTokensFile("/nonexistent/tokens")
                .status()
                .code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace loraplex
