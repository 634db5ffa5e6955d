// One slot's learning-rate schedule: linear warmup from init_lr to the peak
// lr (the optimizer config's lr) over warmup_steps, then constant / linear /
// cosine / wsd down to min_lr at total_steps (and min_lr after that).
//
// The schedule is indexed by the number of optimizer steps the slot has
// completed, t (as Hugging Face schedulers): step t+1 runs with LrAt(t), so
// the first step uses init_lr and step warmup_steps+1 uses lr. The caller
// advances it only after a step really happened:
//
//   LORAPLEX_ASSIGN_OR_RETURN(LrScheduler schedule,
//                             LrScheduler::Create(cfg, optimizer_config.lr));
//   schedule.ApplyTo(optimizer);              // lr for the first step
//   ... if (norm.finite) { optimizer.Step(); schedule.Step(optimizer); }
#ifndef LORAPLEX_CORE_OPTIM_LR_SCHEDULER_H_
#define LORAPLEX_CORE_OPTIM_LR_SCHEDULER_H_

#include <torch/serialize/archive.h>

#include <array>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/optim/lr_schedule_config.h"
#include "core/optim/slot_optimizer.h"

namespace loraplex {

class LrScheduler {
 public:
  // `peak_lr` is the optimizer config's lr; min_lr must not exceed it.
  static absl::StatusOr<LrScheduler> Create(const LrScheduleConfig& config,
                                            double peak_lr);

  // The learning rate for the step after `completed_steps` steps.
  double LrAt(int64_t completed_steps) const;
  // The learning rate of the next step.
  double lr() const { return LrAt(completed_steps_); }
  int64_t completed_steps() const { return completed_steps_; }
  const LrScheduleConfig& config() const { return config_; }
  double peak_lr() const { return peak_lr_; }

  // Sets the optimizer's learning rate to lr().
  void ApplyTo(SlotOptimizer& optimizer) const;
  // Records one completed optimizer step and applies the next lr. Do not
  // call for a skipped (non-finite) step.
  void Step(SlotOptimizer& optimizer);

  void Save(torch::serialize::OutputArchive& archive) const;
  // INVALID_ARGUMENT (state unchanged) for a malformed archive.
  absl::Status Load(torch::serialize::InputArchive& archive);

 private:
  LrScheduler(const LrScheduleConfig& config, double peak_lr)
      : config_(config), peak_lr_(peak_lr) {}

  LrScheduleConfig config_;
  double peak_lr_;
  int64_t completed_steps_ = 0;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_LR_SCHEDULER_H_
