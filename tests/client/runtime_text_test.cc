#include "proto/runtime_text.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace loraplex {
namespace {

using ::testing::ElementsAre;

v1::Runtime CpuRuntime() {
  v1::Runtime runtime;
  runtime.set_torch_version("2.15.0");
  runtime.set_blas("MKL 2024.2 (built into LibTorch)");
  runtime.set_cpu_capability("AVX2");
  runtime.set_intra_op_threads(2);
  runtime.set_inter_op_threads(1);
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
  v1::Runtime runtime = CpuRuntime();
  runtime.set_cpu_capability("");
  runtime.set_openmp_wait_policy("passive");
  runtime.set_cuda_compiled(true);
  runtime.set_cuda_runtime_version("13.2");
  runtime.set_cuda_note("no NVIDIA driver");
  EXPECT_THAT(RuntimeLines(runtime),
              ElementsAre("LibTorch: 2.15.0, CUDA runtime 13.2",
                          "BLAS: MKL 2024.2 (built into LibTorch)",
                          "CPU: 2 intra-op thread(s), 1 inter-op thread(s), "
                          "OMP_WAIT_POLICY passive",
                          "CUDA: not available (no NVIDIA driver)"));
}

TEST(RuntimeTextTest, OneLinePerDevice) {
  v1::Runtime runtime = CpuRuntime();
  runtime.set_cuda_compiled(true);
  runtime.set_cuda_runtime_version("13.2");
  runtime.set_cuda_driver_version("13.1");
  for (int index = 0; index < 2; ++index) {
    v1::CudaDevice* device = runtime.add_cuda_devices();
    device->set_index(index);
    device->set_name("NVIDIA H200");
    device->set_compute_capability_major(9);
    device->set_compute_capability_minor(0);
    device->set_total_memory_bytes(int64_t{143771} << 20);  // 140.4 GiB
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
