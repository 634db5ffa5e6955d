#include "core/common/resource_names.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace loraplex {
namespace {

using ::testing::HasSubstr;

TEST(ResourceNameTest, AddsTheCollectionToABareId) {
  EXPECT_EQ(ResourceName(kJobs, "abc").value(), "jobs/abc");
  EXPECT_EQ(ResourceName(kDatasets, "d-1").value(), "datasets/d-1");
  EXPECT_EQ(ResourceName(kAdapters, "x_y").value(), "adapters/x_y");
}

TEST(ResourceNameTest, KeepsAFullName) {
  EXPECT_EQ(ResourceName(kJobs, "jobs/abc").value(), "jobs/abc");
  EXPECT_EQ(ResourceName(kAdapters, "adapters/a1").value(), "adapters/a1");
}

TEST(ResourceNameTest, RejectsOtherCollectionsAndEmptyIds) {
  for (const char* bad :
       {"", "datasets/abc", "jobs/", "jobs/a/b", "/abc", "job/abc"}) {
    absl::StatusOr<std::string> name = ResourceName(kJobs, bad);
    ASSERT_FALSE(name.ok()) << bad;
    EXPECT_EQ(name.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(name.status().message(),
                HasSubstr("expected a job ID or jobs/{id}"));
  }
}

TEST(CheckpointNameTest, AcceptsTheFullNameOrABareJobId) {
  EXPECT_EQ(CheckpointName("jobs/abc/checkpoints/40").value(),
            "jobs/abc/checkpoints/40");
  EXPECT_EQ(CheckpointName("abc/checkpoints/0").value(),
            "jobs/abc/checkpoints/0");
  // The step in its canonical form, as the server names it.
  EXPECT_EQ(CheckpointName("jobs/abc/checkpoints/007").value(),
            "jobs/abc/checkpoints/7");
}

TEST(CheckpointNameTest, RejectsOtherNames) {
  for (const char* bad :
       {"", "jobs/abc", "abc", "jobs/abc/checkpoints", "jobs/abc/checkpoints/",
        "jobs//checkpoints/4", "/checkpoints/4", "jobs/abc/checkpoint/4",
        "datasets/abc/checkpoints/4", "jobs/abc/checkpoints/-1",
        "jobs/abc/checkpoints/+1", "jobs/abc/checkpoints/1.5",
        "jobs/abc/checkpoints/ 1", "jobs/abc/checkpoints/4/x",
        "jobs/abc/checkpoints/99999999999999999999"}) {
    absl::StatusOr<std::string> name = CheckpointName(bad);
    ASSERT_FALSE(name.ok()) << bad << " -> " << *name;
    EXPECT_EQ(name.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(name.status().message(),
                HasSubstr("expected a checkpoint jobs/{id}/checkpoints/{step}"))
        << bad;
  }
}

TEST(ResourceIdTest, StripsTheCollection) {
  EXPECT_EQ(ResourceId("jobs/abc"), "abc");
  EXPECT_EQ(ResourceId("abc"), "abc");
  EXPECT_EQ(ResourceCollection("jobs/abc"), "jobs");
  EXPECT_EQ(ResourceCollection("abc"), "");
}

}  // namespace
}  // namespace loraplex
