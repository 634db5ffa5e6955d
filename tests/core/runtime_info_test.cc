#include "core/runtime/runtime_info.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

namespace loraplex {
namespace {

TEST(RuntimeInfoTest, NamesThisLibTorchAndItsThreads) {
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  const RuntimeInfo one = InspectRuntime();
  at::set_num_threads(threads);
  EXPECT_EQ(one.torch_version, TORCH_VERSION);
  EXPECT_EQ(one.intra_op_threads, 1);
  EXPECT_EQ(InspectRuntime().intra_op_threads, threads);
  EXPECT_GE(one.inter_op_threads, 1);
  EXPECT_NE(one.blas, "unknown");
  if (TORCH_VERSION_MAJOR >= 2) {
    EXPECT_FALSE(one.cpu_capability.empty());
  }
}

// Every device LibTorch can use is listed, with its properties; without
// one, a CUDA build says why.
TEST(RuntimeInfoTest, ListsTheDevicesLibTorchSeesOnCuda) {
  const RuntimeInfo info = InspectRuntime();
  if (!torch::cuda::is_available()) {
    EXPECT_TRUE(info.cuda_devices.empty());
    if (info.cuda_compiled) {
      EXPECT_FALSE(info.cuda_note.empty());
    }
    GTEST_SKIP() << "no CUDA device; the build "
                 << (info.cuda_compiled ? "has" : "has no") << " CUDA";
  }
  EXPECT_TRUE(info.cuda_compiled);
  ASSERT_EQ(info.cuda_devices.size(), torch::cuda::device_count());
  for (const CudaDeviceInfo& device : info.cuda_devices) {
    EXPECT_FALSE(device.name.empty());
    EXPECT_GE(device.compute_capability_major, 5);
    EXPECT_GT(device.total_memory_bytes, int64_t{1} << 30);
  }
  EXPECT_FALSE(info.cuda_runtime_version.empty());
  EXPECT_FALSE(info.cuda_driver_version.empty());
}

}  // namespace
}  // namespace loraplex
