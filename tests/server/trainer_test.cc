// The trainer thread in process: where resumed jobs go and what it reports.
#include "server/engine/trainer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "core/model/llama_model.h"
#include "server/engine/checkpoint.h"
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

}  // namespace
}  // namespace loraplex
