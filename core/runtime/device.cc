#include "core/runtime/device.h"

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <unistd.h>

#include <cstdlib>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "core/runtime/blas_info.h"

namespace loraplex {

absl::StatusOr<torch::Device> ParseDevice(absl::string_view spec) {
  if (spec == "cpu") return torch::Device(torch::kCPU);
  if (spec.substr(0, 4) != "cuda") {
    return absl::InvalidArgumentError(absl::StrCat(
        "device must be \"cpu\", \"cuda\" or \"cuda:N\", got \"", spec, "\""));
  }
  int index = 0;
  if (spec.size() > 4) {
    if (spec[4] != ':' || !absl::SimpleAtoi(spec.substr(5), &index) ||
        index < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("device must be \"cpu\", \"cuda\" or \"cuda:N\", got \"",
                       spec, "\""));
    }
  }
  if (!torch::cuda::is_available()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "device \"", spec,
        "\" requested, but this LibTorch has no CUDA support or no CUDA "
        "device is visible"));
  }
  const int count = static_cast<int>(torch::cuda::device_count());
  if (index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("device \"", spec, "\" requested, but only ", count,
                     " CUDA devices exist"));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(index));
}

absl::StatusOr<int> ConfigureThreads(int threads) {
  if (threads < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads must be >= 0 (0 = all cores), got ", threads));
  }
  if (threads == 0) {
    threads = static_cast<int>(std::thread::hardware_concurrency());
    if (threads <= 0) threads = 1;
  }
  at::set_num_threads(threads);
  return at::get_num_threads();
}

void ReexecWithPassiveOpenMpWait(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr) return;
  if (InspectBlas().libtorch_blas == "mkl") return;
  if (setenv("OMP_WAIT_POLICY", "passive", /*overwrite=*/0) != 0) return;
  execv("/proc/self/exe", argv);
  // Still here: the exec failed; run on with the default policy.
}

}  // namespace loraplex
