// How long and on what batches one job trains: batch size, sequence length,
// steps or epochs, gradient clipping and the job's seed.
//
//   LORAPLEX_ASSIGN_OR_RETURN(TrainingConfig training,
//                             TrainingConfigFromJson(json));
//   int64_t steps = TotalSteps(training, num_sequences);
#ifndef LORAPLEX_CORE_TRAIN_TRAINING_CONFIG_H_
#define LORAPLEX_CORE_TRAIN_TRAINING_CONFIG_H_

#include <cstdint>
#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace loraplex {

struct TrainingConfig {
  int64_t batch_size = 4;  // Sequences per step.
  int64_t seq_len = 512;   // Longer examples are truncated (or packed).
  bool pack = false;       // Concatenate examples into seq_len pieces.
  // Steps to train; 0 means `epochs` passes over the data.
  int64_t max_steps = 0;
  int64_t epochs = 1;
  // Per-slot gradient L2 norm cap; 0 measures without clipping.
  double grad_clip = 1.0;
  // Seeds the LoRA init, the data order and dropout.
  uint64_t seed = 0;
  // Steps between validation-loss evaluations of a job that has validation
  // data; 0 evaluates only after the last step.
  int64_t eval_interval = 0;
  // Steps between checkpoints of the job's slot; 0 leaves it to the
  // service's default. Only the service checkpoints; the core ignores it.
  int64_t checkpoint_interval = 0;
};

inline constexpr int64_t kMaxBatchSize = 4096;
inline constexpr int64_t kMaxSeqLen = 1 << 20;

// INVALID_ARGUMENT naming the field ("training.batch_size must be in
// [1, 4096], got 0").
absl::Status ValidateTrainingConfig(const TrainingConfig& config);

// Number of steps the job runs on `num_sequences` training sequences.
int64_t TotalSteps(const TrainingConfig& config, int64_t num_sequences);

absl::StatusOr<TrainingConfig> TrainingConfigFromJson(
    const nlohmann::json& json);
nlohmann::json TrainingConfigToJson(const TrainingConfig& config);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TRAIN_TRAINING_CONFIG_H_
