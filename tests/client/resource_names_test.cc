#include "client/resource_names.h"

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

TEST(ResourceIdTest, StripsTheCollection) {
  EXPECT_EQ(ResourceId("jobs/abc"), "abc");
  EXPECT_EQ(ResourceId("abc"), "abc");
  EXPECT_EQ(ResourceCollection("jobs/abc"), "jobs");
  EXPECT_EQ(ResourceCollection("abc"), "");
}

}  // namespace
}  // namespace loraplex
