// The pool checkpointer's writer thread (pool_checkpointer.h): checkpoints
// are written in the order they were queued, pool.json names a checkpoint
// only after it is committed (and never one whose write failed), and reads
// of a job's checkpoints wait for its queued writes. No LibTorch: the
// contents are bytes.
#include "server/checkpoints/pool_checkpointer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;

CheckpointContents Contents(const std::string& job_id, int64_t step,
                            int slot = 0) {
  CheckpointContents contents;
  contents.info.job_id = job_id;
  contents.info.slot = slot;
  contents.info.total_steps = 100;
  contents.info.counters.steps = step;
  contents.info.job_spec = {{"job", job_id}};
  contents.adapter_config = "{\"r\": 4}";
  contents.adapter_weights = std::string(64, static_cast<char>(step));
  contents.training_state = job_id + " state at " + std::to_string(step);
  return contents;
}

PoolCheckpointerOptions Options(const std::string& root) {
  PoolCheckpointerOptions options;
  options.root = root;
  options.enabled = true;
  options.keep = 5;
  return options;
}

std::map<std::string, int64_t> PoolJson(const std::string& root) {
  absl::StatusOr<std::map<std::string, int64_t>> pool =
      ReadPoolCheckpoint(root);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.value_or(std::map<std::string, int64_t>{});
}

std::vector<int64_t> Steps(const std::string& job_dir) {
  std::vector<int64_t> steps;
  for (const CheckpointEntry& entry : ListCheckpoints(job_dir)) {
    steps.push_back(entry.step);
  }
  return steps;
}

TEST(PoolCheckpointerTest, WritesInQueueOrderAndRecordsTheGroupAfterwards) {
  const std::string root = FreshTestDir();
  PoolCheckpointer checkpoints(Options(root));
  absl::Mutex mu;
  std::vector<std::string> order;
  std::vector<std::map<std::string, int64_t>> pool_at_write;
  for (const auto& [job, step] : std::vector<std::pair<std::string, int64_t>>{
           {"a", 2}, {"b", 2}, {"a", 4}}) {
    const std::string dir = checkpoints.StepDir(job, step);
    checkpoints.Write(Contents(job, step),
                      [&, dir, job = job, step = step](absl::Status status) {
                        EXPECT_TRUE(status.ok()) << status;
                        // Committed and verifiable before `done`; the group
                        // that names it is not yet written.
                        EXPECT_TRUE(VerifyCheckpoint(dir).ok());
                        absl::MutexLock lock(&mu);
                        order.push_back(job + std::to_string(step));
                        pool_at_write.push_back(PoolJson(root));
                      });
    if (step == 2 && job == "b") {
      checkpoints.RecordGroup({"a", "b"}, {{"a", 2}, {"b", 2}});
    }
  }
  checkpoints.Flush();
  EXPECT_THAT(order, ElementsAre("a2", "b2", "a4"));
  ASSERT_EQ(pool_at_write.size(), 3u);
  EXPECT_THAT(pool_at_write[0], IsEmpty());
  EXPECT_THAT(pool_at_write[1], IsEmpty());
  EXPECT_THAT(pool_at_write[2], ElementsAre(Pair("a", 2), Pair("b", 2)));
  EXPECT_THAT(PoolJson(root), ElementsAre(Pair("a", 2), Pair("b", 2)));
  EXPECT_THAT(Steps(checkpoints.JobDir("a")), ElementsAre(2, 4));
  // The files are the contents given.
  absl::StatusOr<std::string> state =
      ReadCheckpointFile(checkpoints.StepDir("a", 4), kCheckpointStateFile);
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(*state, "a state at 4");
}

TEST(PoolCheckpointerTest, GroupLeavesOutAJobWhoseWriteFailed) {
  const std::string root = FreshTestDir();
  PoolCheckpointer checkpoints(Options(root));
  checkpoints.Write(Contents("a", 2), nullptr);
  checkpoints.Write(Contents("b", 2), nullptr);
  checkpoints.RecordGroup({"a", "b"}, {{"a", 2}, {"b", 2}});
  checkpoints.Flush();
  ASSERT_THAT(PoolJson(root), ElementsAre(Pair("a", 2), Pair("b", 2)));

  // b's directory is blocked by a file: its next checkpoint cannot be
  // written, so the next group keeps no step for b (it resumes from its
  // newest valid checkpoint), while a's entry moves on.
  fs::remove_all(checkpoints.JobDir("b"));
  std::ofstream(checkpoints.JobDir("b")) << "not a directory";
  absl::Status b_written;
  checkpoints.Write(Contents("a", 4), nullptr);
  checkpoints.Write(Contents("b", 4),
                    [&](absl::Status status) { b_written = status; });
  checkpoints.RecordGroup({"a", "b"}, {{"a", 4}, {"b", 4}});
  checkpoints.Flush();
  EXPECT_FALSE(b_written.ok());
  EXPECT_THAT(PoolJson(root), ElementsAre(Pair("a", 4)));
}

TEST(PoolCheckpointerTest, ForgetRemovesTheJobAfterItsQueuedGroup) {
  const std::string root = FreshTestDir();
  PoolCheckpointer checkpoints(Options(root));
  checkpoints.Write(Contents("a", 2), nullptr);
  checkpoints.Write(Contents("b", 2), nullptr);
  checkpoints.RecordGroup({"a", "b"}, {{"a", 2}, {"b", 2}});
  checkpoints.Forget("a");
  checkpoints.Flush();
  EXPECT_THAT(PoolJson(root), ElementsAre(Pair("b", 2)));
}

TEST(PoolCheckpointerTest, ReadsOfAJobWaitForItsQueuedWritesOnly) {
  const std::string root = FreshTestDir();
  PoolCheckpointer checkpoints(Options(root));
  // The writer is held inside a's write until released.
  absl::Notification release;
  checkpoints.Write(Contents("a", 2, /*slot=*/3),
                    [&](absl::Status) { release.WaitForNotification(); });
  // b has nothing queued: its reads do not wait for a's write (if they
  // did, this test would never end).
  std::vector<std::string> rejected;
  absl::StatusOr<std::optional<PoolCheckpointer::ResumePoint>> b =
      checkpoints.FindResumePoint("b", /*recovering=*/false, &rejected);
  ASSERT_TRUE(b.ok());
  EXPECT_FALSE(b->has_value());
  EXPECT_EQ(checkpoints.SlotHint("b", false), -1);

  // a's read waits for its write, then sees it.
  std::thread reader([&] {
    absl::StatusOr<std::optional<PoolCheckpointer::ResumePoint>> a =
        checkpoints.FindResumePoint("a", /*recovering=*/false, &rejected);
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(a->has_value());
    EXPECT_EQ((*a)->info.step(), 2);
    EXPECT_EQ((*a)->info.slot, 3);
    EXPECT_EQ((*a)->training_state, "a state at 2");
  });
  release.Notify();
  reader.join();
  EXPECT_THAT(rejected, IsEmpty());
}

TEST(PoolCheckpointerTest, FullQueueWaitsForRoomAndLosesNothing) {
  const std::string root = FreshTestDir();
  PoolCheckpointerOptions options = Options(root);
  options.max_queued_bytes = 1;  // Room for one checkpoint at a time.
  options.keep = 100;
  PoolCheckpointer checkpoints(options);
  int written = 0;
  for (int64_t step = 1; step <= 20; ++step) {
    checkpoints.Write(Contents("a", step), [&](absl::Status status) {
      EXPECT_TRUE(status.ok()) << status;
      ++written;  // The writer thread alone.
    });
  }
  checkpoints.Flush();
  EXPECT_EQ(written, 20);
  EXPECT_EQ(Steps(checkpoints.JobDir("a")).size(), 20u);
}

TEST(PoolCheckpointerTest, DirectoryIsPublishedWholeAfterTheJobsCheckpoints) {
  const std::string root = FreshTestDir();
  PoolCheckpointer checkpoints(Options(root));
  const std::string dir = FreshTestDir("export") + "/adapter";
  std::vector<std::string> order;  // Written by the writer thread alone.
  checkpoints.Write(Contents("a", 2),
                    [&](absl::Status) { order.push_back("checkpoint"); });
  checkpoints.WriteDirectory(
      "a", dir, {{"adapter_config.json", "{}"}, {"weights", "bytes"}},
      [&](absl::Status status) {
        EXPECT_TRUE(status.ok()) << status;
        order.push_back("export");
      });
  checkpoints.WaitForJob("a");  // The export counts as the job's work.
  EXPECT_THAT(order, ElementsAre("checkpoint", "export"));
  std::ifstream weights(dir + "/weights");
  std::string bytes((std::istreambuf_iterator<char>(weights)),
                    std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, "bytes");
  EXPECT_TRUE(fs::exists(dir + "/adapter_config.json"));
  EXPECT_FALSE(fs::exists(dir + ".staged"));
}

TEST(PoolCheckpointerTest, PostedWorkRunsAfterTheWritesBeforeItAndMayRead) {
  const std::string root = FreshTestDir();
  PoolCheckpointer checkpoints(Options(root));
  absl::Notification release;
  checkpoints.Write(Contents("a", 2),
                    [&](absl::Status) { release.WaitForNotification(); });
  std::optional<int64_t> resumed;
  absl::Notification ran;
  checkpoints.Post([&] {
    // On the writer thread, a's write (queued before) is done; a write
    // queued after this task is not waited for.
    absl::StatusOr<std::optional<PoolCheckpointer::ResumePoint>> point =
        checkpoints.FindResumePoint("a", /*recovering=*/false, nullptr);
    if (point.ok() && point->has_value()) resumed = (*point)->info.step();
    ran.Notify();
  });
  checkpoints.Write(Contents("a", 4), nullptr);  // After the posted work.
  EXPECT_FALSE(ran.HasBeenNotified());
  release.Notify();
  ran.WaitForNotification();
  checkpoints.Flush();
  EXPECT_EQ(resumed, 2);
}

TEST(PoolCheckpointerTest, DestructorWritesWhatIsQueued) {
  const std::string root = FreshTestDir();
  {
    PoolCheckpointer checkpoints(Options(root));
    checkpoints.Write(Contents("a", 2), nullptr);
    checkpoints.RecordGroup({"a"}, {{"a", 2}});
  }
  EXPECT_TRUE(VerifyCheckpoint(CheckpointDir(root + "/a", 2)).ok());
  EXPECT_THAT(PoolJson(root), ElementsAre(Pair("a", 2)));
}

}  // namespace
}  // namespace loraplex
