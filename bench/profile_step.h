// One step of a benchmark under LibTorch's profiler, for the benchmarks'
// --profile option.
#ifndef LORAPLEX_BENCH_PROFILE_STEP_H_
#define LORAPLEX_BENCH_PROFILE_STEP_H_

#include <torch/torch.h>

#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

#include "core/runtime/step_profile.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {

// Runs `step` once under the profiler (after it ran untimed, so the
// allocator and kernels are warm), prints where its time went, writes the
// trace to `dir`/`name`.json and returns a one-line summary, which says so
// when the profiler could not run (the benchmark goes on without it).
inline std::string ProfileStep(const std::function<void()>& step,
                               const torch::Device& device,
                               const std::string& dir,
                               const std::string& name) {
  step();
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  const std::string trace =
      (std::filesystem::path(dir) / (name + ".json")).string();
  const absl::StatusOr<std::vector<ProfiledEvent>> events =
      ProfileCall(step, device.is_cuda(), trace);
  if (!events.ok()) {
    std::cerr << "profiling " << name << ": " << events.status() << "\n";
    return "SUMMARY profile " + name +
           ": not available: " + std::string(events.status().message());
  }
  const ProfileSummary profile = SummarizeProfile(*events);
  std::cout << "  profile of " << name << " (trace " << trace
            << "): " << FormatProfile(profile, 15);
  std::ostringstream line;
  line << std::fixed << std::setprecision(1) << "SUMMARY profile " << name
       << ": " << profile.span_ns / 1e6 << " ms, " << profile.top_level_ops
       << " operators called (" << profile.cpu_ops << " in all)";
  if (profile.device_events > 0) {
    line << ", " << profile.device_events << " device kernels/copies, device "
         << "busy " << DeviceBusyPercent(profile) << "% of the step";
  }
  return line.str();
}

}  // namespace loraplex

#endif  // LORAPLEX_BENCH_PROFILE_STEP_H_
