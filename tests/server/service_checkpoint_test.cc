// A killed server resumes every job from its checkpoint bit-exactly; a
// damaged newest checkpoint falls back to the previous one; pause and
// resume continue the run; checkpoints are listed, exported and continued
// from. All through the real loraplex-server and client.
//
// Bit-exact means: the same co-batches as the uninterrupted run. A slot's
// result depends on which slots share its steps (rows regroup, so float
// rounding changes, by ~1e-6), so the jobs of these tests start together:
// they are created on a server with one slot and checkpoints off, which is
// killed at once (no checkpoint exists, nothing finished); every run then
// starts from a copy of that state dir, where the recovery attaches all
// four (AdamW, Muon, Adam, SOAP) at the same step boundary, from step 0.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>

#include "absl/strings/match.h"
#include "core/model/model_presets.h"
#include "tests/common/test_dir.h"
#include "tests/server/service_fixture.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kSteps = 36;
constexpr int kInterval = 6;

// The job's adapter files, exported (name -> bytes).
std::map<std::string, std::string> ExportedFiles(
    LoraplexClient& client, v1::ExportAdapterRequest request) {
  const std::string dir = FreshTestDir("export");
  auto files = client.ExportAdapter(request, dir);
  EXPECT_TRUE(files.ok()) << files.status();
  std::map<std::string, std::string> bytes;
  bytes["adapter_config.json"] =
      AdapterConfigWithoutBase(dir + "/adapter_config.json");
  bytes["adapter_model.safetensors"] =
      ReadFileForTest(dir + "/adapter_model.safetensors");
  return bytes;
}

std::map<std::string, std::string> JobAdapter(LoraplexClient& client,
                                              const std::string& job) {
  v1::ExportAdapterRequest request;
  request.set_job(job);
  return ExportedFiles(client, request);
}

// What an uninterrupted run produced, per job.
struct Outcome {
  std::map<std::string, RunLosses> runs;
  std::map<std::string, std::map<std::string, std::string>> adapters;
};

class ServiceCheckpointTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::vector<v1::CreateJobRequest> requests = {
        JobRequest("", v1::OPTIMIZER_FAMILY_ADAMW, 8, kSteps, 1),
        JobRequest("", v1::OPTIMIZER_FAMILY_MUON, 16, kSteps, 2),
        JobRequest("", v1::OPTIMIZER_FAMILY_ADAM, 4, kSteps, 3),
        JobRequest("", v1::OPTIMIZER_FAMILY_SOAP, 4, kSteps, 4)};
    requests[0].mutable_lora()->set_dropout(0.1);  // Replays its masks.
    // SOAP's factors and eigenbases, refreshed every other step, resume
    // with the rest of its state.
    requests[3].mutable_optimizer()->set_precondition_frequency(2);
    StageAndRunReference(requests, {});
  }

  // Stages `requests` on a server started with `model_flags` as well, and
  // runs them uninterrupted for the reference.
  static void StageAndRunReference(
      const std::vector<v1::CreateJobRequest>& requests,
      const std::vector<std::string>& model_flags) {
    stage_ = new std::string(FreshTestDir("stage"));
    jobs_ = new std::vector<std::string>();
    model_flags_ = new std::vector<std::string>(model_flags);
    *jobs_ = StageJobs(*stage_, ReversalJsonl(40, 5), requests, "--threads=2",
                       model_flags)
                 .jobs;
    ASSERT_EQ(jobs_->size(), requests.size());
    const std::string dir = FreshRun("reference");
    auto server = StartServer(dir, 4, ServerFlags());
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    reference_ = new Outcome(Collect(*client, *server));
  }

  static void TearDownTestSuite() {
    delete stage_;
    delete jobs_;
    delete reference_;
    delete model_flags_;
    stage_ = nullptr;
    jobs_ = nullptr;
    reference_ = nullptr;
    model_flags_ = nullptr;
  }

  static std::vector<std::string> ServerFlags() {
    std::vector<std::string> flags = {
        absl::StrCat("--checkpoint-interval=", kInterval), "--threads=2"};
    flags.insert(flags.end(), model_flags_->begin(), model_flags_->end());
    return flags;
  }

  // Waits for every job and gathers their last runs and adapters.
  static Outcome Collect(LoraplexClient& client, const ServerProcess& server) {
    Outcome outcome;
    for (const std::string& job : *jobs_) {
      auto done = WaitForJob(client, job);
      EXPECT_TRUE(done.ok()) << done.status() << "\n" << server.Log();
      if (!done.ok()) continue;
      EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED)
          << done->error().message() << "\n"
          << server.Log();
      outcome.runs[job] = LastRun(client, job);
      outcome.adapters[job] = JobAdapter(client, job);
    }
    return outcome;
  }

  // A copy of the staged state dir.
  static std::string FreshRun(const std::string& name) {
    return CopyOfState(*stage_, name);
  }

  // Expects `run`'s resumed steps and adapters to equal the reference
  // bit for bit; returns the step each job resumed from.
  static void ExpectSameAsReference(const Outcome& run,
                                    int64_t expected_resume_step) {
    for (const std::string& job : *jobs_) {
      const RunLosses& resumed = run.runs.at(job);
      const RunLosses& reference = reference_->runs.at(job);
      EXPECT_THAT(resumed.running_message,
                  HasSubstr(absl::StrCat("resumed from the checkpoint at step ",
                                         expected_resume_step)));
      ASSERT_EQ(reference.loss.size(), static_cast<size_t>(kSteps)) << job;
      ASSERT_EQ(resumed.loss.size(),
                static_cast<size_t>(kSteps - expected_resume_step))
          << job;
      for (const auto& [step, loss] : resumed.loss) {
        // Bit-identical, not merely close.
        EXPECT_EQ(loss, reference.loss.at(step)) << job << " step " << step;
      }
      EXPECT_EQ(run.adapters.at(job), reference_->adapters.at(job)) << job;
    }
  }

  struct Killed {
    int64_t step = 0;  // The first job's step seen before the kill.
    int runs = 0;      // Its RUNNING events then.
  };
  // Runs the server on `dir` until the first job has trained `step` steps,
  // then kills it (SIGKILL). A zero step on failure.
  static Killed KillAt(const std::string& dir, int64_t step) {
    Killed killed;
    auto server = StartServer(dir, 4, ServerFlags());
    if (server == nullptr) return killed;
    auto client = ClientFor(*server);
    auto job = WaitUntil(*client, jobs_->front(), [&](const v1::Job& job) {
      return job.metrics().step() >= step;
    });
    EXPECT_TRUE(job.ok()) << job.status();
    if (job.ok()) {
      killed.step = job->metrics().step();
      killed.runs = RunningEvents(*client, jobs_->front());
    }
    server->Kill();
    return killed;
  }

  static int RunningEvents(LoraplexClient& client, const std::string& job) {
    auto events = client.ListAllJobEvents(job);
    EXPECT_TRUE(events.ok()) << events.status();
    if (!events.ok()) return 0;
    int runs = 0;
    for (const v1::JobEvent& event : *events) {
      runs += event.has_status_change() &&
              event.status_change().status() == v1::JOB_STATUS_RUNNING;
    }
    return runs;
  }

  // Whether pool.json names every job: not when they finished (and their
  // checkpoints left the pool) before a kill.
  static bool PoolNamesEveryJob(const std::string& dir) {
    std::ifstream in(dir + "/checkpoints/pool.json");
    const nlohmann::json pool =
        nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (pool.is_discarded() || !pool.contains("jobs")) return false;
    for (const std::string& job : *jobs_) {
      if (!pool["jobs"].contains(job.substr(5))) return false;
    }
    return true;
  }

  // The step of the pool's last complete checkpoint, the same for every
  // job (they train together).
  static int64_t PoolStep(const std::string& dir) {
    std::ifstream in(dir + "/checkpoints/pool.json");
    const nlohmann::json pool = nlohmann::json::parse(in);
    std::set<int64_t> steps;
    for (const std::string& job : *jobs_) {
      steps.insert(pool["jobs"].at(job.substr(5)).get<int64_t>());
    }
    EXPECT_EQ(steps.size(), 1u) << pool.dump();
    return *steps.begin();
  }

  static std::string StepDir(const std::string& dir, const std::string& job,
                             int64_t step) {
    char name[32];
    std::snprintf(name, sizeof(name), "/step-%08lld",
                  static_cast<long long>(step));
    return dir + "/checkpoints/" + job.substr(5) + name;
  }

  // Kills the server at `points` random steps after the first checkpoint
  // and expects every run to resume bit-exactly. The kill lands a moment
  // after the step is seen; on a loaded machine the jobs may finish in
  // that moment (the restart then has nothing to resume: it runs no job
  // again). Such a point is taken again, killed at the earliest step.
  static void ExpectKilledRunsResume(int points) {
    ASSERT_NE(reference_, nullptr);
    std::mt19937 rng(std::random_device{}());
    for (int i = 0; i < points; ++i) {
      // Two intervals of steps are left after the latest kill step.
      int64_t kill_step =
          kInterval + 1 +
          static_cast<int64_t>(rng() % (kSteps - 3 * kInterval));
      bool resumed = false;
      for (int attempt = 0; attempt < 3 && !resumed; ++attempt) {
        SCOPED_TRACE(absl::StrCat("kill point ", i, " at step >= ", kill_step,
                                  ", attempt ", attempt));
        const std::string dir = FreshRun("killed");
        const Killed killed = KillAt(dir, kill_step);
        ASSERT_GE(killed.step, kill_step);
        auto server = StartServer(dir, 4, ServerFlags());
        ASSERT_NE(server, nullptr);
        auto client = ClientFor(*server);
        Outcome run = Collect(*client, *server);
        if (RunningEvents(*client, jobs_->front()) == killed.runs) {
          // The killed server had finished the jobs: no run to resume.
          kill_step = kInterval + 1;
          continue;
        }
        resumed = true;
        // Every job resumes from the same complete pool checkpoint, at
        // least the one before the step seen (that step's own may have
        // been cut short by the kill).
        const RunLosses& first = run.runs.at(jobs_->front());
        ASSERT_FALSE(first.loss.empty());
        const int64_t resumed_from = first.loss.begin()->first - 1;
        EXPECT_GE(resumed_from, ((killed.step - 1) / kInterval) * kInterval);
        EXPECT_EQ(resumed_from % kInterval, 0);
        ExpectSameAsReference(run, resumed_from);
      }
      EXPECT_TRUE(resumed) << "kill point " << i
                           << ": every kill came after the jobs had finished";
    }
  }

  static std::string* stage_;
  static std::vector<std::string>* jobs_;
  static Outcome* reference_;
  static std::vector<std::string>* model_flags_;  // Where the base is.
};

std::string* ServiceCheckpointTest::stage_ = nullptr;
std::vector<std::string>* ServiceCheckpointTest::jobs_ = nullptr;
Outcome* ServiceCheckpointTest::reference_ = nullptr;
std::vector<std::string>* ServiceCheckpointTest::model_flags_ = nullptr;

// Kill points: LORAPLEX_KILL_POINTS (default 5; the `long` ctest label runs
// more), at random steps after the first checkpoint.
TEST_F(ServiceCheckpointTest, KilledServerResumesEveryJobBitExactly) {
  const char* env = std::getenv("LORAPLEX_KILL_POINTS");
  ExpectKilledRunsResume(env != nullptr ? std::atoi(env) : 5);
}

// The same over a mixture-of-experts base (the tiny-moe preset: every
// layer's MLP 8 experts, 2 per token), the jobs' default targets adapting
// attention and every expert, their optimizer state stacked per expert.
class ServiceCheckpointMoeTest : public ServiceCheckpointTest {
 protected:
  static void SetUpTestSuite() {
    const std::string model = FreshTestDir("moe-model") + "/tiny-moe";
    ASSERT_TRUE(WritePresetModel("tiny-moe", 3, model).ok());
    std::vector<v1::CreateJobRequest> requests = {
        JobRequest("", v1::OPTIMIZER_FAMILY_ADAMW, 8, kSteps, 1),
        JobRequest("", v1::OPTIMIZER_FAMILY_MUON, 16, kSteps, 2),
        JobRequest("", v1::OPTIMIZER_FAMILY_SOAP, 4, kSteps, 4)};
    requests[2].mutable_optimizer()->set_precondition_frequency(2);
    StageAndRunReference(requests, {"--model=" + model});
  }
};

TEST_F(ServiceCheckpointMoeTest, KilledServerResumesEveryJobBitExactly) {
  ExpectKilledRunsResume(1);
}

// As in KilledServerResumesEveryJobBitExactly, the jobs may finish in the
// moment before the kill (pool.json then no longer names them, or the
// restart runs no job again); such a kill is taken again.
TEST_F(ServiceCheckpointTest, DamagedNewestCheckpointFallsBackToThePrevious) {
  ASSERT_NE(reference_, nullptr);
  bool resumed = false;
  for (int attempt = 0; attempt < 3 && !resumed; ++attempt) {
    SCOPED_TRACE(absl::StrCat("attempt ", attempt));
    const std::string dir = FreshRun("damaged");
    const Killed killed = KillAt(dir, 2 * kInterval + 1);
    ASSERT_GT(killed.step, 0);
    if (!PoolNamesEveryJob(dir)) continue;
    // Damage, each another way, the checkpoint every job would resume from:
    // its step in the pool's last complete checkpoint.
    const int64_t newest = PoolStep(dir);
    ASSERT_GE(newest, 2 * kInterval);
    for (size_t i = 0; i < jobs_->size(); ++i) {
      const std::string victim = StepDir(dir, (*jobs_)[i], newest);
      if (i == 0) {
        std::fstream file(victim + "/training_state.pt",
                          std::ios::in | std::ios::out | std::ios::binary);
        file.seekg(64);
        const char byte = static_cast<char>(file.get() ^ 0x01);
        file.seekp(64);
        file.put(byte);
      } else if (i == 1) {
        fs::resize_file(victim + "/adapter_model.safetensors", 100);
      } else {
        fs::remove(victim + "/manifest.json");
      }
    }
    auto server = StartServer(dir, 4, ServerFlags());
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    Outcome run = Collect(*client, *server);
    if (RunningEvents(*client, jobs_->front()) == killed.runs) continue;
    resumed = true;
    ExpectSameAsReference(run, newest - kInterval);
    for (const std::string& job : *jobs_) {
      EXPECT_THAT(run.runs.at(job).running_message,
                  HasSubstr("1 newer checkpoint(s) failed verification"));
    }
    EXPECT_TRUE(server->Stop().ok());
    const std::string log = server->Log();
    EXPECT_THAT(log, HasSubstr("training_state.pt has SHA-256"));
    EXPECT_THAT(log, HasSubstr("adapter_model.safetensors has 100 bytes"));
    EXPECT_THAT(log, HasSubstr("no readable manifest.json"));
  }
  EXPECT_TRUE(resumed) << "every kill came after the jobs had finished";
}

// A crash between the checkpoints of one step boundary leaves some jobs
// with a newer checkpoint than the others; they resume from the pool's last
// complete checkpoint instead, so the co-batches stay the same. A kill
// that came after the jobs had finished is taken again.
TEST_F(ServiceCheckpointTest, CheckpointsOfAnInterruptedGroupAreNotUsed) {
  ASSERT_NE(reference_, nullptr);
  bool resumed = false;
  for (int attempt = 0; attempt < 3 && !resumed; ++attempt) {
    SCOPED_TRACE(absl::StrCat("attempt ", attempt));
    const std::string dir = FreshRun("interrupted");
    const Killed killed = KillAt(dir, 2 * kInterval + 1);
    ASSERT_GT(killed.step, 0);
    if (!PoolNamesEveryJob(dir)) continue;
    // As if the kill came after the first job's checkpoint of the newest
    // group: the others lose theirs and pool.json names the group before.
    const int64_t newest = PoolStep(dir);
    ASSERT_GE(newest, 2 * kInterval);
    for (size_t i = 1; i < jobs_->size(); ++i) {
      fs::remove_all(StepDir(dir, (*jobs_)[i], newest));
    }
    nlohmann::json pool;
    for (const std::string& job : *jobs_) {
      pool["jobs"][job.substr(5)] = newest - kInterval;
    }
    std::ofstream(dir + "/checkpoints/pool.json") << pool.dump();
    auto server = StartServer(dir, 4, ServerFlags());
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    Outcome run = Collect(*client, *server);
    if (RunningEvents(*client, jobs_->front()) == killed.runs) continue;
    resumed = true;
    ExpectSameAsReference(run, newest - kInterval);
  }
  EXPECT_TRUE(resumed) << "every kill came after the jobs had finished";
}

TEST(ServiceShutdownTest, ShutdownCheckpointsAndPausedJobsStayPaused) {
  const std::string dir = FreshTestDir("state");
  std::string dataset, running, paused;
  int64_t stopped_at = 0;
  int64_t paused_step = 0;
  {
    // Checkpoints only on pause and shutdown. The job to pause is held
    // after step 3 (--test-faults=hold) until the pause reaches the
    // trainer: else a slow client sees it finish first.
    auto server = StartServer(
        dir, 2,
        {"--checkpoint-interval=0", "--test-faults=hold:seed=5,step=3"});
    ASSERT_NE(server, nullptr);
    auto client = ClientFor(*server);
    auto data = client->UploadDatasetContents(ReversalJsonl(20, 2), "d");
    ASSERT_TRUE(data.ok());
    dataset = data->name();
    auto job = client->CreateJob(
        JobRequest(dataset, v1::OPTIMIZER_FAMILY_MUON, 8, 1000000, 4));
    ASSERT_TRUE(job.ok());
    running = job->name();
    job = client->CreateJob(
        JobRequest(dataset, v1::OPTIMIZER_FAMILY_ADAMW, 4, 30, 5));
    ASSERT_TRUE(job.ok());
    paused = job->name();
    ASSERT_TRUE(WaitUntil(*client, paused, [](const v1::Job& job) {
                  return job.metrics().step() >= 3;
                }).ok());
    job = client->PauseJob(paused);
    ASSERT_TRUE(job.ok()) << job.status();
    EXPECT_EQ(job->status(), v1::JOB_STATUS_PAUSED);
    EXPECT_EQ(job->slot(), -1);
    paused_step = job->metrics().step();
    EXPECT_GE(paused_step, 3);
    auto before = client->GetJob(running);
    ASSERT_TRUE(before.ok());
    stopped_at = before->metrics().step();
    ASSERT_TRUE(server->Stop().ok()) << server->Log();
  }
  auto server = StartServer(dir, 2, {"--checkpoint-interval=0"});
  ASSERT_NE(server, nullptr);
  auto client = ClientFor(*server);
  // The running job continues from its shutdown checkpoint.
  auto again = WaitUntil(*client, running, [](const v1::Job& job) {
    return job.status() == v1::JOB_STATUS_RUNNING;
  });
  ASSERT_TRUE(again.ok());
  const std::string message = LastRun(*client, running).running_message;
  EXPECT_THAT(message, HasSubstr("resumed from the checkpoint at step "));
  int64_t resumed = -1;
  auto checkpoints = client->ListCheckpoints(running);
  ASSERT_TRUE(checkpoints.ok());
  ASSERT_EQ(checkpoints->checkpoints_size(), 1);
  resumed = checkpoints->checkpoints(0).step();
  EXPECT_GE(resumed, stopped_at);
  EXPECT_THAT(message, HasSubstr(absl::StrCat("step ", resumed)));
  ASSERT_TRUE(WaitUntil(*client, running, [&](const v1::Job& job) {
                return job.metrics().step() > resumed;
              }).ok());
  ASSERT_TRUE(client->CancelJob(running).ok());
  // Cancelling checkpoints the job where it stopped, for export.
  bool cancel_checkpoint = false;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (!cancel_checkpoint && std::chrono::steady_clock::now() < deadline) {
    auto after = client->ListCheckpoints(running);
    ASSERT_TRUE(after.ok());
    cancel_checkpoint = after->checkpoints_size() > 0 &&
                        after->checkpoints().rbegin()->step() > resumed;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(cancel_checkpoint);

  auto still = client->GetJob(paused);
  ASSERT_TRUE(still.ok());
  EXPECT_EQ(still->status(), v1::JOB_STATUS_PAUSED);
  auto resumed_job = client->ResumeJob(paused);
  ASSERT_TRUE(resumed_job.ok()) << resumed_job.status();
  EXPECT_EQ(resumed_job->status(), v1::JOB_STATUS_QUEUED);
  auto done = WaitForJob(*client, paused);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->status(), v1::JOB_STATUS_SUCCEEDED);
  const RunLosses last = LastRun(*client, paused);
  EXPECT_THAT(last.running_message,
              HasSubstr(absl::StrCat("resumed from the checkpoint at step ",
                                     paused_step)));
  ASSERT_FALSE(last.loss.empty());
  EXPECT_EQ(last.loss.begin()->first, paused_step + 1);
  EXPECT_EQ(last.loss.rbegin()->first, 30);
}

}  // namespace
}  // namespace loraplex
