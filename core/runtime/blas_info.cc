#include "core/runtime/blas_info.h"

#include <ATen/Version.h>
#include <dlfcn.h>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace loraplex {
namespace {

bool Mentions(const std::vector<std::string>& libraries, const char* word) {
  return std::any_of(
      libraries.begin(), libraries.end(), [&](const std::string& path) {
        return absl::StrContains(
            std::filesystem::path(path).filename().string(), word);
      });
}

// The value of `key=` in LibTorch's build settings ("BLAS_INFO=mkl, ...").
std::string BuildSetting(const std::string& config, const std::string& key) {
  const std::string needle = key + "=";
  size_t at = config.find(needle);
  if (at == std::string::npos) return "";
  at += needle.size();
  const size_t end = config.find_first_of(",\n", at);
  return config.substr(at, end == std::string::npos ? end : end - at);
}

// "Intel(R) oneAPI Math Kernel Library Version 2024.2-Product Build ..." ->
// "2024.2".
std::string MklVersion(const std::string& text) {
  const std::string needle = "Version ";
  const size_t at = text.find(needle);
  if (at == std::string::npos) return "";
  const size_t start = at + needle.size();
  const size_t end = text.find_first_of("- ", start);
  return text.substr(start, end == std::string::npos ? end : end - start);
}

}  // namespace

BlasInfo InspectBlas() {
  BlasInfo info;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const auto slash = line.find('/');
    if (slash == std::string::npos) continue;
    std::error_code error;
    std::string path =
        std::filesystem::weakly_canonical(line.substr(slash), error).string();
    if (error) path = line.substr(slash);
    const std::string file = std::filesystem::path(path).filename().string();
    if (absl::StrContains(file, "blas") &&
        std::find(info.libraries.begin(), info.libraries.end(), path) ==
            info.libraries.end()) {
      info.libraries.push_back(path);
    }
  }
  using CoreNameFn = char* (*)();
  if (auto corename = reinterpret_cast<CoreNameFn>(
          dlsym(RTLD_DEFAULT, "openblas_get_corename"))) {
    if (const char* name = corename()) info.openblas_core = name;
  }
  info.libtorch_blas = BuildSetting(at::show_config(), "BLAS_INFO");
  if (info.libtorch_blas == "mkl") {
    info.mkl_version = MklVersion(at::get_mkl_version());
  }
  return info;
}

std::string DescribeBlas(const BlasInfo& blas) {
  std::string text;
  if (blas.libtorch_blas == "mkl") {
    // Linked statically into libtorch_cpu: no shared object to look for.
    text = absl::StrCat("MKL", blas.mkl_version.empty() ? "" : " ",
                        blas.mkl_version, " (built into LibTorch)");
  } else if (!blas.openblas_core.empty()) {
    text = absl::StrCat("OpenBLAS, ", blas.openblas_core, " kernels");
  } else if (!blas.libtorch_blas.empty()) {
    text = blas.libtorch_blas;
  } else {
    text = "unknown";
  }
  if (blas.libtorch_blas != "mkl" && !blas.libraries.empty()) {
    absl::StrAppend(&text, " (", absl::StrJoin(blas.libraries, ", "), ")");
  }
  return text;
}

CpuFeatures DetectCpuFeatures() {
  CpuFeatures cpu;
#if defined(__x86_64__)
  __builtin_cpu_init();
  cpu.avx2 = __builtin_cpu_supports("avx2");
  cpu.avx512f = __builtin_cpu_supports("avx512f");
#endif
  return cpu;
}

std::string BlasPerformanceWarning(const BlasInfo& blas,
                                   const CpuFeatures& cpu) {
  if (blas.libtorch_blas == "mkl") return "";
  const bool openblas =
      !blas.openblas_core.empty() || Mentions(blas.libraries, "openblas");
  if (!openblas && !Mentions(blas.libraries, "mkl")) {
    return "no optimized BLAS is loaded (reference BLAS is ~25x slower): "
           "install libopenblas0-pthread and select it with "
           "update-alternatives (deploy/setup.sh does both)";
  }
  const std::string& core = blas.openblas_core;
  const bool generic = core == "Prescott" || core == "Core2" ||
                       core == "Nehalem" || core == "Katmai" ||
                       core == "Banias";
  if (openblas && generic && (cpu.avx2 || cpu.avx512f)) {
    return absl::StrCat(
        "OpenBLAS does not recognize this CPU and runs its generic \"", core,
        "\" kernels (several times slower); start with OPENBLAS_CORETYPE=",
        cpu.avx512f ? "SkylakeX" : "Haswell", " to use the ",
        cpu.avx512f ? "AVX-512" : "AVX2", " kernels");
  }
  return "";
}

}  // namespace loraplex
