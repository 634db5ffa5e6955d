#include "core/common/atomic_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;

std::string Read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int EntryCount(const std::string& dir) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    (void)entry;
    ++count;
  }
  return count;
}

TEST(AtomicFileTest, WritesAndReplaces) {
  const std::string dir = FreshTestDir();
  const std::string path = dir + "/config.json";
  ASSERT_TRUE(WriteFileAtomically(path, "first").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(Read(path), "second");
  EXPECT_EQ(EntryCount(dir), 1);  // No temporary left behind.
}

TEST(AtomicFileTest, AbandonedWriterLeavesTargetUntouched) {
  const std::string dir = FreshTestDir();
  const std::string path = dir + "/data.bin";
  ASSERT_TRUE(WriteFileAtomically(path, "kept").ok());
  {
    auto writer = AtomicFileWriter::Create(path);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append("partial", 7).ok());
    EXPECT_EQ(EntryCount(dir), 2);  // Target and temporary.
  }
  EXPECT_EQ(Read(path), "kept");
  EXPECT_EQ(EntryCount(dir), 1);
}

TEST(AtomicFileTest, CommitTwiceIsAnError) {
  const std::string path = FreshTestDir() + "/x";
  auto writer = AtomicFileWriter::Create(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Append("a", 1).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(AtomicFileTest, MissingDirectoryIsAnError) {
  const absl::Status status =
      WriteFileAtomically(FreshTestDir() + "/no/such/dir/file", "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_NE(status.message().find("cannot create"), absl::string_view::npos);
}

TEST(AtomicFileTest, PublishDirectoryReplacesALeftover) {
  const std::string dir = FreshTestDir();
  const std::string staged = dir + "/adapter.staged";
  const std::string path = dir + "/adapter";
  fs::create_directories(path);
  ASSERT_TRUE(WriteFileAtomically(path + "/stale.bin", "old").ok());
  fs::create_directories(staged);
  ASSERT_TRUE(WriteFileAtomically(staged + "/weights.bin", "new").ok());
  ASSERT_TRUE(PublishDirectory(staged, path).ok());
  EXPECT_EQ(Read(path + "/weights.bin"), "new");
  EXPECT_FALSE(fs::exists(path + "/stale.bin"));
  EXPECT_FALSE(fs::exists(staged));
  EXPECT_FALSE(PublishDirectory(dir + "/missing", dir + "/other").ok());
}

}  // namespace
}  // namespace loraplex
