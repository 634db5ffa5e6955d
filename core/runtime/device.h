// Device selection and CPU thread configuration.
//
// Every component takes its device as a parameter; this parses the user's
// spelling ("cpu", "cuda", "cuda:N") and checks that the running LibTorch can
// actually provide it, so a CPU-only build asked for CUDA fails with a clear
// message instead of deep inside a kernel.
#ifndef LORAPLEX_CORE_RUNTIME_DEVICE_H_
#define LORAPLEX_CORE_RUNTIME_DEVICE_H_

#include <torch/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace loraplex {

// Parses and validates a device spec ("cpu", "cuda", "cuda:N").
absl::StatusOr<torch::Device> ParseDevice(absl::string_view spec);

// Sets LibTorch's intra-op thread count; 0 means one per logical core.
// Returns the count in effect.
absl::StatusOr<int> ConfigureThreads(int threads);

// Where LibTorch's BLAS runs threads of its own (OpenBLAS, with Debian's
// LibTorch), LibTorch's OpenMP threads spin-waiting between parallel regions
// keep cores busy that those threads need for the next GEMM; on 2 cores that
// halved the small model's forward throughput. OpenMP reads OMP_WAIT_POLICY
// only at start-up, so there, when it is unset, this sets it to "passive"
// and re-executes the program (same arguments) once. Where the BLAS is
// LibTorch's own MKL (PyPI's LibTorch), which shares the OpenMP threads, it
// does nothing: there passive waiting only adds a wake-up to every parallel
// region (2.2x the step time for 32-token rows on 2 cores, measured with
// bench/compare_builds.py). Call first thing in main(); returns only when
// nothing needed doing or the exec failed.
void ReexecWithPassiveOpenMpWait(char** argv);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_DEVICE_H_
