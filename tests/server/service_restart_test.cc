// A server killed mid-run (SIGKILL) and started again on its state dir
// loses nothing it acknowledged; queued and running jobs run again.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "tests/common/test_dir.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

TEST(ServiceRestartTest, KilledServerKeepsEverythingAndRequeuesJobs) {
  const std::string state = FreshTestDir("state");
  const std::string jsonl = ReversalJsonl(24, 9);
  std::string dataset_name, done_name, running_name, queued_name;
  const std::string before = FreshTestDir("before");
  {
    auto server = StartServer(state, /*slots=*/1);
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    auto dataset = client->UploadDatasetContents(jsonl, "kept");
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    dataset_name = dataset->name();
    auto done = client->CreateJob(
        JobRequest(dataset_name, v1::OPTIMIZER_FAMILY_ADAM, 4, 8, 1));
    ASSERT_TRUE(done.ok());
    done_name = done->name();
    ASSERT_EQ(WaitForJob(*client, done_name)->status(),
              v1::JOB_STATUS_SUCCEEDED);
    v1::ExportAdapterRequest request;
    request.set_job(done_name);
    ASSERT_TRUE(client->ExportAdapter(request, before).ok());

    auto running = client->CreateJob(
        JobRequest(dataset_name, v1::OPTIMIZER_FAMILY_MUON, 8, 100000, 2));
    ASSERT_TRUE(running.ok());
    running_name = running->name();
    auto queued = client->CreateJob(
        JobRequest(dataset_name, v1::OPTIMIZER_FAMILY_ADAMW, 8, 10, 3));
    ASSERT_TRUE(queued.ok());
    queued_name = queued->name();
    ASSERT_TRUE(WaitUntil(*client, running_name, [](const v1::Job& job) {
                  return job.metrics().step() >= 3;
                }).ok());
    server->Kill();
  }

  auto server = StartServer(state, /*slots=*/1);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->GetDataset(dataset_name);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->num_examples(), 24);

  auto done = client->GetJob(done_name);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED);
  v1::ExportAdapterRequest request;
  request.set_job(done_name);
  const std::string after = FreshTestDir("after");
  ASSERT_TRUE(client->ExportAdapter(request, after).ok());
  for (const char* file :
       {"adapter_config.json", "adapter_model.safetensors"}) {
    EXPECT_EQ(ReadFileForTest(after + "/" + file),
              ReadFileForTest(before + "/" + file))
        << file;
  }

  // The running job starts over and trains again.
  auto again = WaitUntil(*client, running_name, [](const v1::Job& job) {
    return job.status() == v1::JOB_STATUS_RUNNING && job.metrics().step() >= 1;
  });
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << server->Log();
  auto events = client->ListAllJobEvents(running_name);
  ASSERT_TRUE(events.ok());
  bool requeued = false;
  for (const v1::JobEvent& event : *events) {
    requeued = requeued || (event.has_status_change() &&
                            absl::StrContains(event.status_change().message(),
                                              "server restarted"));
  }
  EXPECT_TRUE(requeued);
  ASSERT_TRUE(client->CancelJob(running_name).ok());

  // The job that was queued behind it runs once the slot is free.
  auto queued = WaitForJob(*client, queued_name);
  ASSERT_TRUE(queued.ok());
  EXPECT_EQ(queued->status(), v1::JOB_STATUS_SUCCEEDED)
      << queued->error().message();
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
  EXPECT_THAT(server->Log(), HasSubstr("recovered 2 unfinished job(s)"));
}

}  // namespace
}  // namespace loraplex
