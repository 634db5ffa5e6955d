// JobScheduler against a fake JobTrainer: queueing, per-tenant quotas,
// recovery order after a restart, and trainer reports turned into stored
// status. No LibTorch and no server process: the fake records the
// commands, and the tests play the trainer's reports.
#include "server/jobs/job_scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <fstream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "server/jobs/job_spec.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Records what the scheduler asks of the trainer.
class FakeTrainer : public JobTrainer {
 public:
  explicit FakeTrainer(int capacity) : capacity_(capacity) {}

  void AttachAll(std::vector<AttachCommand> commands) override {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> ids;
    for (AttachCommand& command : commands) {
      ids.push_back(command.job_id);
      attached_.push_back(std::move(command));
    }
    attach_batches_.push_back(std::move(ids));
  }
  void Retire(const std::string& job_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    retired_.push_back(job_id);
  }
  void Pause(const std::string& job_id) override {
    std::lock_guard<std::mutex> lock(mu_);
    paused_.push_back(job_id);
  }
  void Export(const std::string& job_id, const std::string&,
              std::function<void(absl::Status)> done) override {
    done(absl::NotFoundError(job_id));
  }
  void Sample(SampleCommand command) override {
    command.done(absl::UnimplementedError("the fake trainer cannot sample"), 0);
  }
  void OpenSession(SessionOpenCommand command) override {
    command.done(absl::UnimplementedError("the fake trainer has no sessions"));
  }
  void RunSessionOp(SessionOp op) override {
    op.done(absl::UnimplementedError("the fake trainer has no sessions"));
  }
  int capacity() const override { return capacity_; }
  std::vector<SlotInfo> Slots() const override { return {}; }
  TrainerStats Stats() const override { return {}; }

  std::vector<std::string> AttachedIds() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::string> ids;
    for (const AttachCommand& command : attached_) {
      ids.push_back(command.job_id);
    }
    return ids;
  }
  AttachCommand Attached(const std::string& job_id) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const AttachCommand& command : attached_) {
      if (command.job_id == job_id) return command;
    }
    ADD_FAILURE() << job_id << " was never attached";
    return {};
  }
  std::vector<std::vector<std::string>> AttachBatches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return attach_batches_;
  }
  std::vector<std::string> Retired() const {
    std::lock_guard<std::mutex> lock(mu_);
    return retired_;
  }
  std::vector<std::string> Paused() const {
    std::lock_guard<std::mutex> lock(mu_);
    return paused_;
  }

 private:
  const int capacity_;
  mutable std::mutex mu_;
  std::vector<AttachCommand> attached_;
  std::vector<std::vector<std::string>> attach_batches_;
  std::vector<std::string> retired_;
  std::vector<std::string> paused_;
};

constexpr auto kWait = std::chrono::seconds(20);

class JobSchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = FreshTestDir();
    std::filesystem::create_directories(dir_ + "/datasets");
    auto store = JobStore::Open(dir_ + "/loraplex.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
    datasets_ =
        std::make_unique<DatasetLoader>(dir_ + "/datasets", &tokenizer_);
    logger_ = std::make_unique<Logger>(LogLevel::kError);
  }

  void StartScheduler(int capacity, int slots_per_tenant = 1 << 30) {
    trainer_ = std::make_unique<FakeTrainer>(capacity);
    SchedulerOptions options;
    options.state_dir = dir_;
    options.slots_per_tenant = slots_per_tenant;
    options.throughput_log_seconds = 0;
    scheduler_ = std::make_unique<JobScheduler>(store_.get(), datasets_.get(),
                                                &hub_, logger_.get(), options);
    ASSERT_TRUE(scheduler_->Start(trainer_.get()).ok());
  }

  // A stored dataset of `lines` short texts.
  std::string StoreDataset(const std::string& id, int lines) {
    std::ofstream out(datasets_->PathOf(id));
    for (int i = 0; i < lines; ++i) {
      out << "{\"text\": \"example number " << i << "\"}\n";
    }
    return id;
  }

  static JobSpec Spec() {
    JobSpec spec;
    spec.training.batch_size = 1;
    spec.training.seq_len = 64;
    return spec;
  }

  JobRecord Record(const std::string& id, const std::string& tenant) {
    JobRecord record;
    record.id = id;
    record.tenant = tenant;
    record.training_dataset_id = "train";
    record.spec = JobSpecToJson(Spec());
    return record;
  }

  JobRecord Submit(const std::string& id, const std::string& tenant = "ann") {
    JobData data;
    data.training = std::make_shared<const SequenceSet>();
    data.total_steps = 10;
    absl::StatusOr<JobRecord> stored =
        scheduler_->Submit(Record(id, tenant), Spec(), std::move(data));
    EXPECT_TRUE(stored.ok()) << stored.status();
    return stored.value_or(JobRecord{});
  }

  void Report(TrainerReport::Kind kind, const std::string& job_id, int slot = 0,
              absl::Status status = absl::OkStatus()) {
    TrainerReport report;
    report.kind = kind;
    report.job_id = job_id;
    report.slot = slot;
    report.status = std::move(status);
    scheduler_->OnTrainerReport(std::move(report));
  }

  JobRecord Stored(const std::string& id) {
    absl::StatusOr<JobRecord> job = store_->GetJob("", id);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.value_or(JobRecord{});
  }

  // Reports are handled on the scheduler's thread: waits until the stored
  // job has `status`.
  JobRecord WaitForStatus(const std::string& id, JobStatus status) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    JobRecord job = Stored(id);
    while (job.status != status &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      job = Stored(id);
    }
    EXPECT_EQ(JobStatusName(job.status), JobStatusName(status)) << id;
    return job;
  }

  template <typename Predicate>
  bool WaitUntil(Predicate done) {
    const auto deadline = std::chrono::steady_clock::now() + kWait;
    while (!done()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return true;
  }

  std::vector<std::string> EventMessages(const std::string& id) {
    absl::StatusOr<std::vector<JobEventRecord>> events =
        store_->ListJobEvents(id, 0, 1000);
    EXPECT_TRUE(events.ok()) << events.status();
    std::vector<std::string> messages;
    for (const JobEventRecord& event :
         events.value_or(std::vector<JobEventRecord>{})) {
      if (event.status) messages.push_back(event.message);
    }
    return messages;
  }

  std::string dir_;
  ByteTokenizer tokenizer_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<DatasetLoader> datasets_;
  JobEventHub hub_;
  std::unique_ptr<Logger> logger_;
  std::unique_ptr<FakeTrainer> trainer_;
  std::unique_ptr<JobScheduler> scheduler_;
};

TEST_F(JobSchedulerTest, JobsTakeFreeSlotsFirstComeFirstServed) {
  StartScheduler(/*capacity=*/2);
  Submit("job-1");
  Submit("job-2");
  Submit("job-3");
  EXPECT_THAT(trainer_->AttachedIds(), ElementsAre("job-1", "job-2"));
  EXPECT_EQ(Stored("job-3").status, JobStatus::kQueued);
  // The spec given at the edge is the one attached and the one stored.
  EXPECT_EQ(JobSpecToJson(trainer_->Attached("job-1").spec),
            JobSpecToJson(Spec()));
  EXPECT_EQ(Stored("job-1").spec, JobSpecToJson(Spec()));

  Report(TrainerReport::Kind::kAttached, "job-1", 0);
  Report(TrainerReport::Kind::kAttached, "job-2", 1);
  EXPECT_EQ(WaitForStatus("job-1", JobStatus::kRunning).slot, 0);
  EXPECT_EQ(WaitForStatus("job-2", JobStatus::kRunning).slot, 1);

  // A finished job frees its slot for the next in line.
  Report(TrainerReport::Kind::kFinished, "job-1", 0);
  const JobRecord done = WaitForStatus("job-1", JobStatus::kSucceeded);
  EXPECT_FALSE(done.adapter_id.empty());
  EXPECT_TRUE(store_->GetAdapter("ann", done.adapter_id).ok());
  ASSERT_TRUE(WaitUntil([&] { return trainer_->AttachedIds().size() == 3; }));
  EXPECT_EQ(trainer_->AttachedIds()[2], "job-3");
  EXPECT_EQ(trainer_->Attached("job-3").final_adapter_dir.rfind(
                dir_ + "/adapters/", 0),
            0u);
}

TEST_F(JobSchedulerTest, AJobOverItsTenantsQuotaWaitsAndNeverFails) {
  StartScheduler(/*capacity=*/3, /*slots_per_tenant=*/1);
  Submit("ann-1", "ann");
  Submit("ann-2", "ann");
  Submit("bob-1", "bob");
  // ann-2 waits for ann's slot; bob's job passes it.
  EXPECT_THAT(trainer_->AttachedIds(), ElementsAre("ann-1", "bob-1"));
  EXPECT_EQ(Stored("ann-2").status, JobStatus::kQueued);

  Report(TrainerReport::Kind::kAttached, "ann-1", 0);
  WaitForStatus("ann-1", JobStatus::kRunning);
  Report(TrainerReport::Kind::kFinished, "ann-1", 0);
  WaitForStatus("ann-1", JobStatus::kSucceeded);
  ASSERT_TRUE(WaitUntil([&] { return trainer_->AttachedIds().size() == 3; }));
  EXPECT_EQ(trainer_->AttachedIds()[2], "ann-2");
  EXPECT_EQ(Stored("ann-2").status, JobStatus::kQueued);  // Until attached.
}

TEST_F(JobSchedulerTest, RestartRequeuesRunningJobsFirstInSlotOrder) {
  StoreDataset("train", 4);
  // What a previous run left: queued, running in slots 1 and 0, paused.
  auto insert = [&](const std::string& id, JobStatus status, int slot) {
    JobRecord record = Record(id, "ann");
    record.status = status;
    record.slot = slot;
    ASSERT_TRUE(store_->InsertJob(record, {}).ok());
  };
  insert("queued", JobStatus::kQueued, -1);
  insert("ran-in-1", JobStatus::kRunning, 1);
  insert("ran-in-0", JobStatus::kRunning, 0);
  insert("paused", JobStatus::kPaused, -1);

  StartScheduler(/*capacity=*/4);
  // Their data is prepared on the scheduler's thread first.
  ASSERT_TRUE(WaitUntil([&] { return !trainer_->AttachBatches().empty(); }));
  // One batch, so they start at the same step boundary, back into their
  // slots; the paused job stays paused.
  EXPECT_THAT(trainer_->AttachBatches(),
              ElementsAre(ElementsAre("ran-in-0", "ran-in-1", "queued")));
  EXPECT_EQ(trainer_->Attached("ran-in-0").preferred_slot, 0);
  EXPECT_EQ(trainer_->Attached("ran-in-1").preferred_slot, 1);
  EXPECT_EQ(trainer_->Attached("queued").preferred_slot, -1);
  for (const char* id : {"ran-in-0", "ran-in-1", "queued"}) {
    const AttachCommand command = trainer_->Attached(id);
    EXPECT_TRUE(command.recovering) << id;
    EXPECT_TRUE(command.resume) << id;
    // Their data was prepared again from the stored dataset.
    ASSERT_NE(command.data, nullptr) << id;
    EXPECT_EQ(command.data->sequences.size(), 4u) << id;
  }
  EXPECT_EQ(Stored("paused").status, JobStatus::kPaused);
  EXPECT_EQ(Stored("ran-in-0").status, JobStatus::kQueued);
  EXPECT_THAT(EventMessages("ran-in-0"),
              ElementsAre(HasSubstr("the server restarted")));
}

TEST_F(JobSchedulerTest, ARecoveredJobWhoseDatasetIsGoneFailsAlone) {
  StoreDataset("train", 2);
  JobRecord lost = Record("lost", "ann");
  lost.training_dataset_id = "missing";
  lost.status = JobStatus::kRunning;
  ASSERT_TRUE(store_->InsertJob(lost, {}).ok());
  JobRecord fine = Record("fine", "ann");
  ASSERT_TRUE(store_->InsertJob(fine, {}).ok());

  StartScheduler(/*capacity=*/2);
  ASSERT_TRUE(WaitUntil([&] { return !trainer_->AttachedIds().empty(); }));
  EXPECT_THAT(trainer_->AttachedIds(), ElementsAre("fine"));
  const JobRecord failed = WaitForStatus("lost", JobStatus::kFailed);
  EXPECT_THAT(failed.error_message, HasSubstr("training_dataset"));
}

TEST_F(JobSchedulerTest, ReportsBecomeStoredStatusAndMetrics) {
  StartScheduler(/*capacity=*/2);
  Submit("job-1");
  Submit("job-2");
  Report(TrainerReport::Kind::kAttached, "job-1", 1);
  Report(TrainerReport::Kind::kAttached, "job-2", 0,
         absl::InvalidArgumentError("lora.rank 512 exceeds the slot"));

  TrainerReport step;
  step.kind = TrainerReport::Kind::kStep;
  step.job_id = "job-1";
  step.slot = 1;
  step.step = 3;
  step.tokens = 120;
  step.metrics.loss = 1.25;
  step.metrics.lr = 2e-4;
  step.metrics.grad_norm = 0.5;
  scheduler_->OnTrainerReport(step);

  const JobRecord failed = WaitForStatus("job-2", JobStatus::kFailed);
  EXPECT_EQ(failed.error_code, "INVALID_ARGUMENT");
  EXPECT_EQ(failed.error_message, "lora.rank 512 exceeds the slot");
  ASSERT_TRUE(WaitUntil([&] { return Stored("job-1").metrics.step == 3; }));
  const JobRecord running = Stored("job-1");
  EXPECT_EQ(running.status, JobStatus::kRunning);
  EXPECT_EQ(running.slot, 1);
  EXPECT_EQ(running.metrics.loss, 1.25);
  EXPECT_EQ(running.metrics.tokens, 120);

  Report(TrainerReport::Kind::kFinished, "job-1", 1,
         absl::InternalError("device lost"));
  const JobRecord lost = WaitForStatus("job-1", JobStatus::kFailed);
  EXPECT_EQ(lost.error_message, "device lost");
  EXPECT_EQ(lost.slot, -1);
}

TEST_F(JobSchedulerTest, CancellingARunningJobRetiresItsSlot) {
  StartScheduler(/*capacity=*/1);
  Submit("job-1");
  Submit("job-2");
  Report(TrainerReport::Kind::kAttached, "job-1", 0);
  WaitForStatus("job-1", JobStatus::kRunning);

  absl::StatusOr<JobRecord> cancelled =
      scheduler_->Cancel("ann", "job-1", "cancelled by the user");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->status, JobStatus::kCancelled);
  EXPECT_THAT(trainer_->Retired(), ElementsAre("job-1"));
  // The slot is taken until the trainer has retired it.
  EXPECT_THAT(trainer_->AttachedIds(), ElementsAre("job-1"));
  Report(TrainerReport::Kind::kRetired, "job-1", 0);
  ASSERT_TRUE(WaitUntil([&] { return trainer_->AttachedIds().size() == 2; }));
  EXPECT_EQ(trainer_->AttachedIds()[1], "job-2");
  // Another tenant cannot see the job, and a finished job stays finished.
  EXPECT_EQ(scheduler_->Cancel("bob", "job-2", "x").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(scheduler_->Cancel("ann", "job-1", "x").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobSchedulerTest, PausingARunningJobWaitsForTheTrainersCheckpoint) {
  StartScheduler(/*capacity=*/1);
  Submit("job-1");
  Submit("job-2");
  Report(TrainerReport::Kind::kAttached, "job-1", 0);
  WaitForStatus("job-1", JobStatus::kRunning);

  std::mutex mu;
  std::condition_variable answered;
  std::optional<absl::StatusOr<JobRecord>> result;
  scheduler_->Pause("ann", "job-1", [&](absl::StatusOr<JobRecord> record) {
    std::lock_guard<std::mutex> lock(mu);
    result = std::move(record);
    answered.notify_all();
  });
  EXPECT_THAT(trainer_->Paused(), ElementsAre("job-1"));
  {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_FALSE(result.has_value());  // Not before the trainer's report.
  }
  TrainerReport paused;
  paused.kind = TrainerReport::Kind::kPaused;
  paused.job_id = "job-1";
  paused.slot = 0;
  paused.step = 4;
  scheduler_->OnTrainerReport(paused);
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(
        answered.wait_for(lock, kWait, [&] { return result.has_value(); }));
    ASSERT_TRUE(result->ok()) << result->status();
    EXPECT_EQ((*result)->status, JobStatus::kPaused);
  }
  EXPECT_EQ(Stored("job-1").metrics.step, 4);
  // Its slot went to the next job; resumed, it queues behind it.
  ASSERT_TRUE(WaitUntil([&] { return trainer_->AttachedIds().size() == 2; }));
  absl::StatusOr<JobRecord> resumed = scheduler_->Resume("ann", "job-1");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->status, JobStatus::kQueued);
  EXPECT_EQ(scheduler_->Resume("ann", "job-1").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// Once the trainer has stopped, a pause waiting for it is answered and
// every change is refused UNAVAILABLE (nothing waits on a trainer that
// will not answer; shutdown never waits on a call).
TEST_F(JobSchedulerTest, RefusedCommandsAnswerWaitingPauses) {
  StartScheduler(/*capacity=*/1);
  Submit("job-1");
  Submit("job-2");
  Report(TrainerReport::Kind::kAttached, "job-1", 0);
  WaitForStatus("job-1", JobStatus::kRunning);
  absl::StatusOr<JobRecord> pause = absl::UnknownError("not answered");
  scheduler_->Pause("ann", "job-1",
                    [&](absl::StatusOr<JobRecord> record) { pause = record; });
  EXPECT_EQ(pause.status().code(), absl::StatusCode::kUnknown);

  scheduler_->RefuseCommands(absl::UnavailableError("the trainer stopped"));
  EXPECT_EQ(pause.status(), absl::UnavailableError("the trainer stopped"));
  auto unavailable = [](const absl::Status& status) {
    return status.code() == absl::StatusCode::kUnavailable;
  };
  JobData data;
  data.training = std::make_shared<const SequenceSet>();
  EXPECT_TRUE(unavailable(
      scheduler_->Submit(Record("job-3", "ann"), Spec(), std::move(data))
          .status()));
  EXPECT_TRUE(unavailable(scheduler_->Cancel("ann", "job-2", "x").status()));
  EXPECT_TRUE(unavailable(scheduler_->Resume("ann", "job-2").status()));
  absl::Status queued_pause;
  scheduler_->Pause("ann", "job-2", [&](absl::StatusOr<JobRecord> record) {
    queued_pause = record.status();
  });
  EXPECT_TRUE(unavailable(queued_pause));
  EXPECT_TRUE(unavailable(scheduler_->ReserveSessionSlot("ann")));
  // Nothing changed.
  EXPECT_EQ(Stored("job-2").status, JobStatus::kQueued);
  EXPECT_FALSE(store_->GetJob("", "job-3").ok());
}

TEST_F(JobSchedulerTest, PausingAQueuedJobIsImmediate) {
  StartScheduler(/*capacity=*/1);
  Submit("job-1");
  Submit("job-2");
  absl::StatusOr<JobRecord> result = absl::UnknownError("not answered");
  scheduler_->Pause("ann", "job-2",
                    [&](absl::StatusOr<JobRecord> record) { result = record; });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->status, JobStatus::kPaused);
  EXPECT_TRUE(trainer_->Paused().empty());
  EXPECT_THAT(EventMessages("job-2"),
              ElementsAre(HasSubstr("validating"), HasSubstr("queued"),
                          "paused while queued"));
}

}  // namespace
}  // namespace loraplex
