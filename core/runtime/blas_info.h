// Which BLAS the process actually runs on, and whether it will be slow.
//
// PyPI's LibTorch (the default build) has MKL linked in. Debian's LibTorch
// goes through the system BLAS: the reference BLAS unless OpenBLAS is
// installed and selected (~25x slower), and OpenBLAS releases that predate a
// CPU fall back to generic SSE3 ("Prescott") kernels (~4x slower on AVX-512
// machines). Programs log BlasPerformanceWarning() at start so users see
// this before training.
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
  // The BLAS LibTorch was built for (its BLAS_INFO setting: "mkl", "open",
  // "generic", ...), and MKL's version when that is MKL (e.g. "2024.2").
  std::string libtorch_blas;
  std::string mkl_version;
};

BlasInfo InspectBlas();

struct CpuFeatures {
  bool avx2 = false;
  bool avx512f = false;
};

CpuFeatures DetectCpuFeatures();

// One line for logs: "MKL 2024.2 (built into LibTorch)",
// "OpenBLAS, Haswell kernels (/usr/lib/...)", ...
std::string DescribeBlas(const BlasInfo& blas);

// Advice when the BLAS in use is known to be slow on this CPU; empty if not.
std::string BlasPerformanceWarning(const BlasInfo& blas,
                                   const CpuFeatures& cpu);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_BLAS_INFO_H_
