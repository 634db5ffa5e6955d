// Queueing, per-tenant quotas, concurrent readers and RetireAdapter,
// through the real server and client.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "tests/common/test_dir.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

constexpr char kAliceToken[] = "alice-token-0123456789";
constexpr char kBobToken[] = "bob-token-0123456789ab";

std::string WriteTokens(const std::string& dir) {
  const std::string path = dir + "/tokens";
  std::ofstream(path) << "# tenant token\nalice " << kAliceToken << "\nbob "
                      << kBobToken << "\n";
  return path;
}

// The slot each job trained in, from its RUNNING event.
int SlotOf(LoraplexClient& client, const std::string& job) {
  auto events = client.ListAllJobEvents(job);
  EXPECT_TRUE(events.ok()) << events.status();
  if (!events.ok()) return -1;
  for (const v1::JobEvent& event : *events) {
    if (event.has_status_change() &&
        event.status_change().status() == v1::JOB_STATUS_RUNNING) {
      const std::string& message = event.status_change().message();
      return std::stoi(message.substr(message.rfind(' ') + 1));
    }
  }
  return -1;
}

TEST(ServiceSchedulingTest, MoreJobsThanSlotsAllFinishWithinTheQuota) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(
      state, /*slots=*/2,
      {"--tokens-file", WriteTokens(state), "--slots-per-tenant", "1"});
  ASSERT_NE(server, nullptr);
  auto alice = ClientFor(*server, kAliceToken);
  auto bob = ClientFor(*server, kBobToken);
  auto alice_data = alice->UploadDatasetContents(ReversalJsonl(24, 1), "a");
  auto bob_data = bob->UploadDatasetContents(ReversalJsonl(24, 2), "b");
  ASSERT_TRUE(alice_data.ok()) << alice_data.status();
  ASSERT_TRUE(bob_data.ok()) << bob_data.status();

  std::vector<std::pair<LoraplexClient*, std::string>> jobs;
  for (int i = 0; i < 3; ++i) {
    auto job = alice->CreateJob(
        JobRequest(alice_data->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 12, i));
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.emplace_back(alice.get(), job->name());
  }
  for (int i = 0; i < 2; ++i) {
    auto job = bob->CreateJob(
        JobRequest(bob_data->name(), v1::OPTIMIZER_FAMILY_MUON, 4, 12, i));
    ASSERT_TRUE(job.ok()) << job.status();
    jobs.emplace_back(bob.get(), job->name());
  }

  std::map<LoraplexClient*, std::vector<v1::Job>> finished;
  std::set<int> slots;
  for (const auto& [client, name] : jobs) {
    auto job = WaitForJob(*client, name);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->status(), v1::JOB_STATUS_SUCCEEDED)
        << job->error().message() << "\n"
        << server->Log();
    finished[client].push_back(*job);
    slots.insert(SlotOf(*client, name));
  }
  // Five jobs went through the two slots (both, unless a slow client let
  // each job end before the next was created).
  EXPECT_FALSE(slots.empty());
  EXPECT_THAT(slots, ::testing::IsSubsetOf(std::set<int>{0, 1}));
  // With a quota of one slot per tenant, a tenant's jobs never overlap and
  // run in the order they were created.
  for (auto& [client, list] : finished) {
    for (size_t i = 1; i < list.size(); ++i) {
      const auto previous_end = list[i - 1].end_time();
      const auto start = list[i].start_time();
      EXPECT_GE(start.seconds() * 1000 + start.nanos() / 1000000,
                previous_end.seconds() * 1000 + previous_end.nanos() / 1000000)
          << list[i].name() << " started before " << list[i - 1].name()
          << " ended";
    }
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServiceSchedulingTest, TwentyClientsPollWhileJobsTrain) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/2);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(24, 1), "d");
  ASSERT_TRUE(dataset.ok());
  std::vector<std::string> names;
  for (int i = 0; i < 2; ++i) {
    auto job = client->CreateJob(
        JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 8, 100000, i));
    ASSERT_TRUE(job.ok()) << job.status();
    names.push_back(job->name());
  }
  ASSERT_TRUE(WaitUntil(*client, names[1], [](const v1::Job& job) {
                return job.status() == v1::JOB_STATUS_RUNNING;
              }).ok());

  std::atomic<int> failures{0};
  std::atomic<int> calls{0};
  std::vector<std::thread> pollers;
  for (int t = 0; t < 20; ++t) {
    pollers.emplace_back([&, t] {
      auto own = ClientFor(*server);
      for (int i = 0; i < 25; ++i) {
        absl::Status status = (i + t) % 2 == 0
                                  ? own->GetJob(names[i % 2]).status()
                                  : own->ListSlots().status();
        if (!status.ok()) ++failures;
        ++calls;
      }
    });
  }
  for (std::thread& poller : pollers) poller.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(calls.load(), 500);
  auto still = client->GetJob(names[0]);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->status(), v1::JOB_STATUS_RUNNING);
  for (const std::string& name : names) {
    ASSERT_TRUE(client->CancelJob(name).ok());
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServiceSchedulingTest, RetireStopsTheJobAndTheSlotIsReusedCleanly) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/1, {"--dtype=float64"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  const std::string jsonl = ReversalJsonl(24, 5);
  auto dataset = client->UploadDatasetContents(jsonl, "d");
  ASSERT_TRUE(dataset.ok());
  auto first = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_MUON, 8, 100000, 1));
  ASSERT_TRUE(first.ok());
  auto second = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 8, 15, 2));
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(WaitUntil(*client, first->name(), [](const v1::Job& job) {
                return job.metrics().step() >= 3;
              }).ok());
  auto queued = client->GetJob(second->name());
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queued->status(), v1::JOB_STATUS_QUEUED);

  auto retired = client->RetireAdapter(first->name());
  ASSERT_TRUE(retired.ok()) << retired.status();
  EXPECT_EQ(retired->job().status(), v1::JOB_STATUS_CANCELLED);
  // Retiring again, or a queued job, is refused.
  EXPECT_EQ(client->RetireAdapter(first->name()).status().code(),
            absl::StatusCode::kFailedPrecondition);

  auto done = WaitForJob(*client, second->name());
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
      << done->error().message();
  EXPECT_EQ(SlotOf(*client, second->name()), 0);
  // The reused slot inherited nothing: the job's weights equal a run in a
  // fresh engine.
  v1::ExportAdapterRequest request;
  request.set_job(done->name());
  const std::string out = FreshTestDir("export");
  ASSERT_TRUE(client->ExportAdapter(request, out).ok());
  auto model_config = LoadModelConfig(state + "/models/tiny");
  ASSERT_TRUE(model_config.ok());
  auto exported = LoadPeftAdapter(out, *model_config);
  ASSERT_TRUE(exported.ok()) << exported.status();
  ExpectFp64Identity(AdapterTensors(*exported),
                     TrainDirectly(state + "/models/tiny", jsonl, *done),
                     "reused slot");
  auto events = client->ListAllJobEvents(first->name());
  ASSERT_TRUE(events.ok());
  EXPECT_THAT(events->back().status_change().message(),
              HasSubstr("RetireAdapter"));
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

}  // namespace
}  // namespace loraplex
