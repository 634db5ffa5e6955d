// Which BLAS the process actually runs on, and whether it will be slow.
//
// LibTorch's CPU GEMMs go through the system BLAS. On Debian that is the
// reference BLAS unless OpenBLAS is installed and selected (~25x slower),
// and OpenBLAS releases that predate a CPU fall back to generic SSE3
// ("Prescott") kernels (~4x slower on AVX-512 machines). Programs log
// BlasPerformanceWarning() at start so users see this before training.
#ifndef LORAPLEX_CORE_RUNTIME_BLAS_INFO_H_
#define LORAPLEX_CORE_RUNTIME_BLAS_INFO_H_

#include <string>
#include <vector>

namespace loraplex {

struct BlasInfo {
  // Shared objects mapped into this process whose file name mentions BLAS.
  std::vector<std::string> libraries;
  // OpenBLAS's kernel family (e.g. "SkylakeX"); empty if not OpenBLAS.
  std::string openblas_core;
};

BlasInfo InspectBlas();

struct CpuFeatures {
  bool avx2 = false;
  bool avx512f = false;
};

CpuFeatures DetectCpuFeatures();

// Advice when the BLAS in use is known to be slow on this CPU; empty if not.
std::string BlasPerformanceWarning(const BlasInfo& blas,
                                   const CpuFeatures& cpu);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_BLAS_INFO_H_
