// What a job trains, as validated native configs: the LoRA settings, the
// optimizer, the LR schedule and the training loop. Built from a
// CreateJobRequest at the edge (server/grpc/proto_convert.h) and stored
// with the job as JSON (JobRecord::spec).
//
//   LORAPLEX_ASSIGN_OR_RETURN(JobSpec spec, JobSpecFromJson(record.spec));
//   SlotAttachRequest request{.lora = spec.lora, ...};
#ifndef LORAPLEX_SERVER_JOBS_JOB_SPEC_H_
#define LORAPLEX_SERVER_JOBS_JOB_SPEC_H_

#include <cstdint>
#include <nlohmann/json.hpp>

#include "absl/status/statusor.h"
#include "core/lora/lora_config.h"
#include "core/optim/lr_schedule_config.h"
#include "core/optim/optimizer_config.h"
#include "core/train/training_config.h"

namespace loraplex {

struct JobSpec {
  LoraConfig lora;
  OptimizerConfig optimizer;
  LrScheduleConfig schedule;
  // True when the request left schedule.total_steps unset (or 0): the
  // schedule then spans the job's own step count, filled in once the
  // training data is known.
  bool schedule_spans_job = true;
  TrainingConfig training;
};

// {"lora": {...}, "optimizer": {...}, "schedule": {...},
//  "schedule_spans_job": bool, "training": {...}}; every field written.
nlohmann::json JobSpecToJson(const JobSpec& spec);
// Validates each part (errors name the field, e.g. "optimizer.lr ...") and
// that the schedule's min_lr does not exceed the optimizer's lr.
absl::StatusOr<JobSpec> JobSpecFromJson(const nlohmann::json& json);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_JOBS_JOB_SPEC_H_
