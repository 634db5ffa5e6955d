// A slot's learning-rate schedule as plain values: the kind (with the name
// the API spells it by), warmup, decay and the step count, and their
// validation. No LibTorch here; LrScheduler (lr_scheduler.h) follows it.
//
//   LrScheduleConfig schedule{.kind = LrScheduleKind::kWsd,
//                             .warmup_steps = 100, .total_steps = 2000};
//   LORAPLEX_RETURN_IF_ERROR(ValidateLrScheduleConfig(schedule));
#ifndef LORAPLEX_CORE_OPTIM_LR_SCHEDULE_CONFIG_H_
#define LORAPLEX_CORE_OPTIM_LR_SCHEDULE_CONFIG_H_

#include <array>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace loraplex {

enum class LrScheduleKind {
  kConstant,  // lr after warmup, forever.
  kLinear,    // Straight line from lr to min_lr at total_steps.
  kCosine,    // Half cosine from lr to min_lr at total_steps.
  kWsd,       // Warmup-stable-decay: lr until the last
              // round(decay_fraction · total_steps) steps (at least one),
              // then a straight line to min_lr.
};

inline constexpr std::array<LrScheduleKind, 4> kAllLrScheduleKinds = {
    LrScheduleKind::kConstant, LrScheduleKind::kLinear, LrScheduleKind::kCosine,
    LrScheduleKind::kWsd};

absl::string_view LrScheduleKindName(LrScheduleKind kind);
std::optional<LrScheduleKind> ParseLrScheduleKind(absl::string_view name);

struct LrScheduleConfig {
  LrScheduleKind kind = LrScheduleKind::kCosine;
  double init_lr = 0.0;  // Start of warmup.
  double min_lr = 0.0;   // End of decay.
  int64_t warmup_steps = 0;
  int64_t total_steps = 1000;
  // wsd only: the share of total_steps spent decaying.
  double decay_fraction = 0.1;
};

// INVALID_ARGUMENT naming the first bad field ("schedule.warmup_steps must
// be in [0, total_steps = 100], got 200"), else OK.
absl::Status ValidateLrScheduleConfig(const LrScheduleConfig& config);
// ValidateLrScheduleConfig, and that `peak_lr` (the optimizer's lr) is
// finite and >= 0 and not below min_lr. LrScheduler::Create accepts exactly
// these.
absl::Status ValidateLrScheduleWithPeak(const LrScheduleConfig& config,
                                        double peak_lr);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_LR_SCHEDULE_CONFIG_H_
