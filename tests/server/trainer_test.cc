// The trainer thread in process: where resumed jobs go and what it reports.
#include "server/trainer/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <optional>
#include <thread>

#include "adapters/peft_files.h"
#include "core/model/llama_model.h"
#include "server/trainer/checkpoint.h"
#include "tests/common/test_dir.h"
#include "tests/common/tiny_model.h"
#include "tests/common/train_fixture.h"

namespace loraplex {
namespace {

// Collects reports from the trainer thread.
class Reports {
 public:
  Trainer::ReportSink Sink() {
    return [this](TrainerReport report) {
      std::lock_guard<std::mutex> lock(mu_);
      reports_.push_back(std::move(report));
      changed_.notify_all();
    };
  }

  // The first report of `kind` for `job`, waiting up to 60 s.
  TrainerReport WaitFor(TrainerReport::Kind kind, const std::string& job) {
    std::unique_lock<std::mutex> lock(mu_);
    TrainerReport found;
    const bool seen = changed_.wait_for(lock, std::chrono::seconds(60), [&] {
      for (const TrainerReport& report : reports_) {
        if (report.kind == kind && report.job_id == job) {
          found = report;
          return true;
        }
      }
      return false;
    });
    EXPECT_TRUE(seen) << "no report for " << job;
    return found;
  }

  std::vector<TrainerReport> All() {
    std::lock_guard<std::mutex> lock(mu_);
    return reports_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<TrainerReport> reports_;
};

AttachCommand Command(const std::string& job, uint64_t seed) {
  AttachCommand command;
  command.job_id = job;
  const SlotAttachRequest request = TrainRequest(
      job, OptimizerFamily::kAdamW, 4, {Projection::kQ, Projection::kV},
      Sequences(ReversalJsonl(8, 2), 16), seed);
  command.spec.lora = request.lora;
  command.spec.optimizer = request.optimizer;
  command.spec.schedule = request.schedule;
  command.spec.training = request.training;
  command.spec.training.max_steps = 100000;
  command.data = request.data;
  command.resume = true;
  return command;
}

std::unique_ptr<LlamaModel> LoadModel() {
  auto model = LlamaModel::Load(TinyModelDir(), {});
  EXPECT_TRUE(model.ok()) << model.status();
  return std::move(model).value();
}

// A job resumed from a checkpoint taken in slot 0 gets slot 0 back even
// when a new job comes before it in the same batch of attaches.
TEST(TrainerTest, ResumedJobsGetTheirSlotBackBeforeNewJobs) {
  TrainerOptions options;
  options.pool.capacity = 3;
  options.checkpoint_root = FreshTestDir("checkpoints");
  options.checkpoint_interval = 0;
  {
    Reports reports;
    Trainer trainer(LoadModel(), options, reports.Sink());
    trainer.Start();
    trainer.Attach(Command("job-resumed", 1));
    EXPECT_EQ(
        reports.WaitFor(TrainerReport::Kind::kAttached, "job-resumed").slot, 0);
    reports.WaitFor(TrainerReport::Kind::kStep, "job-resumed");
    trainer.Stop();  // Checkpoints it.
  }
  ASSERT_EQ(ListCheckpoints(options.checkpoint_root + "/job-resumed").size(),
            1u);

  Reports reports;
  Trainer trainer(LoadModel(), options, reports.Sink());
  trainer.Start();
  std::vector<AttachCommand> batch;
  batch.push_back(Command("job-new", 2));
  batch.push_back(Command("job-resumed", 1));
  trainer.AttachAll(std::move(batch));
  const TrainerReport resumed =
      reports.WaitFor(TrainerReport::Kind::kAttached, "job-resumed");
  const TrainerReport fresh =
      reports.WaitFor(TrainerReport::Kind::kAttached, "job-new");
  EXPECT_EQ(resumed.slot, 0);
  EXPECT_GT(resumed.resumed_step, 0);
  EXPECT_EQ(fresh.slot, 1);
  EXPECT_EQ(fresh.resumed_step, -1);
  trainer.Stop();
}

// A retire that comes while a job's last step trains finds the job gone:
// the job's end (written after its export) is reported before the retire's
// "not in a slot", so the scheduler sees the job finish first, and the
// exported adapter it then owns is on disk.
TEST(TrainerTest, AJobsEndIsReportedBeforeARetireThatFindsItGone) {
  TrainerOptions options;
  options.pool.capacity = 1;
  options.checkpoint_root = FreshTestDir("checkpoints");
  Reports reports;
  Trainer trainer(LoadModel(), options, reports.Sink());
  trainer.Start();
  const std::string exports = FreshTestDir("exports");
  for (int i = 0; i < 12; ++i) {
    const std::string job = "job-" + std::to_string(i);
    AttachCommand command = Command(job, 3);
    command.spec.training.max_steps = 1;
    const std::string final_dir = exports + "/" + job;
    command.final_adapter_dir = final_dir;
    trainer.Attach(std::move(command));
    reports.WaitFor(TrainerReport::Kind::kAttached, job);
    trainer.Retire(job);  // Before, during or after its one step.
    const TrainerReport retired =
        reports.WaitFor(TrainerReport::Kind::kRetired, job);
    int finished_at = -1;
    int retired_at = -1;
    const std::vector<TrainerReport> all = reports.All();
    for (size_t at = 0; at < all.size(); ++at) {
      if (all[at].job_id != job) continue;
      if (all[at].kind == TrainerReport::Kind::kFinished) finished_at = at;
      if (all[at].kind == TrainerReport::Kind::kRetired) retired_at = at;
    }
    if (retired.status.ok()) continue;  // Retired before its step ended.
    // The retire found no slot: the job had ended, and said so first.
    ASSERT_GE(finished_at, 0) << job;
    EXPECT_LT(finished_at, retired_at) << job;
    EXPECT_TRUE(all[finished_at].status.ok()) << all[finished_at].status;
    EXPECT_TRUE(std::filesystem::exists(final_dir + "/" + kPeftWeightsFile))
        << job;
  }
  trainer.Stop();
}

// A sample whose caller has gone stops decoding and is answered CANCELLED;
// a sample beside it finishes as it would alone.
TEST(TrainerTest, ACancelledSampleStopsAndTheOthersFinish) {
  TrainerOptions options;
  options.pool.capacity = 1;
  Reports reports;
  Trainer trainer(LoadModel(), options, reports.Sink());
  trainer.Start();
  std::mutex mu;
  std::condition_variable changed;
  std::vector<absl::StatusOr<SampleResult>> answers(2, absl::UnknownError(""));
  int answered = 0;
  std::atomic<int> tokens_seen{0};
  for (int i = 0; i < 2; ++i) {
    SampleCommand command;
    command.prompt = {1, 2, 3};
    command.params.max_tokens = i == 0 ? 2000 : 20;
    command.params.seed = 5;
    if (i == 0) {
      command.on_token = [&](int64_t, const GeneratedSample&) {
        ++tokens_seen;
      };
      command.cancelled = [&] { return tokens_seen.load() >= 3; };
    }
    command.done = [&, i](absl::StatusOr<SampleResult> result, int64_t) {
      std::lock_guard<std::mutex> lock(mu);
      answers[i] = std::move(result);
      ++answered;
      changed.notify_all();
    };
    trainer.Sample(std::move(command));
  }
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(changed.wait_for(lock, std::chrono::seconds(60),
                                 [&] { return answered == 2; }));
  }
  EXPECT_EQ(answers[0].status().code(), absl::StatusCode::kCancelled)
      << answers[0].status();
  EXPECT_LT(tokens_seen.load(), 100);
  ASSERT_TRUE(answers[1].ok()) << answers[1].status();
  EXPECT_EQ(answers[1]->samples[0].tokens.size(), 20u);
  trainer.Stop();
}

// Waits for the answer a session command's `done` gets.
template <typename T>
class Answer {
 public:
  std::function<void(absl::StatusOr<T>)> Done() {
    return [this](absl::StatusOr<T> result) {
      std::lock_guard<std::mutex> lock(mu_);
      result_ = std::move(result);
      changed_.notify_all();
    };
  }
  absl::StatusOr<T> Get() {
    std::unique_lock<std::mutex> lock(mu_);
    EXPECT_TRUE(changed_.wait_for(lock, std::chrono::seconds(60),
                                  [&] { return result_.has_value(); }));
    return result_.value_or(absl::DeadlineExceededError("no answer"));
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::optional<absl::StatusOr<T>> result_;
};

SessionOpenCommand OpenCommand(const std::string& id, Answer<int>& answer) {
  SessionOpenCommand open;
  open.session_id = id;
  open.lora.rank = 4;
  open.lora.alpha = 8;
  open.optimizer.family = OptimizerFamily::kAdamW;
  open.optimizer.lr = 1e-2;
  open.done = answer.Done();
  return open;
}

SessionOp Op(const std::string& id, SessionOp::Kind kind,
             Answer<SessionOpResult>& answer) {
  SessionOp op;
  op.kind = kind;
  op.session_id = id;
  op.step.family = OptimizerFamily::kAdamW;
  op.step.lr = 1e-2;
  op.done = answer.Done();
  if (kind == SessionOp::Kind::kForwardBackward) {
    // Long enough that the operations sent after it wait for its pass.
    auto data = std::make_shared<std::vector<Datum>>();
    for (int row = 0; row < 16; ++row) {
      Datum datum;
      for (int t = 0; t < 64; ++t) {
        datum.input_ids.push_back((row * 7 + t) % 250);
        datum.target_tokens.push_back((row * 7 + t + 1) % 250);
        datum.weights.push_back(1.0);
      }
      data->push_back(std::move(datum));
    }
    op.data = std::move(data);
  }
  return op;
}

// A session's operations sent behind its close are refused, in the same
// iteration as the close or later, and the trainer goes on serving.
TEST(TrainerTest, OperationsBehindACloseAreRefusedAndTheTrainerGoesOn) {
  TrainerOptions options;
  options.pool.capacity = 2;
  Reports reports;
  Trainer trainer(LoadModel(), options, reports.Sink());
  trainer.Start();
  Answer<int> opened;
  trainer.OpenSession(OpenCommand("s", opened));
  ASSERT_TRUE(opened.Get().ok());
  Answer<SessionOpResult> pass, closed, after_close, call_after_close;
  trainer.RunSessionOp(Op("s", SessionOp::Kind::kForwardBackward, pass));
  trainer.RunSessionOp(Op("s", SessionOp::Kind::kClose, closed));
  trainer.RunSessionOp(Op("s", SessionOp::Kind::kOptimStep, after_close));
  trainer.RunSessionOp(
      Op("s", SessionOp::Kind::kForwardBackward, call_after_close));
  EXPECT_TRUE(pass.Get().ok()) << pass.Get().status();
  EXPECT_TRUE(closed.Get().ok()) << closed.Get().status();
  for (Answer<SessionOpResult>* refused : {&after_close, &call_after_close}) {
    const absl::StatusCode code = refused->Get().status().code();
    EXPECT_TRUE(code == absl::StatusCode::kFailedPrecondition ||
                code == absl::StatusCode::kNotFound)
        << refused->Get().status();
  }
  Answer<int> reopened;
  trainer.OpenSession(OpenCommand("t", reopened));
  ASSERT_TRUE(reopened.Get().ok()) << reopened.Get().status();
  Answer<SessionOpResult> stepped;
  trainer.RunSessionOp(Op("t", SessionOp::Kind::kOptimStep, stepped));
  ASSERT_TRUE(stepped.Get().ok()) << stepped.Get().status();
  EXPECT_TRUE(stepped.Get()->step.skipped);  // No gradients yet.
  trainer.Stop();
}

}  // namespace
}  // namespace loraplex
