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

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_DEVICE_H_
