// The real loraplex-server run data parallel over two and three processes
// (Gloo on 127.0.0.1): rank 0 serves the API and every rank trains. Jobs
// submitted over gRPC train to the weights one process gives; checkpoints
// move between 2 ranks and 1; a rank that dies, never comes or loads
// another model stops the run with a clear error, and nothing stored is
// lost.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/model/model_config.h"
#include "core/model/model_presets.h"
#include "tests/common/test_dir.h"
#include "tests/server/rank_servers.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

// One job's outcome: its last run's losses and its adapter's tensors.
struct JobOutcome {
  RunLosses run;
  std::vector<torch::Tensor> weights;
};

std::vector<torch::Tensor> ExportedTensors(LoraplexClient& client,
                                           const std::string& job,
                                           const std::string& state) {
  const std::string dir = FreshTestDir("export");
  v1::ExportAdapterRequest request;
  request.set_job(job);
  auto files = client.ExportAdapter(request, dir);
  EXPECT_TRUE(files.ok()) << files.status();
  auto config = LoadModelConfig(state + "/models/tiny");
  EXPECT_TRUE(config.ok()) << config.status();
  if (!files.ok() || !config.ok()) return {};
  auto adapter = LoadPeftAdapter(dir, *config);
  EXPECT_TRUE(adapter.ok()) << adapter.status();
  return adapter.ok() ? AdapterTensors(*adapter) : std::vector<torch::Tensor>{};
}

class ServiceDistTest : public ::testing::Test {
 protected:
  // Three jobs created on a one-slot server with checkpoints off that is
  // killed at once, so every run below starts them from step 0 as a
  // restart recovers them. With two slots, the third attaches when the
  // first (the shortest) is done: mid-run.
  static void SetUpTestSuite() {
    stage_ = new std::string(FreshTestDir("stage"));
    jobs_ = new std::vector<std::string>();
    std::vector<v1::CreateJobRequest> requests = {
        JobRequest("", v1::OPTIMIZER_FAMILY_ADAMW, 8, 12, 1),
        JobRequest("", v1::OPTIMIZER_FAMILY_MUON, 16, 30, 2),
        JobRequest("", v1::OPTIMIZER_FAMILY_ADAM, 4, 24, 3)};
    requests[0].mutable_lora()->set_dropout(0.1);
    // The staging server's one extra flag holds the first job (seed 1)
    // after its first step, so it cannot finish before the server is
    // killed (the hold is single-process, as the staging server is).
    const StagedJobs staged = StageJobs(*stage_, ReversalJsonl(40, 9), requests,
                                        "--test-faults=hold:seed=1,step=1");
    ASSERT_EQ(staged.jobs.size(), 3u);
    *jobs_ = staged.jobs;
    dataset_ = new std::string(staged.dataset);
    // The reference: one process.
    const std::string dir = FreshRun("one-rank");
    auto reference = StartServer(dir, 2, Flags("6"));
    ASSERT_NE(reference, nullptr);
    auto reference_client = ClientFor(*reference);
    reference_ = new std::map<std::string, JobOutcome>(
        Collect(*reference_client, dir, reference->Log()));
    // The adapter the next runs evaluate and continue from.
    adapter_dir_ = new std::string(FreshTestDir("adapter"));
    v1::ExportAdapterRequest request;
    request.set_job(jobs_->at(1));
    ASSERT_TRUE(reference_client->ExportAdapter(request, *adapter_dir_).ok());
    reference_continued_ = new Continued(Continue(*reference_client, dir));
    reference_sampled_ =
        new std::vector<v1::SampleResponse>(SampleJobs(*reference_client));
    EXPECT_TRUE(reference->Stop().ok());
  }

  static void TearDownTestSuite() {
    delete stage_;
    delete jobs_;
    delete reference_;
    delete dataset_;
    delete adapter_dir_;
    delete reference_continued_;
    delete reference_sampled_;
  }

  // Greedy samples with their logprobs and the prompt's, from the base and
  // from the first job's adapter.
  static std::vector<v1::SampleResponse> SampleJobs(LoraplexClient& client) {
    std::vector<v1::SampleResponse> responses;
    for (const std::string& job : {std::string(), jobs_->at(0)}) {
      v1::SampleRequest request;
      if (!job.empty()) request.set_job(job);
      for (int64_t id : {5, 9, 14, 3, 7}) {
        request.mutable_tokens()->add_ids(id);
      }
      request.set_max_tokens(6);
      request.set_temperature(0);
      request.set_ignore_eos(true);
      request.set_prompt_logprobs(true);
      auto response = client.Sample(request);
      EXPECT_TRUE(response.ok()) << response.status();
      if (response.ok()) responses.push_back(*response);
    }
    return responses;
  }

  // Each sample's tokens equal the one-process server's; its logprobs and
  // the prompt's equal them up to fp64 rounding.
  static void ExpectSamplesLikeOneRank(
      const std::vector<v1::SampleResponse>& sampled) {
    ASSERT_EQ(sampled.size(), reference_sampled_->size());
    for (size_t i = 0; i < sampled.size(); ++i) {
      const v1::SampleResponse& expected = reference_sampled_->at(i);
      ASSERT_EQ(sampled[i].samples_size(), 1);
      const v1::Sample& sample = sampled[i].samples(0);
      EXPECT_THAT(sample.tokens(),
                  ::testing::ElementsAreArray(expected.samples(0).tokens()));
      ASSERT_EQ(sample.logprobs_size(), expected.samples(0).logprobs_size());
      for (int t = 0; t < sample.logprobs_size(); ++t) {
        EXPECT_NEAR(sample.logprobs(t), expected.samples(0).logprobs(t),
                    kFp64IdentityBound);
      }
      ASSERT_EQ(sampled[i].prompt_logprobs_size(),
                expected.prompt_logprobs_size());
      ASSERT_GT(expected.prompt_logprobs_size(), 0);
      for (int t = 0; t < expected.prompt_logprobs_size(); ++t) {
        EXPECT_NEAR(sampled[i].prompt_logprobs(t), expected.prompt_logprobs(t),
                    kFp64IdentityBound);
      }
    }
  }

  // An uploaded adapter evaluated, then continued by a new job (AdamW,
  // 6 steps): both attach with rank 0's weights on every rank.
  struct Continued {
    double validation_loss = 0.0;
    std::vector<torch::Tensor> weights;
  };

  static Continued Continue(LoraplexClient& client, const std::string& state) {
    Continued continued;
    v1::AttachAdapterRequest attach;
    attach.mutable_files()->set_adapter_config_json(
        ReadFileForTest(*adapter_dir_ + "/adapter_config.json"));
    attach.mutable_files()->set_adapter_model_safetensors(
        ReadFileForTest(*adapter_dir_ + "/adapter_model.safetensors"));
    attach.mutable_job()->set_validation_dataset(*dataset_);
    attach.mutable_job()->mutable_training()->set_seq_len(32);
    auto evaluation = client.AttachAdapter(attach);
    EXPECT_TRUE(evaluation.ok()) << evaluation.status();
    if (!evaluation.ok()) return continued;
    auto evaluated = WaitForJob(client, evaluation->job().name());
    EXPECT_TRUE(evaluated.ok()) << evaluated.status();
    if (!evaluated.ok()) return continued;
    EXPECT_EQ(evaluated->status(), v1::JOB_STATUS_SUCCEEDED)
        << evaluated->error().message();
    continued.validation_loss = evaluated->metrics().validation_loss();

    v1::AttachAdapterRequest more;
    more.set_adapter(evaluation->adapter().name());
    *more.mutable_job() =
        JobRequest(*dataset_, v1::OPTIMIZER_FAMILY_ADAMW, 16, 6, 5);
    auto job = client.AttachAdapter(more);
    EXPECT_TRUE(job.ok()) << job.status();
    if (!job.ok()) return continued;
    auto done = WaitForJob(client, job->job().name());
    EXPECT_TRUE(done.ok() && done->status() == v1::JOB_STATUS_SUCCEEDED);
    continued.weights = ExportedTensors(client, job->job().name(), state);
    return continued;
  }

  static std::string FreshRun(const std::string& name) {
    return CopyOfState(*stage_, name);
  }

  static std::map<std::string, JobOutcome> Collect(LoraplexClient& client,
                                                   const std::string& state,
                                                   const std::string& log) {
    std::map<std::string, JobOutcome> outcome;
    for (const std::string& job : *jobs_) {
      auto done = WaitForJob(client, job);
      EXPECT_TRUE(done.ok()) << done.status() << "\n" << log;
      if (!done.ok()) continue;
      EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
          << done->error().message();
      outcome[job].run = LastRun(client, job);
      outcome[job].weights = ExportedTensors(client, job, state);
    }
    return outcome;
  }

  // Each job's adapter (exported in fp64) equals the one-process run's:
  // the ranks sum their shares of the gradients, so only rounding differs
  // (kFp64IdentityBound), and so do the losses of the steps trained.
  static void ExpectLikeOneRank(const std::map<std::string, JobOutcome>& run) {
    for (const std::string& job : *jobs_) {
      const JobOutcome& expected = reference_->at(job);
      const JobOutcome& actual = run.at(job);
      ExpectFp64Identity(actual.weights, expected.weights, job);
      ASSERT_FALSE(actual.run.loss.empty()) << job;
      for (const auto& [step, loss] : actual.run.loss) {
        EXPECT_NEAR(loss, expected.run.loss.at(step), kFp64IdentityBound * loss)
            << job << " step " << step;
      }
    }
  }

  static size_t RunningEvents(LoraplexClient& client, const std::string& job) {
    auto events = client.ListAllJobEvents(job);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return 0;
    size_t runs = 0;
    for (const v1::JobEvent& event : *events) {
      runs += event.has_status_change() &&
              event.status_change().status() == v1::JOB_STATUS_RUNNING;
    }
    return runs;
  }

  // Waits until the second job has trained `step` steps.
  static void WaitForStep(LoraplexClient& client, int64_t step) {
    auto job = WaitUntil(client, jobs_->at(1), [&](const v1::Job& job) {
      return job.metrics().step() >= step;
    });
    ASSERT_TRUE(job.ok()) << job.status();
  }

  static std::string* stage_;
  static std::vector<std::string>* jobs_;
  static std::map<std::string, JobOutcome>* reference_;
  static std::string* dataset_;
  static std::string* adapter_dir_;
  static Continued* reference_continued_;
  static std::vector<v1::SampleResponse>* reference_sampled_;
};

std::string* ServiceDistTest::stage_ = nullptr;
std::vector<std::string>* ServiceDistTest::jobs_ = nullptr;
std::map<std::string, JobOutcome>* ServiceDistTest::reference_ = nullptr;
std::string* ServiceDistTest::dataset_ = nullptr;
std::string* ServiceDistTest::adapter_dir_ = nullptr;
ServiceDistTest::Continued* ServiceDistTest::reference_continued_ = nullptr;
std::vector<v1::SampleResponse>* ServiceDistTest::reference_sampled_ = nullptr;

TEST_F(ServiceDistTest, JobsOverGrpcTrainOnTwoAndThreeRanksAsOnOne) {
  for (int world : {2, 3}) {
    SCOPED_TRACE(absl::StrCat(world, " ranks"));
    const std::string state = FreshRun(absl::StrCat(world, "-ranks"));
    Ranks ranks = StartRanks(state, world, 2, Flags("6"));
    ASSERT_NE(ranks.server, nullptr);
    auto client = ClientFor(*ranks.server);
    ExpectLikeOneRank(Collect(*client, state, ranks.server->Log()));
    EXPECT_THAT(
        ranks.server->Log(),
        HasSubstr(absl::StrCat("data parallel over ", world, " ranks")));

    // Rank 0 evaluates alone: the same weights give the same loss, bit for
    // bit. Training from them needs them on every rank.
    const Continued continued = Continue(*client, state);
    EXPECT_EQ(continued.validation_loss, reference_continued_->validation_loss);
    EXPECT_GT(continued.validation_loss, 0.0);
    ExpectFp64Identity(continued.weights, reference_continued_->weights,
                       "continued");
    // A clean stop of rank 0 stops the other ranks too.
    EXPECT_TRUE(ranks.server->Stop().ok());
    for (auto& follower : ranks.followers) {
      EXPECT_EQ(follower->Wait(30), 0) << follower->Log();
      EXPECT_THAT(follower->Log(), HasSubstr("rank 0 stopped"));
    }
  }
}

// With --shard-base each rank keeps half of every layer and gathers it
// before it runs: jobs train to the one-process weights, and rank 0's
// evaluation and sampling (the other rank gathering with it) give the
// one-process results.
TEST_F(ServiceDistTest, ShardedBaseTrainsEvaluatesAndSamplesAsOneProcess) {
  const std::string state = FreshRun("sharded");
  std::vector<std::string> flags = Flags("6");
  flags.push_back("--shard-base");
  Ranks ranks = StartRanks(state, 2, 2, flags);
  ASSERT_NE(ranks.server, nullptr);
  auto client = ClientFor(*ranks.server);
  ExpectLikeOneRank(Collect(*client, state, ranks.server->Log()));
  EXPECT_THAT(ranks.server->Log(),
              HasSubstr("rank 0: the base is sharded over 2 ranks"));
  EXPECT_THAT(ranks.follower().Log(),
              HasSubstr("rank 1: the base is sharded over 2 ranks"));

  const Continued continued = Continue(*client, state);
  EXPECT_EQ(continued.validation_loss, reference_continued_->validation_loss);
  ExpectFp64Identity(continued.weights, reference_continued_->weights,
                     "continued");
  ExpectSamplesLikeOneRank(SampleJobs(*client));
  EXPECT_TRUE(ranks.server->Stop().ok());
  EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
}

// Rank 0 of a sharded run is killed (SIGKILL) mid-job: nothing is lost.
// Restarted sharded on the same state dir, the jobs resume from their
// checkpoints and end with the one-process weights.
TEST_F(ServiceDistTest, ShardedRanksKilledMidJobResumeAsOneProcess) {
  const std::string state = FreshRun("sharded-killed");
  std::vector<std::string> flags = Flags("4");
  flags.push_back("--shard-base");
  {
    Ranks ranks = StartRanks(state, 2, 2, flags, /*timeout_seconds=*/20);
    ASSERT_NE(ranks.server, nullptr);
    WaitForStep(*ClientFor(*ranks.server), 9);
    ranks.server->Kill();
    EXPECT_NE(ranks.follower().Wait(60), 0) << ranks.follower().Log();
  }
  Ranks ranks = StartRanks(state, 2, 2, flags);
  ASSERT_NE(ranks.server, nullptr);
  auto client = ClientFor(*ranks.server);
  const std::map<std::string, JobOutcome> run =
      Collect(*client, state, ranks.server->Log());
  ExpectLikeOneRank(run);
  EXPECT_THAT(run.at(jobs_->at(1)).run.running_message,
              HasSubstr("resumed from the checkpoint at step"));
  EXPECT_TRUE(ranks.server->Stop().ok());
  EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
}

// The second job is paused (a checkpoint gathered from the owners of its
// optimizer state), the server stopped, and the job resumed on a server of
// the other size. One process holds the job at step 7
// (--test-faults=hold) until the pause arrives. Two ranks do not (the hold
// is single-process): on a loaded machine the job may finish before the
// pause arrives, and that run is taken again. Its 30 steps are not raised
// instead: over many more, Muon's rounding drifts past kFp64IdentityBound.
TEST_F(ServiceDistTest, CheckpointOfTwoRanksResumesOnOneAndBack) {
  // The step paused at; -1 when the job finished first.
  auto pause = [](LoraplexClient& client) -> int64_t {
    WaitForStep(client, 7);
    auto paused = client.PauseJob(jobs_->at(1));
    // Finished first: refused as finished, or answered in its final status.
    if (!paused.ok()) {
      EXPECT_THAT(std::string(paused.status().message()),
                  HasSubstr("already finished"))
          << paused.status();
      return -1;
    }
    if (paused->status() != v1::JOB_STATUS_PAUSED) return -1;
    return paused->metrics().step();
  };
  auto resume = [](LoraplexClient& client, const std::string& state,
                   const std::string& log, int64_t step) {
    ASSERT_TRUE(client.ResumeJob(jobs_->at(1)).ok());
    const std::map<std::string, JobOutcome> run = Collect(client, state, log);
    EXPECT_THAT(
        run.at(jobs_->at(1)).run.running_message,
        HasSubstr(absl::StrCat("resumed from the checkpoint at step ", step)));
    ExpectLikeOneRank(run);
  };
  std::string state;
  int64_t step = -1;
  for (int attempt = 0; attempt < 3 && step < 0; ++attempt) {
    state = FreshRun("two-then-one");
    Ranks ranks = StartRanks(state, 2, 2, Flags("0"));
    ASSERT_NE(ranks.server, nullptr);
    step = pause(*ClientFor(*ranks.server));
    ASSERT_TRUE(ranks.server->Stop().ok());
    EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
  }
  ASSERT_GE(step, 0) << "the job finished before every pause";
  {
    auto server = StartServer(state, 2, Flags("0"));
    ASSERT_NE(server, nullptr);
    resume(*ClientFor(*server), state, server->Log(), step);
  }

  const std::string back = FreshRun("one-then-two");
  {
    std::vector<std::string> flags = Flags("0");
    flags.push_back("--test-faults=hold:seed=2,step=7");
    auto server = StartServer(back, 2, flags);
    ASSERT_NE(server, nullptr);
    step = pause(*ClientFor(*server));
    ASSERT_TRUE(server->Stop().ok());
  }
  ASSERT_EQ(step, 7);  // Held there.
  Ranks ranks = StartRanks(back, 2, 2, Flags("0"));
  ASSERT_NE(ranks.server, nullptr);
  resume(*ClientFor(*ranks.server), back, ranks.server->Log(), step);
  EXPECT_TRUE(ranks.server->Stop().ok());
}

// The second job is running when rank 1 is killed, but on a loaded machine
// it may finish in the moment before the kill: it then does not run again
// after the restart, while the third job (attached later) does.
TEST_F(ServiceDistTest, DeadRankStopsRankZeroAndTheJobsResumeAfterARestart) {
  const std::string state = FreshRun("dead-rank");
  size_t runs_before_kill = 0;  // The second job's RUNNING events.
  {
    Ranks ranks = StartRanks(state, 2, 2, Flags("4"), /*timeout=*/20);
    ASSERT_NE(ranks.server, nullptr);
    auto client = ClientFor(*ranks.server);
    WaitForStep(*client, 9);
    runs_before_kill = RunningEvents(*client, jobs_->at(1));
    ranks.follower().Kill();
    // Rank 0 notices at its next collective, well within the timeout.
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(40);
    while (client->ListSlots().ok() &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const absl::Status stopped = ranks.server->Stop();
    EXPECT_THAT(std::string(stopped.message()), HasSubstr("status 1"));
    const std::string log = ranks.server->Log();
    EXPECT_THAT(log, HasSubstr("training stopped: "));
    EXPECT_THAT(log, HasSubstr("Restart every rank"));
    EXPECT_THAT(log, HasSubstr("stopped after a failure"));
  }
  // No job failed: a restart resumes them from their checkpoints.
  auto server = StartServer(state, 2, Flags("4"));
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  const std::map<std::string, JobOutcome> run =
      Collect(*client, state, server->Log());
  if (RunningEvents(*client, jobs_->at(1)) > runs_before_kill) {
    EXPECT_THAT(run.at(jobs_->at(1)).run.running_message,
                HasSubstr("resumed from the checkpoint at step"));
  }
  int resumed = 0;
  for (const auto& [job, outcome] : run) {
    EXPECT_FALSE(outcome.weights.empty()) << job;
    resumed += absl::StrContains(outcome.run.running_message,
                                 "resumed from the checkpoint at step");
  }
  EXPECT_GE(resumed, 1) << server->Log();
}

// Test faults (--test-faults) on rank 1 only: the ranks agree on every
// step's outcome, so a job whose step fails on one rank fails alone, on
// every rank, while the others train on.
TEST(ServiceDistFaultTest, ForwardFaultOnOneRankFailsOnlyItsJob) {
  const std::string state = FreshTestDir("state");
  std::vector<std::string> flags = Flags("0");
  flags.push_back("--test-faults=forward:rank=1,seed=702");
  Ranks ranks = StartRanks(state, 2, 2, flags);
  ASSERT_NE(ranks.server, nullptr);
  auto client = ClientFor(*ranks.server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto healthy = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 6, 1));
  auto faulty = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 6, 702));
  ASSERT_TRUE(healthy.ok() && faulty.ok());
  auto failed = WaitForJob(*client, faulty->name());
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_EQ(failed->status(), v1::JOB_STATUS_FAILED);
  EXPECT_THAT(failed->error().message(), HasSubstr("failed on another rank"));
  auto done = WaitForJob(*client, healthy->name());
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
      << done->error().message() << "\n"
      << ranks.server->Log();
  EXPECT_EQ(done->metrics().step(), 6);
  EXPECT_TRUE(ranks.server->Stop().ok()) << ranks.server->Log();
  EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
}

// A rank whose optimizer step fails after the gradient sum has left the
// ranks' weights apart: every rank stops (rank 0 does not hang in a
// collective, nor in shutdown), calls are refused, and nothing stored is
// lost: a restart resumes the job.
TEST(ServiceDistFaultTest, FailureAfterTheSumStopsEveryRankPromptly) {
  const std::string state = FreshTestDir("state");
  std::vector<std::string> flags = Flags("2");
  std::vector<std::string> follower = {
      "--test-faults=optimizer:rank=1,seed=703"};
  std::string job;
  {
    Ranks ranks =
        StartRanks(state, 2, 2, flags, /*timeout_seconds=*/20, follower);
    ASSERT_NE(ranks.server, nullptr);
    auto client = ClientFor(*ranks.server);
    auto dataset = client->UploadDatasetContents(ReversalJsonl(16, 1), "d");
    ASSERT_TRUE(dataset.ok()) << dataset.status();
    auto created = client->CreateJob(
        JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAMW, 4, 6, 703));
    ASSERT_TRUE(created.ok()) << created.status();
    job = created->name();
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (ranks.server->Log().find("stopped after a failure") ==
               std::string::npos &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    const absl::Status stopped = ranks.server->Stop();
    EXPECT_THAT(std::string(stopped.message()), HasSubstr("status 1"));
    EXPECT_THAT(ranks.server->Log(), HasSubstr("training stopped: "));
    EXPECT_NE(ranks.follower().Wait(30), 0);
    EXPECT_THAT(ranks.follower().Log(), HasSubstr("after the gradient sum"));
  }
  // On one rank without the fault the job resumes and finishes.
  auto server = StartServer(state, 2, Flags("2"));
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  auto done = WaitForJob(*client, job);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
      << done->error().message();
  EXPECT_TRUE(server->Stop().ok()) << server->Log();
}

// An idle rank 0 keeps the other ranks from timing out: with a 15 s
// timeout (room for a loaded machine's pauses, with other multi-process
// tests beside it, while the job trains), a server left idle for 35 s,
// over twice the timeout, still trains a job.
TEST(ServiceDistStartTest, IdleServerOutlivesTheCollectiveTimeout) {
  const std::string state = FreshTestDir("idle");
  Ranks ranks = StartRanks(state, 2, 1, Flags("0"), /*timeout_seconds=*/15);
  ASSERT_NE(ranks.server, nullptr);
  std::this_thread::sleep_for(std::chrono::seconds(35));
  auto client = ClientFor(*ranks.server);
  auto dataset = client->UploadDatasetContents(ReversalJsonl(10, 2), "d");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  auto job = client->CreateJob(
      JobRequest(dataset->name(), v1::OPTIMIZER_FAMILY_ADAM, 4, 4, 1));
  ASSERT_TRUE(job.ok()) << job.status();
  auto done = WaitForJob(*client, job->name(), 60);
  ASSERT_TRUE(done.ok()) << done.status() << "\n" << ranks.server->Log();
  EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
      << ranks.server->Log() << "\nrank 1:\n"
      << ranks.follower().Log();
  EXPECT_TRUE(ranks.server->Stop().ok());
  EXPECT_EQ(ranks.follower().Wait(30), 0) << ranks.follower().Log();
}

TEST(ServiceDistStartTest, RankThatNeverJoinsFailsTheStartWithinTheTimeout) {
  const std::string state = FreshTestDir("alone");
  ServerProcessOptions options;
  options.state_dir = state;
  options.binary = RankScript(state, 0, 2, FreePort(), /*timeout_seconds=*/3);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
  const std::string log = ReadFileForTest(state + "/server.log");
  EXPECT_THAT(log, HasSubstr("rank 0 of 2: waiting for the other ranks"));
  EXPECT_THAT(log, HasSubstr("1 of 2 ranks"));
}

TEST(ServiceDistStartTest, ShardBaseWithoutRanksIsRefusedNamingTheFlag) {
  ServerProcessOptions options;
  options.state_dir = FreshTestDir("shard-alone");
  options.extra_args = {"--shard-base"};
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(options);
  ASSERT_FALSE(server.ok());
  EXPECT_THAT(ReadFileForTest(options.state_dir + "/server.log"),
              HasSubstr("--shard-base shards the base over the ranks"));
}

// Rank 0 on the built-in model and rank 1 on `preset` written with `seed`,
// both with `flags`: neither serves, and their logs say why.
void ExpectAnotherModelStopsEveryRank(const std::string& preset, int seed,
                                      const std::vector<std::string>& flags,
                                      const std::string& rank0_says,
                                      const std::string& rank1_says) {
  const std::string state = FreshTestDir("models");
  const std::string other = state + "/other-model";
  ASSERT_TRUE(WritePresetModel(preset, seed, other).ok());
  Ranks ranks = StartRanks(state, 2, 4, flags, 30, {"--model", other},
                           /*expect_serving=*/false);
  ASSERT_EQ(ranks.server, nullptr);
  EXPECT_THAT(ReadFileForTest(state + "/server.log"), HasSubstr(rank0_says));
  EXPECT_NE(ranks.follower().Wait(30), 0);
  EXPECT_THAT(ranks.follower().Log(), HasSubstr(rank1_says));
}

// Sharded, rank 1's half of every layer comes from another checkpoint: the
// gathered layers differ from each rank's own files, and every rank stops.
TEST(ServiceDistStartTest, ShardedRankWithAnotherModelStopsEveryRank) {
  ExpectAnotherModelStopsEveryRank("tiny", 1, {"--shard-base"},
                                   "differ from this rank's --model",
                                   "differ from this rank's --model");
}

// Sharded, rank 1 loads another architecture: the ranks agree on the
// layers' shapes before any gather (which would pair tensors of other
// sizes), and every rank stops saying why.
TEST(ServiceDistStartTest, ShardedRankWithAnotherArchitectureStopsEveryRank) {
  ExpectAnotherModelStopsEveryRank(
      "small", 0, {"--shard-base"},
      "1 rank(s) loaded another base model than rank 0",
      "its config, dtype or layers differ");
}

TEST(ServiceDistStartTest, RankWithAnotherModelStopsEveryRank) {
  ExpectAnotherModelStopsEveryRank(
      "tiny", 1, {}, "1 rank(s) loaded another base model than rank 0",
      "rank 1 loaded another base model than rank 0");
}

}  // namespace
}  // namespace loraplex
