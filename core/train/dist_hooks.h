// The two hooks through which the slot pool and the co-batched step run
// data parallel over several processes (docs/DESIGN.md §6). The core knows no
// collectives: adapters/data_parallel_slots.h implements both over c10d.
//
// - ParamClaims: at attach, which of a slot's parameters this process owns
//   (keeps optimizer state for and steps), as the LayerWise distributed
//   optimizer deals the union of every slot's parameters out to the ranks.
// - StepSync: this process trains its share of every slot's rows; `sum`
//   adds the slots' gradients and losses up over the ranks before clipping,
//   and `after_step` gives every rank the parameters their owners updated.
#ifndef LORAPLEX_CORE_TRAIN_DIST_HOOKS_H_
#define LORAPLEX_CORE_TRAIN_DIST_HOOKS_H_

#include <torch/types.h>

#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "core/optim/optimizer_config.h"
#include "core/optim/param_layout.h"

namespace loraplex {

struct TrainingSlot;

class ParamClaims {
 public:
  virtual ~ParamClaims() = default;
  // owned[i]: this process steps params[i] (holding the matrices
  // layouts[i] says) of the slot being attached. The same calls in the same
  // order on every rank give every rank the same (complementary) answer.
  virtual std::vector<bool> Claim(int slot,
                                  const std::vector<torch::Tensor>& params,
                                  const std::vector<ParamLayout>& layouts,
                                  const OptimizerConfig& optimizer) = 0;
  // The slot is free again (retired, or its attach failed).
  virtual void Release(int slot) = 0;
};

struct StepSync {
  int rank = 0;
  int world_size = 1;
  // Replaces each tensor by its sum over the ranks.
  std::function<absl::Status(std::vector<torch::Tensor>&)> sum;
  // After the owners stepped: every rank gets the updated parameters of
  // `slots`.
  std::function<absl::Status(const std::vector<TrainingSlot*>& slots)>
      after_step;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_DIST_HOOKS_H_
