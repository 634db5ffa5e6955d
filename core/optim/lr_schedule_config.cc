#include "core/optim/lr_schedule_config.h"

#include "absl/strings/str_cat.h"
#include "core/common/enum_names.h"
#include "core/common/number_checks.h"
#include "core/common/status_macros.h"

namespace loraplex {

absl::string_view LrScheduleKindName(LrScheduleKind kind) {
  switch (kind) {
    case LrScheduleKind::kConstant:
      return "constant";
    case LrScheduleKind::kLinear:
      return "linear";
    case LrScheduleKind::kCosine:
      return "cosine";
    case LrScheduleKind::kWsd:
      return "wsd";
  }
  return "unknown";
}

std::optional<LrScheduleKind> ParseLrScheduleKind(absl::string_view name) {
  return ParseEnumName(name, kAllLrScheduleKinds, &LrScheduleKindName);
}

absl::Status ValidateLrScheduleConfig(const LrScheduleConfig& config) {
  auto invalid = [](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat("schedule.", parts...));
  };
  if (!IsFiniteNonNegative(config.init_lr)) {
    return invalid("init_lr must be a finite number >= 0, got ",
                   config.init_lr);
  }
  if (!IsFiniteNonNegative(config.min_lr)) {
    return invalid("min_lr must be a finite number >= 0, got ", config.min_lr);
  }
  if (config.total_steps < 1) {
    return invalid("total_steps must be >= 1, got ", config.total_steps);
  }
  if (config.warmup_steps < 0 || config.warmup_steps > config.total_steps) {
    return invalid("warmup_steps must be in [0, total_steps = ",
                   config.total_steps, "], got ", config.warmup_steps);
  }
  if (!(config.decay_fraction > 0.0 && config.decay_fraction <= 1.0)) {
    return invalid("decay_fraction must be in (0, 1], got ",
                   config.decay_fraction);
  }
  return absl::OkStatus();
}

absl::Status ValidateLrScheduleWithPeak(const LrScheduleConfig& config,
                                        double peak_lr) {
  LORAPLEX_RETURN_IF_ERROR(ValidateLrScheduleConfig(config));
  if (!IsFiniteNonNegative(peak_lr)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.lr must be a finite number >= 0, got ", peak_lr));
  }
  if (config.min_lr > peak_lr) {
    return absl::InvalidArgumentError(
        absl::StrCat("schedule.min_lr must be <= optimizer.lr (", peak_lr,
                     "), got ", config.min_lr));
  }
  return absl::OkStatus();
}

}  // namespace loraplex
