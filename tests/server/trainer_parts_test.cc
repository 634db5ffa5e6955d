// The trainer's parts alone: the report gate holds reports behind pool
// checkpoints being written and delivers them in order; the slot owners
// give each slot one owner, a job or a session.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <string>
#include <vector>

#include "server/trainer/report_gate.h"
#include "server/trainer/slot_owners.h"

namespace loraplex {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TrainerReport Step(const std::string& job_id, int64_t step) {
  TrainerReport report;
  report.kind = TrainerReport::Kind::kStep;
  report.job_id = job_id;
  report.step = step;
  return report;
}

TrainerReport Checkpoint(const std::string& job_id, int64_t step) {
  TrainerReport report = Step(job_id, step);
  report.kind = TrainerReport::Kind::kCheckpoint;
  return report;
}

// "job@step" (a checkpoint: "job@step*") for each report delivered.
struct Delivered {
  std::vector<std::string> names;
  JobTrainer::ReportSink sink() {
    return [this](TrainerReport report) {
      names.push_back(
          report.job_id + "@" + std::to_string(report.step) +
          (report.kind == TrainerReport::Kind::kCheckpoint ? "*" : ""));
    };
  }
};

TEST(ReportGateTest, ReportsPassAtOnceWithNoCheckpointBeingWritten) {
  Delivered delivered;
  int wakes = 0;
  ReportGate gate(delivered.sink(), [&] { ++wakes; });
  gate.Report(Step("a", 1));
  gate.Report(Step("b", 1));
  EXPECT_THAT(delivered.names, ElementsAre("a@1", "b@1"));
  EXPECT_FALSE(gate.pending());
  EXPECT_EQ(wakes, 0);
}

TEST(ReportGateTest, ReportsWaitForThePoolCheckpointQueuedBeforeThem) {
  Delivered delivered;
  std::atomic<int> wakes{0};
  ReportGate gate(delivered.sink(), [&] { ++wakes; });
  gate.Report(Step("a", 4));
  std::function<void()> first = gate.QueueGroup();
  gate.Report(Step("a", 5));
  std::function<void()> second = gate.QueueGroup();
  gate.Report(Step("a", 6));
  gate.Flush(/*deliver=*/true);
  EXPECT_THAT(delivered.names, ElementsAre("a@4"));  // Both unwritten.

  // The writer finishes the slot's checkpoint, then the first group: the
  // checkpoint is reported at once, the step after the first group too;
  // the step after the second still waits.
  gate.Written(Checkpoint("a", 4));
  first();
  EXPECT_EQ(wakes, 2);
  EXPECT_TRUE(gate.pending());
  gate.Flush(/*deliver=*/true);
  EXPECT_THAT(delivered.names, ElementsAre("a@4", "a@5", "a@4*"));
  EXPECT_FALSE(gate.pending());
  // A job's end written meanwhile goes behind the report still held.
  TrainerReport finished = Step("b", 9);
  finished.kind = TrainerReport::Kind::kFinished;
  gate.Written(finished);
  gate.Flush(/*deliver=*/true);
  EXPECT_THAT(delivered.names, ElementsAre("a@4", "a@5", "a@4*"));
  second();
  gate.Flush(/*deliver=*/true);
  EXPECT_THAT(delivered.names, ElementsAre("a@4", "a@5", "a@4*", "a@6", "b@9"));
  gate.Report(Step("a", 7));
  EXPECT_EQ(delivered.names.back(), "a@7");
}

TEST(ReportGateTest, ARankThatDoesNotReportOnlyTakesNote) {
  Delivered delivered;
  ReportGate gate(delivered.sink(), [] {});
  std::function<void()> group = gate.QueueGroup();
  group();
  EXPECT_TRUE(gate.pending());
  gate.Flush(/*deliver=*/false);
  EXPECT_FALSE(gate.pending());
  EXPECT_THAT(delivered.names, IsEmpty());
}

TEST(SlotOwnersTest, EachSlotHasOneOwnerAJobOrASession) {
  SlotOwners owners(3);
  EXPECT_EQ(owners.capacity(), 3);
  SlotJob job;
  job.job_id = "job-1";
  owners.Hold(0, job);
  SlotSession session;
  session.session_id = "session-1";
  owners.Hold(2, session);
  EXPECT_EQ(owners.SlotOfJob("job-1"), 0);
  EXPECT_EQ(owners.SlotOfSession("session-1"), 2);
  EXPECT_EQ(owners.SlotOfJob("session-1"), -1);
  EXPECT_EQ(owners.SlotOfSession("job-1"), -1);
  EXPECT_EQ(owners.session(0), nullptr);
  EXPECT_EQ(owners.job(2), nullptr);
  EXPECT_EQ(owners.job(1), nullptr);
  EXPECT_EQ(owners.session(1), nullptr);
  EXPECT_THAT(owners.JobSlots(), ElementsAre(0));
  EXPECT_THAT(owners.SessionSlots(), ElementsAre(2));

  // A session taking slot 0 replaces the job there: never both.
  SlotSession other;
  other.session_id = "session-2";
  owners.Hold(0, other);
  EXPECT_EQ(owners.job(0), nullptr);
  EXPECT_EQ(owners.SlotOfJob("job-1"), -1);
  EXPECT_THAT(owners.SessionSlots(), ElementsAre(0, 2));
  owners.Release(2);
  EXPECT_EQ(owners.session(2), nullptr);
  EXPECT_THAT(owners.SessionSlots(), ElementsAre(0));
  owners.session(0)->calls = 5;
  EXPECT_EQ(owners.session(0)->calls, 5);
}

}  // namespace
}  // namespace loraplex
