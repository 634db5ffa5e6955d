// What one co-batched training step did for one slot: its loss, learning
// rate, gradient norm, token counts and router statistics, or why its update
// was skipped. No LibTorch here: the service reports these without the engine's
// headers.
#ifndef LORAPLEX_CORE_TRAIN_STEP_METRICS_H_
#define LORAPLEX_CORE_TRAIN_STEP_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

namespace loraplex {

struct SlotStepMetrics {
  double loss = 0.0;       // Masked mean token cross-entropy of the batch.
  double lr = 0.0;         // The learning rate of this step.
  double grad_norm = 0.0;  // Before clipping.
  int64_t target_tokens = 0;
  int64_t tokens = 0;  // All tokens of the batch's sequences.
  // Mixture-of-experts bases: the tokens of the batch each expert received,
  // summed over the sparse layers (top_k per token and layer, so they add
  // up to top_k × tokens × sparse layers); empty on a dense base.
  std::vector<int64_t> expert_tokens;
  bool skipped = false;
  std::string skip_reason;  // Set when skipped.
  // Set when this slot's optimizer step failed (TrainCoBatchStep): the
  // step did not count, and the slot's job must stop.
  std::string failure;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_STEP_METRICS_H_
