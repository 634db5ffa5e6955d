// One job's failure is its own: with test faults planted in chosen jobs
// (--test-faults, core/common/test_faults.h) at every point of a step,
// only those jobs fail, each with its own error, and the jobs that share
// their co-batches train exactly as they would alone.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_join.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Seeds of the jobs the faults are planted in.
constexpr uint64_t kAttachSeed = 701;
constexpr uint64_t kForwardSeed = 702;
constexpr uint64_t kOptimizerSeed = 703;
constexpr uint64_t kValidationSeed = 704;
constexpr uint64_t kPauseSeed = 705;

std::string FaultSpec() {
  return absl::StrCat("--test-faults=attach:seed=", kAttachSeed,
                      ";forward:seed=", kForwardSeed,
                      ";optimizer:seed=", kOptimizerSeed, ",times=1",
                      ";validation:seed=", kValidationSeed,
                      ";pause_checkpoint:seed=", kPauseSeed);
}

TEST(ServiceIsolationTest, PlantedFaultsFailOnlyTheirJobs) {
  const std::string state = FreshTestDir("state");
  auto server =
      StartServer(state, /*slots=*/6, {"--dtype=float64", FaultSpec()});
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(server->Log(), HasSubstr("test faults armed"));
  auto client = ClientFor(*server);
  const std::string jsonl = ReversalJsonl(24, 3);
  auto dataset = client->UploadDatasetContents(jsonl, "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();

  // Seed -> the point whose error its job must end with ("" for none).
  const std::map<uint64_t, std::string> seeds = {
      {1, ""},
      {2, ""},
      {kAttachSeed, "injected fault at attach"},
      {kForwardSeed, "injected fault at forward"},
      {kOptimizerSeed, "injected fault at optimizer"},
      {kValidationSeed, "injected fault at validation"},
  };
  std::map<uint64_t, std::string> names;
  for (const auto& [seed, error] : seeds) {
    v1::CreateJobRequest request = JobRequest(
        dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, /*steps=*/6, seed);
    request.set_validation_dataset(dataset->name());
    auto job = client->CreateJob(request);
    ASSERT_TRUE(job.ok()) << job.status();
    names[seed] = job->name();
  }
  const std::string model_dir = state + "/models/tiny";
  auto model_config = LoadModelConfig(model_dir);
  ASSERT_TRUE(model_config.ok()) << model_config.status();
  for (const auto& [seed, error] : seeds) {
    auto job = WaitForJob(*client, names[seed]);
    ASSERT_TRUE(job.ok()) << job.status();
    if (!error.empty()) {
      EXPECT_EQ(job->status(), v1::JOB_STATUS_FAILED) << seed;
      EXPECT_THAT(job->error().message(), HasSubstr(error)) << seed;
      // Its message is about itself alone.
      for (const auto& [other, name] : names) {
        if (other != seed) {
          EXPECT_THAT(job->error().message(), Not(HasSubstr(name))) << seed;
        }
      }
      continue;
    }
    ASSERT_EQ(job->status(), v1::JOB_STATUS_SUCCEEDED)
        << seed << ": " << job->error().message() << "\n"
        << server->Log();
    EXPECT_EQ(job->metrics().step(), 6);
    // Trained exactly as alone, although every one of its steps first
    // failed together with the forward fault's job.
    const std::string out = FreshTestDir(absl::StrCat("out", seed));
    v1::ExportAdapterRequest request;
    request.set_job(job->name());
    ASSERT_TRUE(client->ExportAdapter(request, out).ok());
    auto exported = LoadPeftAdapter(out, *model_config);
    ASSERT_TRUE(exported.ok()) << exported.status();
    ExpectFp64Identity(AdapterTensors(*exported),
                       TrainDirectly(model_dir, jsonl, *job), job->name());
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServiceIsolationTest, FailedPauseCheckpointLeavesTheJobTraining) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/2, {FaultSpec()});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto job = client->CreateJob(JobRequest(
      dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 100000, kPauseSeed));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(WaitUntil(*client, job->name(), [](const v1::Job& j) {
                return j.metrics().step() > 0;
              }).ok());
  absl::Status paused = client->PauseJob(job->name()).status();
  EXPECT_EQ(paused.code(), absl::StatusCode::kInternal) << paused;
  EXPECT_THAT(paused.message(), HasSubstr("was not paused"));
  EXPECT_THAT(paused.message(),
              HasSubstr("injected fault at pause_checkpoint"));
  auto after = client->GetJob(job->name());
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->status(), v1::JOB_STATUS_RUNNING);
  const int64_t step = after->metrics().step();
  // It trains on.
  ASSERT_TRUE(WaitUntil(*client, job->name(), [&](const v1::Job& j) {
                return j.metrics().step() > step;
              }).ok());
  ASSERT_TRUE(client->CancelJob(job->name()).ok());
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// Waits until the server's log holds `text`.
bool WaitForLog(const ServerProcess& server, const std::string& text,
                int timeout_seconds = 120) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  while (server.Log().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return true;
}

// Cancel, pause and resume answer OK only for a change that is stored: a
// failed write is the caller's error, and the job stays as it was.
TEST(ServiceIsolationTest, ChangesAreAcknowledgedOnlyOnceStored) {
  const std::string state = FreshTestDir("state");
  auto server =
      StartServer(state, /*slots=*/1,
                  {"--test-faults=store_write:op=update_job_PAUSED,times=1;"
                   "store_write:op=update_job_QUEUED,times=1;"
                   "store_write:op=update_job_CANCELLED,times=1"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto running = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 100000, 1));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(WaitUntil(*client, running->name(), [](const v1::Job& j) {
                return j.status() == v1::JOB_STATUS_RUNNING;
              }).ok());
  // Queued behind it: the one slot is taken.
  auto queued = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 5, 2));
  ASSERT_TRUE(queued.ok()) << queued.status();
  const std::string name = queued->name();
  auto expect_status = [&](v1::JobStatus expected) {
    auto job = client->GetJob(name);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->status(), expected) << v1::JobStatus_Name(job->status());
  };
  auto expect_refused = [&](const absl::Status& status, const char* op) {
    EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
    EXPECT_THAT(status.message(),
                HasSubstr("could not be stored, so it was not made"));
    EXPECT_THAT(status.message(), HasSubstr(op));
  };

  expect_refused(client->PauseJob(name).status(), "update_job_PAUSED");
  expect_status(v1::JOB_STATUS_QUEUED);
  ASSERT_TRUE(client->PauseJob(name).ok());
  expect_status(v1::JOB_STATUS_PAUSED);

  expect_refused(client->ResumeJob(name).status(), "update_job_QUEUED");
  expect_status(v1::JOB_STATUS_PAUSED);
  ASSERT_TRUE(client->ResumeJob(name).ok());
  expect_status(v1::JOB_STATUS_QUEUED);

  expect_refused(client->CancelJob(name).status(), "update_job_CANCELLED");
  expect_status(v1::JOB_STATUS_QUEUED);
  ASSERT_TRUE(client->CancelJob(name).ok());
  expect_status(v1::JOB_STATUS_CANCELLED);
  ASSERT_TRUE(client->CancelJob(running->name()).ok());
  ASSERT_TRUE(server->Stop().ok()) << server->Log();

  // What was acknowledged is what a restart finds.
  auto again = StartServer(state, /*slots=*/1);
  ASSERT_NE(again, nullptr);
  auto reader = ClientFor(*again);
  for (const std::string& job : {name, running->name()}) {
    auto stored = reader->GetJob(job);
    ASSERT_TRUE(stored.ok()) << stored.status();
    EXPECT_EQ(stored->status(), v1::JOB_STATUS_CANCELLED) << job;
  }
  EXPECT_TRUE(again->Stop().ok()) << again->Log();
}

// A store that keeps failing stops the server with a clear line, before
// more of what it does goes unrecorded.
TEST(ServiceIsolationTest, StoreThatKeepsFailingStopsTheServer) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/1,
                            {"--test-faults=store_write:op=update_jobs"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_TRUE(
      client
          ->CreateJob(JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4,
                                 100000, 1))
          .ok());
  ASSERT_TRUE(WaitForLog(*server, "stopped after a failure")) << server->Log();
  EXPECT_THAT(server->Log(),
              HasSubstr("the job store failed 5 writes in a row (last: "
                        "injected fault at store_write update_jobs); "
                        "stopping"));
  // Its exit status says it failed.
  EXPECT_FALSE(server->Stop().ok());
}

// Entries of `dir` (none when missing).
std::vector<std::string> Listing(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Finished jobs keep their newest checkpoint (--keep-finished-checkpoints);
// what interrupted writes leave is removed at start-up, and counted.
TEST(ServiceIsolationTest, DiskHoldsOnlyWhatRecordsNeed) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/1, {"--checkpoint-interval=2"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto created = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 8, 1));
  ASSERT_TRUE(created.ok()) << created.status();
  auto job = WaitForJob(*client, created->name());
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_EQ(job->status(), v1::JOB_STATUS_SUCCEEDED) << job->error().message();
  const std::string job_dir =
      state + "/checkpoints/" + created->name().substr(5);
  // Of its checkpoints every 2 steps the newest alone is left, once the
  // writes queued when it finished are done.
  std::vector<std::string> kept = Listing(job_dir);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (kept.size() != 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    kept = Listing(job_dir);
  }
  ASSERT_EQ(kept.size(), 1u) << absl::StrJoin(kept, ", ");
  EXPECT_THAT(kept[0], ::testing::AnyOf("step-00000006", "step-00000008"));
  ASSERT_TRUE(server->Stop().ok()) << server->Log();

  // What a kill -9 in the middle of writes leaves behind.
  const std::string dataset_file =
      state + "/datasets/" + dataset->name().substr(9) + ".jsonl";
  ASSERT_TRUE(std::filesystem::exists(dataset_file));
  for (const char* dir :
       {"/adapters/adapter-orphan", "/adapters/adapter-x.staged",
        "/tmp/export-y", "/checkpoints/job-orphan/step-00000001"}) {
    std::filesystem::create_directories(state + dir);
    std::ofstream(state + dir + "/file") << "bytes";
  }
  for (const char* file :
       {"/datasets/ds-orphan.jsonl", "/datasets/ds-a.jsonl.tmp.123.4"}) {
    std::ofstream(state + file) << "{}";
  }
  server = StartServer(state, /*slots=*/1, {"--keep-finished-checkpoints=0"});
  ASSERT_NE(server, nullptr);
  EXPECT_THAT(server->Log(),
              HasSubstr("removed 6 leftover(s) of interrupted writes and 1 "
                        "checkpoint(s) of finished jobs"));
  EXPECT_FALSE(std::filesystem::exists(job_dir));
  EXPECT_EQ(Listing(state + "/adapters"),
            std::vector<std::string>{job->adapter().substr(9)});
  EXPECT_EQ(Listing(state + "/datasets"),
            std::vector<std::string>{dataset->name().substr(9) + ".jsonl"});
  EXPECT_TRUE(Listing(state + "/tmp").empty());
  EXPECT_THAT(Listing(state + "/checkpoints"),
              ::testing::Each(Not(HasSubstr("job-"))));
  // The records' files still serve.
  client = ClientFor(*server);
  v1::ExportAdapterRequest request;
  request.set_job(job->name());
  EXPECT_TRUE(client->ExportAdapter(request, FreshTestDir("out")).ok());
  EXPECT_TRUE(client
                  ->CreateJob(JobRequest(dataset->name(),
                                         v1::OPTIMIZER_FAMILY_ADAMW, 4, 2, 2))
                  .ok());
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// A cancelled job's record names the step of its last checkpoint, though
// the trainer may train a step more before the cancel reaches it.
TEST(ServiceIsolationTest, CancelledJobRecordsTheStepOfItsCheckpoint) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/1, {"--checkpoint-interval=0"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  for (uint64_t seed = 1; seed <= 3; ++seed) {
    auto job = client->CreateJob(JobRequest(
        dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 100000, seed));
    ASSERT_TRUE(job.ok()) << job.status();
    ASSERT_TRUE(WaitUntil(*client, job->name(), [](const v1::Job& j) {
                  return j.metrics().step() >= 3;
                }).ok());
    ASSERT_TRUE(client->CancelJob(job->name()).ok());
    // Its checkpoint is written when the trainer lets it go.
    int64_t checkpoint_step = -1;
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (checkpoint_step < 0 && std::chrono::steady_clock::now() < deadline) {
      auto listed = client->ListCheckpoints(job->name());
      ASSERT_TRUE(listed.ok()) << listed.status();
      if (listed->checkpoints_size() > 0) {
        checkpoint_step = listed->checkpoints(0).step();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ASSERT_GT(checkpoint_step, 0);
    auto recorded = WaitUntil(
        *client, job->name(),
        [&](const v1::Job& j) { return j.metrics().step() == checkpoint_step; },
        30);
    ASSERT_TRUE(recorded.ok())
        << recorded.status() << "; checkpoint at step " << checkpoint_step;
    EXPECT_EQ(recorded->status(), v1::JOB_STATUS_CANCELLED);
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// DeleteJob and DeleteAdapter free the disk of what is finished, and
// refuse what a job still needs.
TEST(ServiceIsolationTest, DeletesRefuseWhatAJobStillNeeds) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/1);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto running = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 100000, 1));
  ASSERT_TRUE(running.ok()) << running.status();
  ASSERT_TRUE(WaitUntil(*client, running->name(), [](const v1::Job& j) {
                return j.metrics().step() > 0;
              }).ok());
  absl::Status refused = client->DeleteJob(running->name());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("cancel it"));

  // An adapter a queued job starts from stays.
  const v1::AttachAdapterRequest attach = AttachNewAdapter(
      state + "/models/tiny",
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 100000, 2));
  auto attached = client->AttachAdapter(attach);
  ASSERT_TRUE(attached.ok()) << attached.status();
  const std::string adapter = attached->adapter().name();
  refused = client->DeleteAdapter(adapter);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("starting point of job"));

  ASSERT_TRUE(client->CancelJob(running->name()).ok());
  // Deleted once it has left its slot (its cancel checkpoint written).
  absl::Status deleted;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  do {
    deleted = client->DeleteJob(running->name());
    if (deleted.ok()) break;
    EXPECT_THAT(deleted.message(), HasSubstr("still leaving its slot"));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (std::chrono::steady_clock::now() < deadline);
  ASSERT_TRUE(deleted.ok()) << deleted;
  EXPECT_EQ(client->GetJob(running->name()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(std::filesystem::exists(state + "/checkpoints/" +
                                       running->name().substr(5)));

  ASSERT_TRUE(client->CancelJob(attached->job().name()).ok());
  ASSERT_TRUE(client->DeleteAdapter(adapter).ok());
  EXPECT_EQ(client->GetAdapter(adapter).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(
      std::filesystem::exists(state + "/adapters/" + adapter.substr(9)));
  EXPECT_EQ(client->DeleteAdapter(adapter).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// An export of a job that ends meanwhile answers with its trained adapter,
// never NOT_FOUND (the trainer may no longer hold the job when the export
// reaches it). Each job is held at step 2 (--test-faults=hold) until its
// first export reaches the trainer: that export is always of a running job,
// and the job's last steps and end follow it at once, racing the exports
// after it.
TEST(ServiceIsolationTest, ExportRacingTheJobsEndAnswersItsAdapter) {
  const std::string state = FreshTestDir("state");
  auto server = StartServer(state, /*slots=*/2, {"--test-faults=hold:step=2"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    auto job = client->CreateJob(
        JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 4, seed));
    ASSERT_TRUE(job.ok()) << job.status();
    auto held = WaitUntil(*client, job->name(), [](const v1::Job& j) {
      return j.metrics().step() >= 2 || (j.status() != v1::JOB_STATUS_RUNNING &&
                                         j.status() != v1::JOB_STATUS_QUEUED);
    });
    ASSERT_TRUE(held.ok()) << held.status();
    ASSERT_EQ(held->status(), v1::JOB_STATUS_RUNNING);
    ASSERT_EQ(held->metrics().step(), 2);
    v1::ExportAdapterRequest request;
    request.set_job(job->name());
    // The running job's adapter at step 2 (this export releases it).
    const std::string snapshot = FreshTestDir("snapshot");
    auto first = client->ExportAdapter(request, snapshot);
    ASSERT_TRUE(first.ok()) << first.status();
    for (;;) {
      auto files = client->ExportAdapter(request, FreshTestDir("out"));
      ASSERT_NE(files.status().code(), absl::StatusCode::kNotFound)
          << files.status();
      auto now = client->GetJob(job->name());
      ASSERT_TRUE(now.ok());
      if (now->status() == v1::JOB_STATUS_SUCCEEDED) {
        ASSERT_TRUE(files.ok()) << files.status();
        break;
      }
    }
    // The first export was a snapshot between two steps, not the trained
    // adapter the job's end answers with.
    v1::ExportAdapterRequest trained;
    trained.set_job(job->name());
    const std::string final_dir = FreshTestDir("final");
    ASSERT_TRUE(client->ExportAdapter(trained, final_dir).ok());
    EXPECT_NE(ReadFileForTest(snapshot + "/adapter_model.safetensors"),
              ReadFileForTest(final_dir + "/adapter_model.safetensors"));
  }
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServiceIsolationTest, BadFaultSpecIsRefusedAtStart) {
  ServerProcessOptions options;
  options.state_dir = FreshTestDir("state");
  options.extra_args = {"--test-faults=explode:seed=1"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(server.status().message(), HasSubstr("unknown point"));
}

}  // namespace
}  // namespace loraplex
