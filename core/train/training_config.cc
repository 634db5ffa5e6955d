#include "core/train/training_config.h"

#include "absl/strings/str_cat.h"
#include "core/common/json_fields.h"
#include "core/common/number_checks.h"
#include "core/common/status_macros.h"

namespace loraplex {
namespace {

absl::Status CheckRange(const char* field, int64_t value, int64_t low,
                        int64_t high) {
  if (value >= low && value <= high) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "training.", field, " must be in [", low, ", ", high, "], got ", value));
}

}  // namespace

absl::Status ValidateTrainingConfig(const TrainingConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(
      CheckRange("batch_size", config.batch_size, 1, kMaxBatchSize));
  LORAPLEX_RETURN_IF_ERROR(
      CheckRange("seq_len", config.seq_len, 2, kMaxSeqLen));
  LORAPLEX_RETURN_IF_ERROR(
      CheckRange("max_steps", config.max_steps, 0, int64_t{1} << 40));
  LORAPLEX_RETURN_IF_ERROR(CheckRange("epochs", config.epochs, 1, 1000000));
  LORAPLEX_RETURN_IF_ERROR(
      CheckRange("eval_interval", config.eval_interval, 0, int64_t{1} << 40));
  LORAPLEX_RETURN_IF_ERROR(CheckRange(
      "checkpoint_interval", config.checkpoint_interval, 0, int64_t{1} << 40));
  if (!IsFiniteNonNegative(config.grad_clip)) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.grad_clip must be a finite number >= 0, got ",
                     config.grad_clip));
  }
  return absl::OkStatus();
}

int64_t TotalSteps(const TrainingConfig& config, int64_t num_sequences) {
  if (config.max_steps > 0) return config.max_steps;
  const int64_t rows = config.epochs * num_sequences;
  return (rows + config.batch_size - 1) / config.batch_size;
}

absl::StatusOr<TrainingConfig> TrainingConfigFromJson(
    const nlohmann::json& json) {
  TrainingConfig config;
  JsonFields fields(json, "training.");
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("batch_size", &config.batch_size));
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("seq_len", &config.seq_len));
  LORAPLEX_RETURN_IF_ERROR(fields.Bool("pack", &config.pack));
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("max_steps", &config.max_steps));
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("epochs", &config.epochs));
  LORAPLEX_RETURN_IF_ERROR(fields.Number("grad_clip", &config.grad_clip));
  int64_t seed = 0;
  LORAPLEX_RETURN_IF_ERROR(fields.Integer("seed", &seed));
  if (seed < 0) {
    return fields.Invalid("seed", absl::StrCat("must be >= 0, got ", seed));
  }
  config.seed = static_cast<uint64_t>(seed);
  LORAPLEX_RETURN_IF_ERROR(
      fields.Integer("eval_interval", &config.eval_interval));
  LORAPLEX_RETURN_IF_ERROR(
      fields.Integer("checkpoint_interval", &config.checkpoint_interval));
  LORAPLEX_RETURN_IF_ERROR(fields.RejectUnknown());
  LORAPLEX_RETURN_IF_ERROR(ValidateTrainingConfig(config));
  return config;
}

nlohmann::json TrainingConfigToJson(const TrainingConfig& config) {
  return {{"batch_size", config.batch_size},
          {"seq_len", config.seq_len},
          {"pack", config.pack},
          {"max_steps", config.max_steps},
          {"epochs", config.epochs},
          {"grad_clip", config.grad_clip},
          {"seed", config.seed},
          {"eval_interval", config.eval_interval},
          {"checkpoint_interval", config.checkpoint_interval}};
}

}  // namespace loraplex
