// libFuzzer target: the step plan a follower rank receives from rank 0,
// decoded; what decodes is encoded again and must decode to the same.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "server/trainer/step_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<loraplex::StepPlan> plan = loraplex::DecodeStepPlan(bytes);
  if (!plan.ok()) return 0;
  const std::string again = loraplex::EncodeStepPlan(*plan);
  absl::StatusOr<loraplex::StepPlan> round = loraplex::DecodeStepPlan(again);
  if (!round.ok() || loraplex::EncodeStepPlan(*round) != again) std::abort();
  return 0;
}
