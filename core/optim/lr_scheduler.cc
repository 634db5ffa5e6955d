#include "core/optim/lr_scheduler.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/common/number_checks.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

constexpr double kPi = 3.14159265358979323846;

}  // namespace

absl::StatusOr<LrScheduler> LrScheduler::Create(const LrScheduleConfig& config,
                                                double peak_lr) {
  LORAPLEX_RETURN_IF_ERROR(ValidateLrScheduleWithPeak(config, peak_lr));
  return LrScheduler(config, peak_lr);
}

double LrScheduler::LrAt(int64_t completed_steps) const {
  const LrScheduleConfig& c = config_;
  const double peak = peak_lr_;
  const double t = static_cast<double>(std::max<int64_t>(completed_steps, 0));
  if (t < c.warmup_steps) {
    return c.init_lr + (peak - c.init_lr) * t / c.warmup_steps;
  }
  if (c.kind == LrScheduleKind::kConstant) return peak;
  if (t >= c.total_steps) return c.min_lr;

  // The decay runs from decay_start to total_steps.
  double decay_start = static_cast<double>(c.warmup_steps);
  if (c.kind == LrScheduleKind::kWsd) {
    const double decay_steps =
        std::max<double>(1.0, std::llround(c.decay_fraction * c.total_steps));
    decay_start = std::max(decay_start, c.total_steps - decay_steps);
    if (t < decay_start) return peak;
  }
  const double progress = (t - decay_start) / (c.total_steps - decay_start);
  if (c.kind == LrScheduleKind::kCosine) {
    return c.min_lr +
           (peak - c.min_lr) * 0.5 * (1.0 + std::cos(kPi * progress));
  }
  return peak + (c.min_lr - peak) * progress;
}

void LrScheduler::ApplyTo(SlotOptimizer& optimizer) const {
  optimizer.SetLr(lr());
}

void LrScheduler::Step(SlotOptimizer& optimizer) {
  ++completed_steps_;
  ApplyTo(optimizer);
}

void LrScheduler::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("completed_steps", c10::IValue(completed_steps_));
}

absl::Status LrScheduler::Load(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  if (!archive.try_read("completed_steps", value) || !value.isInt() ||
      value.toInt() < 0) {
    return absl::InvalidArgumentError(
        "LR scheduler archive: completed_steps must be an integer >= 0");
  }
  completed_steps_ = value.toInt();
  return absl::OkStatus();
}

}  // namespace loraplex
