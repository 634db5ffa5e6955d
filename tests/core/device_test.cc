#include "core/runtime/device.h"

#include <ATen/Parallel.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

namespace loraplex {
namespace {

using ::testing::HasSubstr;

TEST(DeviceTest, ParsesCpu) {
  auto device = ParseDevice("cpu");
  ASSERT_TRUE(device.ok());
  EXPECT_TRUE(device->is_cpu());
}

TEST(DeviceTest, RejectsMalformedSpecs) {
  for (const char* spec : {"gpu", "cuda:", "cuda:x", "cuda:-1", "cuda0", ""}) {
    auto device = ParseDevice(spec);
    ASSERT_FALSE(device.ok()) << spec;
    EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument)
        << spec;
    EXPECT_THAT(std::string(device.status().message()),
                HasSubstr("device must be \"cpu\", \"cuda\" or \"cuda:N\""));
  }
}

TEST(DeviceTest, CudaWithoutCudaIsAClearError) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA present";
  auto device = ParseDevice("cuda:0");
  ASSERT_FALSE(device.ok());
  EXPECT_EQ(device.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(device.status().message()),
              HasSubstr("no CUDA support or no CUDA device"));
}

TEST(DeviceTest, IndexBeyondDeviceCountIsRejectedOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "needs CUDA";
  auto device = ParseDevice("cuda:999");
  EXPECT_EQ(device.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(DeviceTest, ConfiguresThreads) {
  auto one = ConfigureThreads(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, 1);
  EXPECT_EQ(at::get_num_threads(), 1);
  auto all = ConfigureThreads(0);
  ASSERT_TRUE(all.ok());
  EXPECT_GE(*all, 1);
  EXPECT_FALSE(ConfigureThreads(-2).ok());
}

}  // namespace
}  // namespace loraplex
