#include "core/runtime/runtime_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loraplex {
namespace {

using ::testing::ElementsAre;

RuntimeInfo CpuRuntime() {
  RuntimeInfo runtime;
  runtime.torch_version = "2.15.0";
  runtime.blas = "MKL 2024.2 (built into LibTorch)";
  runtime.cpu_capability = "AVX2";
  runtime.intra_op_threads = 2;
  runtime.inter_op_threads = 1;
  return runtime;
}

TEST(RuntimeTextTest, CpuOnlyBuild) {
  EXPECT_THAT(RuntimeLines(CpuRuntime()),
              ElementsAre("LibTorch: 2.15.0, CPU only",
                          "BLAS: MKL 2024.2 (built into LibTorch)",
                          "CPU: 2 intra-op thread(s), 1 inter-op thread(s), "
                          "kernels for AVX2, OMP_WAIT_POLICY unset"));
}

TEST(RuntimeTextTest, CudaBuildWithoutADevice) {
  RuntimeInfo runtime = CpuRuntime();
  runtime.cpu_capability = "";
  runtime.openmp_wait_policy = "passive";
  runtime.cuda_compiled = true;
  runtime.cuda_runtime_version = "13.2";
  runtime.cuda_note = "no NVIDIA driver";
  EXPECT_THAT(RuntimeLines(runtime),
              ElementsAre("LibTorch: 2.15.0, CUDA runtime 13.2",
                          "BLAS: MKL 2024.2 (built into LibTorch)",
                          "CPU: 2 intra-op thread(s), 1 inter-op thread(s), "
                          "OMP_WAIT_POLICY passive",
                          "CUDA: not available (no NVIDIA driver)"));
}

TEST(RuntimeTextTest, OneLinePerDevice) {
  RuntimeInfo runtime = CpuRuntime();
  runtime.cuda_compiled = true;
  runtime.cuda_runtime_version = "13.2";
  runtime.cuda_driver_version = "13.1";
  for (int index = 0; index < 2; ++index) {
    CudaDeviceInfo& device = runtime.cuda_devices.emplace_back();
    device.index = index;
    device.name = "NVIDIA H200";
    device.compute_capability_major = 9;
    device.compute_capability_minor = 0;
    device.total_memory_bytes = int64_t{143771} << 20;  // 140.4 GiB
  }
  const std::vector<std::string> lines = RuntimeLines(runtime);
  ASSERT_EQ(lines.size(), 5u);
  EXPECT_EQ(lines[3],
            "CUDA device 0: NVIDIA H200, compute capability 9.0, 140.4 GiB, "
            "driver 13.1");
  EXPECT_EQ(lines[4].substr(0, 14), "CUDA device 1:");
}

}  // namespace
}  // namespace loraplex
