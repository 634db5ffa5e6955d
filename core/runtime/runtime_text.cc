#include "core/runtime/runtime_text.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace loraplex {

std::vector<std::pair<std::string, std::string>> RuntimeFacts(
    const RuntimeInfo& runtime) {
  std::vector<std::pair<std::string, std::string>> facts;
  std::string cuda = ", CPU only";
  if (runtime.cuda_compiled) {
    cuda = absl::StrCat(", CUDA runtime ", runtime.cuda_runtime_version.empty()
                                               ? "unknown"
                                               : runtime.cuda_runtime_version);
  }
  facts.emplace_back("LibTorch", absl::StrCat(runtime.torch_version, cuda));
  facts.emplace_back("BLAS", runtime.blas);
  facts.emplace_back(
      "CPU",
      absl::StrCat(runtime.intra_op_threads, " intra-op thread(s), ",
                   runtime.inter_op_threads, " inter-op thread(s)",
                   runtime.cpu_capability.empty()
                       ? ""
                       : absl::StrCat(", kernels for ", runtime.cpu_capability),
                   ", OMP_WAIT_POLICY ",
                   runtime.openmp_wait_policy.empty()
                       ? "unset"
                       : runtime.openmp_wait_policy));
  if (!runtime.cuda_compiled) return facts;
  if (runtime.cuda_devices.empty()) {
    facts.emplace_back("CUDA",
                       absl::StrCat("not available (", runtime.cuda_note, ")"));
    return facts;
  }
  for (const CudaDeviceInfo& device : runtime.cuda_devices) {
    facts.emplace_back(
        absl::StrCat("CUDA device ", device.index),
        absl::StrFormat(
            "%s, compute capability %d.%d, %.1f GiB, driver %s", device.name,
            device.compute_capability_major, device.compute_capability_minor,
            static_cast<double>(device.total_memory_bytes) / (1 << 30),
            runtime.cuda_driver_version));
  }
  return facts;
}

std::vector<std::string> RuntimeLines(const RuntimeInfo& runtime) {
  std::vector<std::string> lines;
  for (const auto& [label, text] : RuntimeFacts(runtime)) {
    lines.push_back(absl::StrCat(label, ": ", text));
  }
  return lines;
}

}  // namespace loraplex
