#include "core/runtime/runtime_info.h"

#include <ATen/Parallel.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/runtime/blas_info.h"
#include "core/runtime/torch_compat.h"

#ifdef LORAPLEX_TORCH_HAS_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>
#endif

namespace loraplex {
namespace {

std::string CudaVersionText(int version) {
  // CUDA encodes 13.2 as 13020.
  return absl::StrCat(version / 1000, ".", (version % 1000) / 10);
}

void InspectCuda(RuntimeInfo& info) {
#ifdef LORAPLEX_TORCH_HAS_CUDA
  info.cuda_compiled = true;
  int runtime = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess && runtime > 0) {
    info.cuda_runtime_version = CudaVersionText(runtime);
  }
  int driver = 0;
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0) {
    info.cuda_driver_version = CudaVersionText(driver);
  } else {
    info.cuda_note = "no NVIDIA driver";
    return;
  }
  const int count = static_cast<int>(c10::cuda::device_count());
  if (count == 0) {
    info.cuda_note = "no CUDA device visible";
    return;
  }
  for (int index = 0; index < count; ++index) {
    cudaDeviceProp properties{};
    if (cudaGetDeviceProperties(&properties, index) != cudaSuccess) continue;
    CudaDeviceInfo device;
    device.index = index;
    device.name = properties.name;
    device.compute_capability_major = properties.major;
    device.compute_capability_minor = properties.minor;
    device.total_memory_bytes = static_cast<int64_t>(properties.totalGlobalMem);
    info.cuda_devices.push_back(std::move(device));
  }
  cudaGetLastError();  // Leave no sticky error for LibTorch's next call.
#else
  info.cuda_compiled = false;
#endif
}

}  // namespace

RuntimeInfo InspectRuntime() {
  RuntimeInfo info;
  info.torch_version = TORCH_VERSION;
  info.blas = DescribeBlas(InspectBlas());
  info.cpu_capability = CpuCapability();
  info.intra_op_threads = at::get_num_threads();
  info.inter_op_threads = at::get_num_interop_threads();
  if (const char* policy = std::getenv("OMP_WAIT_POLICY")) {
    info.openmp_wait_policy = policy;
  }
  InspectCuda(info);
  return info;
}

}  // namespace loraplex
