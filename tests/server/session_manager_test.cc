// SessionManager against a fake JobTrainer that holds each session command
// until the test answers it, so the moments between a session's states are
// observed deterministically: what GetSession says and what calls get while
// a session is opening or closing, and that a closed session's slot is free
// by the time the close is answered. No LibTorch, no server process.
#include "server/sessions/session_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <deque>
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "server/common/logger.h"
#include "server/jobs/job_event_hub.h"
#include "server/jobs/job_scheduler.h"
#include "server/store/job_store.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

using ::testing::HasSubstr;

constexpr auto kWait = std::chrono::seconds(20);

// Holds the session commands it is given until the test answers them.
class HoldingTrainer : public JobTrainer {
 public:
  explicit HoldingTrainer(int capacity) : capacity_(capacity) {}

  void AttachAll(std::vector<AttachCommand>) override {}
  void Retire(const std::string&) override {}
  void Pause(const std::string&) override {}
  void Export(const std::string& job_id, const std::string&,
              std::function<void(absl::Status)> done) override {
    done(absl::NotFoundError(job_id));
  }
  void Sample(SampleCommand command) override {
    command.done(absl::UnimplementedError("no sampling here"), 0);
  }
  void OpenSession(SessionOpenCommand command) override {
    std::lock_guard<std::mutex> lock(mu_);
    opens_.push_back(std::move(command));
  }
  void RunSessionOp(SessionOp op) override {
    std::lock_guard<std::mutex> lock(mu_);
    ops_.push_back(std::move(op));
  }
  int capacity() const override { return capacity_; }
  std::vector<SlotInfo> Slots() const override { return {}; }
  TrainerStats Stats() const override { return {}; }

  SessionOpenCommand TakeOpen() {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(opens_.empty());
    SessionOpenCommand command = std::move(opens_.front());
    opens_.pop_front();
    return command;
  }
  SessionOp TakeOp() {
    std::lock_guard<std::mutex> lock(mu_);
    EXPECT_FALSE(ops_.empty());
    SessionOp op = std::move(ops_.front());
    ops_.pop_front();
    return op;
  }

 private:
  const int capacity_;
  std::mutex mu_;
  std::deque<SessionOpenCommand> opens_;
  std::deque<SessionOp> ops_;
};

class SessionManagerTest : public ::testing::Test {
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
    trainer_ = std::make_unique<HoldingTrainer>(/*capacity=*/1);
    SchedulerOptions options;
    options.state_dir = dir_;
    options.throughput_log_seconds = 0;
    scheduler_ = std::make_unique<JobScheduler>(store_.get(), datasets_.get(),
                                                &hub_, logger_.get(), options);
    ASSERT_TRUE(scheduler_->Start(trainer_.get()).ok());
    SessionManagerOptions session_options;
    session_options.states_dir = dir_ + "/session_states";
    sessions_ = std::make_unique<SessionManager>(
        scheduler_.get(), trainer_.get(), store_.get(), session_options);
  }

  void TearDown() override {
    sessions_->Stop();
    sessions_->Drain();
    sessions_.reset();
    scheduler_->Stop();
  }

  // Creates a session, answering the trainer's open with slot 0.
  std::string OpenSession() {
    std::promise<absl::StatusOr<SessionInfo>> created;
    sessions_->Create("alice", SessionSpec(),
                      [&](absl::StatusOr<SessionInfo> info) {
                        created.set_value(std::move(info));
                      });
    SessionOpenCommand open = trainer_->TakeOpen();
    std::string id = open.session_id;
    open.done(0);
    auto future = created.get_future();
    EXPECT_EQ(future.wait_for(kWait), std::future_status::ready);
    absl::StatusOr<SessionInfo> info = future.get();
    EXPECT_TRUE(info.ok()) << info.status();
    return id;
  }

  // Submits an optimizer step as operation `seq_id` and returns its
  // answer when it comes at once (a refusal), else nullopt.
  std::optional<absl::Status> SubmitNow(const std::string& id, int64_t seq_id) {
    auto answered = std::make_shared<std::promise<absl::Status>>();
    auto future = answered->get_future();
    SessionRequest request;
    request.kind = SessionOp::Kind::kOptimStep;
    sessions_->Submit("alice", id, seq_id, request,
                      [answered](absl::StatusOr<SessionResult> result) {
                        answered->set_value(result.status());
                      });
    if (future.wait_for(std::chrono::milliseconds(0)) !=
        std::future_status::ready) {
      return std::nullopt;
    }
    return future.get();
  }

  absl::StatusOr<SessionInfo> Close(const std::string& id) {
    std::promise<absl::StatusOr<SessionInfo>> closed;
    sessions_->Close("alice", id, [&](absl::StatusOr<SessionInfo> info) {
      closed.set_value(std::move(info));
    });
    auto future = closed.get_future();
    EXPECT_EQ(future.wait_for(kWait), std::future_status::ready);
    return future.get();
  }

  std::string dir_;
  ByteTokenizer tokenizer_;
  std::unique_ptr<JobStore> store_;
  std::unique_ptr<DatasetLoader> datasets_;
  JobEventHub hub_;
  std::unique_ptr<Logger> logger_;
  std::unique_ptr<HoldingTrainer> trainer_;
  std::unique_ptr<JobScheduler> scheduler_;
  std::unique_ptr<SessionManager> sessions_;
};

TEST_F(SessionManagerTest, AnOpeningSessionSaysSoAndAsksCallsToComeAgain) {
  std::promise<absl::StatusOr<SessionInfo>> created;
  sessions_->Create("alice", SessionSpec(),
                    [&](absl::StatusOr<SessionInfo> info) {
                      created.set_value(std::move(info));
                    });
  SessionOpenCommand open = trainer_->TakeOpen();
  const std::string id = open.session_id;

  absl::StatusOr<SessionInfo> opening = sessions_->Get("alice", id);
  ASSERT_TRUE(opening.ok()) << opening.status();
  EXPECT_EQ(opening->state, SessionState::kOpening);
  std::optional<absl::Status> call = SubmitNow(id, 1);
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->code(), absl::StatusCode::kUnavailable) << *call;
  EXPECT_THAT(call->message(), HasSubstr("is being opened"));
  absl::StatusOr<SessionInfo> close = Close(id);
  EXPECT_EQ(close.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(close.status().message(), HasSubstr("is being opened"));

  open.done(0);
  auto future = created.get_future();
  ASSERT_EQ(future.wait_for(kWait), std::future_status::ready);
  ASSERT_TRUE(future.get().ok());
  EXPECT_EQ(sessions_->Get("alice", id)->state, SessionState::kOpen);
  // Now the call is taken (it waits for the trainer).
  EXPECT_FALSE(SubmitNow(id, 1).has_value());
  trainer_->TakeOp().done(SessionOpResult());
}

TEST_F(SessionManagerTest, AClosingSessionSaysSoAndItsSlotIsFreeOnceClosed) {
  const std::string id = OpenSession();
  // The one slot is the session's.
  EXPECT_EQ(scheduler_->ReserveSessionSlot("bob").code(),
            absl::StatusCode::kResourceExhausted);

  std::promise<absl::StatusOr<SessionInfo>> closed;
  absl::Status reserved_when_answered = absl::UnknownError("not answered");
  sessions_->Close("alice", id, [&](absl::StatusOr<SessionInfo> info) {
    // Whoever hears of the close can have the slot.
    reserved_when_answered = scheduler_->ReserveSessionSlot("bob");
    closed.set_value(std::move(info));
  });
  SessionOp close = trainer_->TakeOp();
  ASSERT_EQ(close.kind, SessionOp::Kind::kClose);
  EXPECT_EQ(sessions_->Get("alice", id)->state, SessionState::kClosing);
  std::optional<absl::Status> call = SubmitNow(id, 1);
  ASSERT_TRUE(call.has_value());
  EXPECT_EQ(call->code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(call->message(), HasSubstr("is closing"));

  close.done(SessionOpResult());
  auto future = closed.get_future();
  ASSERT_EQ(future.wait_for(kWait), std::future_status::ready);
  absl::StatusOr<SessionInfo> info = future.get();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, SessionState::kClosed);
  EXPECT_TRUE(reserved_when_answered.ok()) << reserved_when_answered;
  scheduler_->ReleaseSessionSlot("bob");
}

// A trainer that answers a close twice, the second time with an error,
// would have the manager open a closed session again: the lifecycle refuses
// that change (INTERNAL), and neither the session nor its stored record
// leaves CLOSED.
TEST_F(SessionManagerTest, AChangeTheLifecycleRefusesIsNeitherMadeNorStored) {
  const std::string id = OpenSession();
  std::mutex mu;
  std::vector<absl::StatusOr<SessionInfo>> answers;
  sessions_->Close("alice", id, [&](absl::StatusOr<SessionInfo> info) {
    std::lock_guard<std::mutex> lock(mu);
    answers.push_back(std::move(info));
  });
  SessionOp close = trainer_->TakeOp();
  ASSERT_EQ(close.kind, SessionOp::Kind::kClose);
  close.done(SessionOpResult());
  // The close's answer comes once its record is stored.
  sessions_->Drain();
  ASSERT_EQ(sessions_->Get("alice", id)->state, SessionState::kClosed);

  close.done(absl::UnavailableError("the trainer answers again"));
  sessions_->Drain();
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(answers.size(), 2u);
    ASSERT_TRUE(answers[0].ok()) << answers[0].status();
    EXPECT_EQ(answers[1].status().code(), absl::StatusCode::kInternal);
    EXPECT_THAT(answers[1].status().message(),
                HasSubstr("cannot go from CLOSED to OPEN"));
  }
  absl::StatusOr<SessionInfo> info = sessions_->Get("alice", id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->state, SessionState::kClosed);
  EXPECT_EQ(info->reason, "closed by the client");
  absl::StatusOr<std::vector<SessionRecord>> stored = store_->ListSessions();
  ASSERT_TRUE(stored.ok()) << stored.status();
  ASSERT_EQ(stored->size(), 1u);
  EXPECT_EQ((*stored)[0].state, SessionState::kClosed);
}

}  // namespace
}  // namespace loraplex
