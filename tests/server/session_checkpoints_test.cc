#include "server/checkpoints/session_checkpoints.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

TEST(SessionCheckpointsTest, TheNewestPublishedOneIsLoadedAndOlderOnesGo) {
  const std::string root = FreshTestDir("session-checkpoints");
  EXPECT_FALSE(LatestSessionCheckpoint(root, "s").has_value());
  for (int64_t seq : {4, 12, 9}) {
    fs::create_directories(SessionCheckpointDir(root, "s", seq));
  }
  // A write a crash cut short, and another session's checkpoint.
  fs::create_directories(SessionCheckpointDir(root, "s", 20) + ".staged");
  fs::create_directories(SessionCheckpointDir(root, "other", 30));
  EXPECT_EQ(SessionCheckpointDir(root, "s", 12), root + "/s/seq-000000000012");
  auto latest = LatestSessionCheckpoint(root, "s");
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(latest->seq_id, 12);
  EXPECT_EQ(latest->dir, SessionCheckpointDir(root, "s", 12));

  RemoveSessionCheckpointsBefore(root, "s", 12);
  EXPECT_FALSE(fs::exists(SessionCheckpointDir(root, "s", 4)));
  EXPECT_FALSE(fs::exists(SessionCheckpointDir(root, "s", 9)));
  EXPECT_FALSE(fs::exists(SessionCheckpointDir(root, "s", 20) + ".staged"));
  EXPECT_TRUE(fs::exists(SessionCheckpointDir(root, "s", 12)));
  EXPECT_TRUE(fs::exists(SessionCheckpointDir(root, "other", 30)));

  RemoveSessionCheckpoints(root, "s");
  EXPECT_FALSE(LatestSessionCheckpoint(root, "s").has_value());
  EXPECT_TRUE(LatestSessionCheckpoint(root, "other").has_value());
}

}  // namespace
}  // namespace loraplex
