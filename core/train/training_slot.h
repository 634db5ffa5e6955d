// Everything one adapter needs to train: its LoRA weights, optimizer
// children, LR schedule, training sequences with their cursor, and
// counters. The slot pool (adapters/) owns these and sets them up; the
// co-batched step (co_batch_step.h) trains any set of them together.
#ifndef LORAPLEX_CORE_TRAIN_TRAINING_SLOT_H_
#define LORAPLEX_CORE_TRAIN_TRAINING_SLOT_H_

#include <cstdint>
#include <memory>
#include <optional>

#include "core/data/data_cursor.h"
#include "core/data/sequences.h"
#include "core/lora/lora_weights.h"
#include "core/optim/lr_scheduler.h"
#include "core/optim/slot_optimizer.h"
#include "core/train/slot_counters.h"
#include "core/train/training_config.h"

namespace loraplex {

struct TrainingSlot {
  TrainingSlot(const ModelConfig& model, torch::Device device,
               torch::ScalarType dtype = torch::kFloat32)
      : weights(model, device, dtype) {}

  LoraWeights weights;
  // Unset for an adapter that is only evaluated.
  std::optional<SlotOptimizer> optimizer;
  std::optional<LrScheduler> scheduler;
  TrainingConfig training;
  std::shared_ptr<const SequenceSet> data;
  std::optional<DataCursor> cursor;
  int64_t total_steps = 0;
  SlotCounters counters;

  bool trainable() const {
    return weights.bound() && optimizer.has_value() && scheduler.has_value() &&
           data != nullptr && cursor.has_value();
  }
  bool done() const { return counters.steps >= total_steps; }
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_TRAINING_SLOT_H_
