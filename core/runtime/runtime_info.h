// What the process runs on: LibTorch, BLAS, threads and CUDA devices.
// `loraplex-server --version` prints it, the server logs it at start, and
// GetServerInfo answers it (`loraplex info`), all as
// core/runtime/runtime_text.h writes it.
#ifndef LORAPLEX_CORE_RUNTIME_RUNTIME_INFO_H_
#define LORAPLEX_CORE_RUNTIME_RUNTIME_INFO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace loraplex {

struct CudaDeviceInfo {
  int index = 0;
  std::string name;
  int compute_capability_major = 0;
  int compute_capability_minor = 0;
  int64_t total_memory_bytes = 0;
};

struct RuntimeInfo {
  std::string torch_version;  // e.g. "2.15.0"
  // The BLAS LibTorch's CPU GEMMs run on, e.g. "MKL (built into LibTorch)"
  // or "OpenBLAS, Haswell kernels (/usr/lib/...)".
  std::string blas;
  // The widest vector instructions LibTorch's CPU kernels use ("AVX512",
  // "AVX2", "DEFAULT"); empty where LibTorch cannot say (1.13).
  std::string cpu_capability;
  int intra_op_threads = 0;
  int inter_op_threads = 0;
  // OMP_WAIT_POLICY as the process runs with it; empty when unset
  // (ReexecWithPassiveOpenMpWait sets it where the BLAS needs it).
  std::string openmp_wait_policy;
  // Whether this LibTorch was built with CUDA, the CUDA runtime and driver
  // versions it found (e.g. "13.2"), and the devices it sees.
  bool cuda_compiled = false;
  std::string cuda_runtime_version;
  std::string cuda_driver_version;
  std::vector<CudaDeviceInfo> cuda_devices;
  // Why there are no devices when CUDA is compiled in (no driver, ...).
  std::string cuda_note;
};

// Reads it from this process. Initializes CUDA when it is compiled in.
RuntimeInfo InspectRuntime();

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_RUNTIME_INFO_H_
