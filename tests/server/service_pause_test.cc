// PauseJob and ResumeJob, ListCheckpoints, ExportAdapter from a checkpoint
// and CreateJob from one, and what a failing checkpoint does, through the
// real loraplex-server and client.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "absl/strings/match.h"
#include "tests/common/test_dir.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::map<std::string, std::string> Export(LoraplexClient& client,
                                          v1::ExportAdapterRequest request) {
  const std::string dir = FreshTestDir("export");
  auto files = client.ExportAdapter(request, dir);
  EXPECT_TRUE(files.ok()) << files.status();
  return {{"config", AdapterConfigWithoutBase(dir + "/adapter_config.json")},
          {"weights", ReadFileForTest(dir + "/adapter_model.safetensors")}};
}

std::map<std::string, std::string> ExportJob(LoraplexClient& client,
                                             const std::string& job) {
  v1::ExportAdapterRequest request;
  request.set_job(job);
  return Export(client, request);
}

std::string CheckpointPath(const std::string& state, const std::string& job,
                           int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "/step-%08lld",
                static_cast<long long>(step));
  return state + "/checkpoints/" + job.substr(5) + name;
}

v1::CreateJobRequest Job(const std::string& dataset, int64_t steps) {
  v1::CreateJobRequest request =
      JobRequest(dataset, v1::OPTIMIZER_FAMILY_MUON, 8, steps, 7);
  request.mutable_lora()->set_dropout(0.05);
  return request;
}

// A job alone in the pool before and after its pause trains in the same
// co-batches (itself) as without the pause: bit-exact.
TEST(ServicePauseTest, PauseAndResumeOfAJobAloneIsBitExact) {
  const std::string jsonl = ReversalJsonl(30, 3);
  RunLosses reference;
  std::map<std::string, std::string> reference_adapter;
  {
    auto server =
        StartServer(FreshTestDir("reference"), 1, {"--checkpoint-interval=0"});
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    auto dataset = client->UploadDatasetContents(jsonl, "d");
    ASSERT_TRUE(dataset.ok());
    auto job = client->CreateJob(Job(dataset->name(), 30));
    ASSERT_TRUE(job.ok());
    ASSERT_EQ(WaitForJob(*client, job->name())->status(),
              v1::JOB_STATUS_SUCCEEDED);
    reference = LastRun(*client, job->name());
    reference_adapter = ExportJob(*client, job->name());
  }
  ASSERT_EQ(reference.loss.size(), 30u);

  // Held after step 8 (--test-faults=hold) until the pause reaches the
  // trainer: else a slow client sees the job finish first. A job alone
  // that waits between steps trains the same steps.
  auto server = StartServer(
      FreshTestDir("paused"), 1,
      {"--checkpoint-interval=0", "--test-faults=hold:seed=7,step=8"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(jsonl, "d");
  ASSERT_TRUE(dataset.ok());
  auto job = client->CreateJob(Job(dataset->name(), 30));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitUntil(*client, job->name(), [](const v1::Job& job) {
                return job.metrics().step() >= 8;
              }).ok());
  auto paused = client->PauseJob(job->name());
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->status(), v1::JOB_STATUS_PAUSED);
  const int64_t step = paused->metrics().step();
  ASSERT_EQ(step, 8);
  // The slot is free, and the job stays paused.
  auto slots = client->ListSlots();
  ASSERT_TRUE(slots.ok());
  EXPECT_EQ(slots->slots(0).state(), v1::SLOT_STATE_FREE);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(client->GetJob(job->name())->metrics().step(), step);

  auto checkpoints = client->ListCheckpoints(job->name());
  ASSERT_TRUE(checkpoints.ok());
  ASSERT_EQ(checkpoints->checkpoints_size(), 1);
  const v1::Checkpoint& checkpoint = checkpoints->checkpoints(0);
  EXPECT_EQ(checkpoint.name(),
            absl::StrCat(job->name(), "/checkpoints/", step));
  EXPECT_EQ(checkpoint.step(), step);
  EXPECT_EQ(checkpoint.metrics().loss(), reference.loss.at(step));
  EXPECT_GT(checkpoint.size_bytes(), 0);
  EXPECT_GT(checkpoint.create_time().seconds(), 0);

  auto resumed = client->ResumeJob(job->name());
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->status(), v1::JOB_STATUS_QUEUED);
  ASSERT_EQ(WaitForJob(*client, job->name())->status(),
            v1::JOB_STATUS_SUCCEEDED);
  const RunLosses after = LastRun(*client, job->name());
  EXPECT_THAT(
      after.running_message,
      HasSubstr(absl::StrCat("resumed from the checkpoint at step ", step)));
  ASSERT_EQ(after.loss.size(), static_cast<size_t>(30 - step));
  for (const auto& [s, loss] : after.loss) {
    EXPECT_EQ(loss, reference.loss.at(s)) << "step " << s;
  }
  EXPECT_EQ(ExportJob(*client, job->name()), reference_adapter);
}

// Paused while another job trains; its slot serves a third job meanwhile.
// Its co-batches differ from those of a run alone (rows regroup, which
// changes rounding only), so both servers compute in fp64 and its adapter
// equals the run alone within kFp64IdentityBound.
TEST(ServicePauseTest, PausedJobsSlotServesAnotherAndItResumesExactly) {
  const std::string jsonl = ReversalJsonl(30, 4);
  constexpr int64_t kSteps = 120;
  // Where the paused job is held (--test-faults=hold) until the pause
  // reaches the trainer: its stored step lags the trainer's (step reports
  // wait for the checkpoint groups queued before them), so without the
  // hold a slow checkpoint writer lets it finish before the pause arrives.
  constexpr int64_t kPauseAt = 10;
  const v1::CreateJobRequest request_a =
      JobRequest("", v1::OPTIMIZER_FAMILY_ADAMW, 8, kSteps, 11);
  auto with_dataset = [](v1::CreateJobRequest request,
                         const std::string& dataset) {
    request.set_training_dataset(dataset);
    return request;
  };
  std::map<std::string, std::string> alone;
  {
    auto server = StartServer(FreshTestDir("alone"), 1, {"--dtype=float64"});
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    auto dataset = client->UploadDatasetContents(jsonl, "d");
    ASSERT_TRUE(dataset.ok());
    auto job = client->CreateJob(with_dataset(request_a, dataset->name()));
    ASSERT_TRUE(job.ok());
    ASSERT_EQ(WaitForJob(*client, job->name())->status(),
              v1::JOB_STATUS_SUCCEEDED);
    alone = ExportJob(*client, job->name());
  }

  const std::string state = FreshTestDir("state");
  auto server =
      StartServer(state, 2,
                  {"--checkpoint-interval=4", "--dtype=float64",
                   absl::StrCat("--test-faults=hold:seed=11,step=", kPauseAt)});
  ASSERT_NE(server, nullptr);
  // The pause waits for the checkpoint writes queued before its own, which
  // on a loaded machine can take longer than the default 30 s.
  ClientOptions options;
  options.address = server->address();
  options.timeout = absl::Seconds(120);
  auto connected = LoraplexClient::Connect(options);
  ASSERT_TRUE(connected.ok()) << connected.status();
  std::unique_ptr<LoraplexClient> client = *std::move(connected);
  auto dataset = client->UploadDatasetContents(jsonl, "d");
  ASSERT_TRUE(dataset.ok());
  auto paused = client->CreateJob(with_dataset(request_a, dataset->name()));
  ASSERT_TRUE(paused.ok());
  // No checkpoints of its own (0 would take the server's 4): while the
  // paused job is held, the other trains alone and would queue a
  // checkpoint every 4 steps ahead of the pause's.
  v1::CreateJobRequest request_other =
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_MUON, 16, 1000000, 12);
  request_other.mutable_training()->set_checkpoint_interval(1000000);
  auto other = client->CreateJob(request_other);
  ASSERT_TRUE(other.ok());
  auto running = WaitUntil(*client, paused->name(), [](const v1::Job& job) {
    return job.metrics().step() >= kPauseAt ||
           (job.status() != v1::JOB_STATUS_RUNNING &&
            job.status() != v1::JOB_STATUS_QUEUED);
  });
  ASSERT_TRUE(running.ok());
  ASSERT_EQ(running->status(), v1::JOB_STATUS_RUNNING);
  ASSERT_EQ(running->metrics().step(), kPauseAt);  // Held there.
  const int slot = running->slot();
  auto job = client->PauseJob(paused->name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->status(), v1::JOB_STATUS_PAUSED);
  const int64_t step = job->metrics().step();
  ASSERT_EQ(step, kPauseAt);

  auto between = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAM, 4, 5, 13));
  ASSERT_TRUE(between.ok());
  ASSERT_EQ(WaitForJob(*client, between->name())->status(),
            v1::JOB_STATUS_SUCCEEDED);
  EXPECT_THAT(LastRun(*client, between->name()).running_message,
              HasSubstr(absl::StrCat("in slot ", slot)));

  ASSERT_TRUE(client->ResumeJob(paused->name()).ok());
  auto done = WaitForJob(*client, paused->name());
  ASSERT_TRUE(done.ok());
  ASSERT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED);
  const RunLosses after = LastRun(*client, paused->name());
  EXPECT_EQ(after.loss.begin()->first, step + 1);
  EXPECT_EQ(after.loss.rbegin()->first, kSteps);
  ASSERT_TRUE(client->CancelJob(other->name()).ok());

  // Compared as tensors: the files differ in their last bits.
  auto tensors = [&](const std::map<std::string, std::string>& files) {
    const std::string dir = FreshTestDir("adapter");
    std::ofstream(dir + "/adapter_config.json") << files.at("config");
    std::ofstream(dir + "/adapter_model.safetensors", std::ios::binary)
        << files.at("weights");
    auto config = LoadModelConfig(state + "/models/tiny");
    EXPECT_TRUE(config.ok());
    auto adapter = LoadPeftAdapter(dir, *config);
    EXPECT_TRUE(adapter.ok()) << adapter.status();
    return adapter.ok() ? AdapterTensors(*adapter)
                        : std::vector<torch::Tensor>{};
  };
  const std::vector<torch::Tensor> actual =
      tensors(ExportJob(*client, paused->name()));
  const std::vector<torch::Tensor> expected = tensors(alone);
  ExpectFp64Identity(actual, expected, "paused job");
}

TEST(ServicePauseTest, CheckpointsAreListedExportedAndContinuedFrom) {
  const std::string state = FreshTestDir("state");
  // Its checkpoints kept past its end, to continue from.
  auto server = StartServer(state, 1,
                            {"--checkpoint-interval=5", "--keep-checkpoints=2",
                             "--keep-finished-checkpoints=2"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(20, 6), "d");
  ASSERT_TRUE(dataset.ok());
  auto job = client->CreateJob(Job(dataset->name(), 22));
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(WaitForJob(*client, job->name())->status(),
            v1::JOB_STATUS_SUCCEEDED);
  const RunLosses run = LastRun(*client, job->name());

  // Every 5 steps, the newest two kept.
  auto checkpoints = client->ListCheckpoints(job->name());
  ASSERT_TRUE(checkpoints.ok());
  ASSERT_EQ(checkpoints->checkpoints_size(), 2);
  EXPECT_EQ(checkpoints->checkpoints(0).step(), 15);
  EXPECT_EQ(checkpoints->checkpoints(1).step(), 20);
  for (const v1::Checkpoint& checkpoint : checkpoints->checkpoints()) {
    EXPECT_EQ(checkpoint.metrics().step(), checkpoint.step());
    EXPECT_EQ(checkpoint.metrics().loss(), run.loss.at(checkpoint.step()));
  }

  // Exported as the PEFT files it holds.
  const std::string name = absl::StrCat(job->name(), "/checkpoints/20");
  v1::ExportAdapterRequest request;
  request.set_checkpoint(name);
  const auto exported = Export(*client, request);
  const std::string dir = CheckpointPath(state, job->name(), 20);
  EXPECT_EQ(exported.at("config"),
            AdapterConfigWithoutBase(dir + "/adapter_config.json"));
  EXPECT_EQ(exported.at("weights"),
            ReadFileForTest(dir + "/adapter_model.safetensors"));
  EXPECT_NE(exported, ExportJob(*client, job->name()));  // Step 22's.

  // A new job continues from it, with another optimizer.
  v1::CreateJobRequest next =
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 3, 9);
  next.set_initial_checkpoint(name);
  auto continued = client->CreateJob(next);
  ASSERT_TRUE(continued.ok()) << continued.status();
  ASSERT_FALSE(continued->initial_adapter().empty());
  EXPECT_EQ(continued->lora().rank(), 8);  // The checkpoint's adapter's.
  auto stored = client->GetAdapter(continued->initial_adapter());
  ASSERT_TRUE(stored.ok());
  EXPECT_THAT(stored->display_name(), HasSubstr("step 20 of job"));
  v1::ExportAdapterRequest of_stored;
  of_stored.set_adapter(continued->initial_adapter());
  EXPECT_EQ(Export(*client, of_stored), exported);
  EXPECT_EQ(WaitForJob(*client, continued->name())->status(),
            v1::JOB_STATUS_SUCCEEDED);

  // Errors name the field and the reason.
  request.set_checkpoint(absl::StrCat(job->name(), "/checkpoints/5"));
  auto pruned = client->ExportAdapter(request, FreshTestDir("x"));
  EXPECT_EQ(pruned.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(pruned.status().message(), HasSubstr("no checkpoint at step 5"));
  request.set_checkpoint(absl::StrCat(job->name(), "/steps/5"));
  auto malformed = client->ExportAdapter(request, FreshTestDir("x"));
  EXPECT_EQ(malformed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(malformed.status().message(),
              HasSubstr("checkpoint must be a name like"));
  next.set_initial_adapter(continued->initial_adapter());
  auto both = client->CreateJob(next);
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(both.status().message(), HasSubstr("not both"));
  EXPECT_EQ(client->ListCheckpoints("jobs/job-unknown").status().code(),
            absl::StatusCode::kNotFound);
  auto finished = client->PauseJob(job->name());
  EXPECT_EQ(finished.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(finished.status().message(), HasSubstr("already finished"));
  EXPECT_EQ(client->ResumeJob(job->name()).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // A damaged checkpoint is neither exported nor continued from.
  {
    std::fstream file(dir + "/adapter_model.safetensors",
                      std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(-3, std::ios::end);
    file.put('\x55');
  }
  request.set_checkpoint(name);
  auto damaged = client->ExportAdapter(request, FreshTestDir("x"));
  EXPECT_EQ(damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(damaged.status().message(),
              HasSubstr("checkpoint: the checkpoint is damaged"));
  next.clear_initial_adapter();
  auto from_damaged = client->CreateJob(next);
  EXPECT_EQ(from_damaged.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(from_damaged.status().message(),
              HasSubstr("initial_checkpoint: the checkpoint is damaged"));
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

TEST(ServicePauseTest, QueuedJobsPauseAtOnceAndPausedJobsCancel) {
  auto server = StartServer(FreshTestDir("state"), 1);
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(10, 1), "d");
  ASSERT_TRUE(dataset.ok());
  auto running = client->CreateJob(Job(dataset->name(), 1000000));
  auto queued = client->CreateJob(Job(dataset->name(), 5));
  ASSERT_TRUE(running.ok() && queued.ok());
  auto paused = client->PauseJob(queued->name());
  ASSERT_TRUE(paused.ok()) << paused.status();
  EXPECT_EQ(paused->status(), v1::JOB_STATUS_PAUSED);
  auto again = client->PauseJob(queued->name());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("already paused"));
  auto not_paused = client->ResumeJob(running->name());
  EXPECT_EQ(not_paused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(not_paused.status().message(), HasSubstr("not PAUSED"));
  EXPECT_EQ(client->PauseJob("jobs/nope").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(client->PauseJob("nope").status().code(),
            absl::StatusCode::kInvalidArgument);

  auto cancelled = client->CancelJob(queued->name());
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->status(), v1::JOB_STATUS_CANCELLED);
  ASSERT_TRUE(WaitUntil(*client, running->name(), [](const v1::Job& job) {
                return job.metrics().step() >= 2;
              }).ok());
  ASSERT_EQ(client->PauseJob(running->name())->status(), v1::JOB_STATUS_PAUSED);
  EXPECT_EQ(client->CancelJob(running->name())->status(),
            v1::JOB_STATUS_CANCELLED);
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// Checkpoints that cannot be written (here the checkpoints directory is a
// file) are logged; the job keeps training, a pause is refused with the
// reason, and the server carries on.
TEST(ServicePauseTest, UnwritableCheckpointsKeepTheJobTraining) {
  const std::string state = FreshTestDir("state");
  std::ofstream(state + "/checkpoints") << "not a directory";
  auto server = StartServer(state, 1, {"--checkpoint-interval=2"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(10, 1), "d");
  ASSERT_TRUE(dataset.ok());
  auto job = client->CreateJob(Job(dataset->name(), 1000000));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(WaitUntil(*client, job->name(), [](const v1::Job& job) {
                return job.metrics().step() >= 7;
              }).ok());
  auto paused = client->PauseJob(job->name());
  EXPECT_EQ(paused.status().code(), absl::StatusCode::kInternal);
  EXPECT_THAT(paused.status().message(), HasSubstr("was not paused"));
  EXPECT_THAT(paused.status().message(),
              HasSubstr("cannot create checkpoint directory"));
  const int64_t step = client->GetJob(job->name())->metrics().step();
  auto later = WaitUntil(*client, job->name(), [&](const v1::Job& job) {
    return job.metrics().step() >= step + 3;
  });
  ASSERT_TRUE(later.ok());
  EXPECT_EQ(later->status(), v1::JOB_STATUS_RUNNING);
  auto checkpoints = client->ListCheckpoints(job->name());
  ASSERT_TRUE(checkpoints.ok());
  EXPECT_EQ(checkpoints->checkpoints_size(), 0);
  ASSERT_TRUE(client->CancelJob(job->name()).ok());
  EXPECT_TRUE(server->Stop().ok());
  EXPECT_THAT(server->Log(),
              HasSubstr("failed; the job keeps its previous checkpoint and "
                        "trains on"));
}

}  // namespace
}  // namespace loraplex
