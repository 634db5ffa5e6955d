#include "core/runtime/runtime_info.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <string>

namespace loraplex {
namespace {

// Programs call the C++ runtime's own std::filesystem. The torch wheels are
// linked with parts of a newer libstdc++ built in and export them
// (libtorch_cpu.so defines std::filesystem::remove_all); where LibTorch came
// first in a program's library order, its copy was the one called, and
// against a GPU machine's newer libstdc++ it crashed (a call to address 0).
// The build puts libstdc++ first (CMakeLists.txt).
TEST(RuntimeInfoTest, StdFilesystemIsTheCxxRuntimes) {
  // std::filesystem::remove_all(const path&, error_code&), as the dynamic
  // linker binds it for this program.
  void* remove_all =
      dlsym(RTLD_DEFAULT,
            "_ZNSt10filesystem10remove_allERKNS_7__cxx114pathERSt10error_code");
  if (remove_all == nullptr) {
    GTEST_SKIP() << "the C++ runtime is not libstdc++ (no "
                    "std::filesystem::remove_all of its ABI)";
  }
  Dl_info info{};
  ASSERT_NE(dladdr(remove_all, &info), 0);
  ASSERT_NE(info.dli_fname, nullptr);
  EXPECT_THAT(std::string(info.dli_fname), ::testing::HasSubstr("libstdc++"))
      << "std::filesystem::remove_all is bound to " << info.dli_fname;
}

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
