#include "server/jobs/job_spec.h"

#include "absl/strings/str_cat.h"
#include "core/common/json_fields.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/optim/config_json.h"

namespace loraplex {
namespace {

// The part under `key`, or an empty object (all defaults) when absent.
nlohmann::json Part(JsonFields& fields, const char* key) {
  const nlohmann::json* raw = fields.Raw(key);
  return raw == nullptr ? nlohmann::json::object() : *raw;
}

}  // namespace

nlohmann::json JobSpecToJson(const JobSpec& spec) {
  return {{"lora", LoraConfigToJson(spec.lora)},
          {"optimizer", OptimizerConfigToJson(spec.optimizer)},
          {"schedule", LrScheduleConfigToJson(spec.schedule)},
          {"schedule_spans_job", spec.schedule_spans_job},
          {"training", TrainingConfigToJson(spec.training)}};
}

absl::StatusOr<JobSpec> JobSpecFromJson(const nlohmann::json& json) {
  if (!json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec must be a JSON object, got ", DescribeJson(json)));
  }
  JobSpec spec;
  JsonFields fields(json, "");
  const nlohmann::json lora = Part(fields, "lora");
  const nlohmann::json optimizer = Part(fields, "optimizer");
  const nlohmann::json schedule = Part(fields, "schedule");
  const nlohmann::json training = Part(fields, "training");
  LORAPLEX_RETURN_IF_ERROR(
      fields.Bool("schedule_spans_job", &spec.schedule_spans_job));
  LORAPLEX_RETURN_IF_ERROR(fields.RejectUnknown());
  LORAPLEX_ASSIGN_OR_RETURN(spec.lora, LoraConfigFromJson(lora));
  LORAPLEX_ASSIGN_OR_RETURN(spec.optimizer, OptimizerConfigFromJson(optimizer));
  LORAPLEX_ASSIGN_OR_RETURN(spec.schedule, LrScheduleConfigFromJson(schedule));
  LORAPLEX_ASSIGN_OR_RETURN(spec.training, TrainingConfigFromJson(training));
  // The schedule's peak is the optimizer's lr (min_lr <= lr): a spec
  // accepted here always builds its LrScheduler.
  LORAPLEX_RETURN_IF_ERROR(
      ValidateLrScheduleWithPeak(spec.schedule, spec.optimizer.lr));
  return spec;
}

}  // namespace loraplex
