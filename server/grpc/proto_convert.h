// Conversions between the loraplex.v1 messages and the service's native
// types, done once at the gRPC edge so nothing behind it sees a proto.
//
// Requests: the config messages become a validated JobSpec. Only the
// fields a client set reach the core's JSON readers, so defaults and error
// messages ("lora.rank must be in [1, 256], got 0") are the core's own.
//
//   LORAPLEX_ASSIGN_OR_RETURN(
//       JobSpec spec, JobSpecFromProto(request.lora(), request.optimizer(),
//                                      request.schedule(),
//                                      request.training()));
//   LORAPLEX_ASSIGN_OR_RETURN(
//       std::string dataset_id,
//       ParseResourceName(request.training_dataset(), "datasets",
//                         "training_dataset"));
//
// Responses: stored records become messages with every config field set
// to the value the job uses.
#ifndef LORAPLEX_SERVER_GRPC_PROTO_CONVERT_H_
#define LORAPLEX_SERVER_GRPC_PROTO_CONVERT_H_

#include <google/protobuf/timestamp.pb.h>

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/common/resource_names.h"
#include "core/lora/lora_config.h"
#include "core/runtime/runtime_info.h"
#include "loraplex/v1/adapters.pb.h"
#include "loraplex/v1/configs.pb.h"
#include "loraplex/v1/datasets.pb.h"
#include "loraplex/v1/jobs.pb.h"
#include "loraplex/v1/server.pb.h"
#include "server/jobs/job_spec.h"
#include "server/store/records.h"

namespace loraplex {

// Configs. Unset fields take the core defaults; unset or 0
// schedule.total_steps gives schedule_spans_job. Errors are
// INVALID_ARGUMENT naming the field ("optimizer.family must be one of
// ...; got 9").
absl::StatusOr<JobSpec> JobSpecFromProto(const v1::LoraConfig& lora,
                                         const v1::OptimizerConfig& optimizer,
                                         const v1::LrSchedule& schedule,
                                         const v1::TrainingConfig& training);
// Sets every field (enums never *_UNSPECIFIED). Null outputs are skipped.
void JobSpecToProto(const JobSpec& spec, v1::LoraConfig* lora,
                    v1::OptimizerConfig* optimizer, v1::LrSchedule* schedule,
                    v1::TrainingConfig* training);

absl::StatusOr<LoraConfig> LoraConfigFromProto(const v1::LoraConfig& proto);
void LoraConfigToProto(const LoraConfig& config, v1::LoraConfig* proto);

v1::JobStatus JobStatusToProto(JobStatus status);
// std::nullopt for JOB_STATUS_UNSPECIFIED and unknown values.
std::optional<JobStatus> JobStatusFromProto(v1::JobStatus status);

// Unix milliseconds; 0 (never) clears the timestamp.
void TimestampFromMillis(int64_t ms, google::protobuf::Timestamp* timestamp);

void DatasetToProto(const DatasetRecord& record, v1::Dataset* dataset);
// INTERNAL when the stored spec no longer validates.
absl::Status JobToProto(const JobRecord& record, v1::Job* job);
void JobMetricsToProto(const JobMetricsRecord& record, v1::JobMetrics* metrics);
void JobEventToProto(const JobEventRecord& record, v1::JobEvent* event);
// INTERNAL when the stored LoRA settings no longer validate.
absl::Status AdapterToProto(const AdapterRecord& record, v1::Adapter* adapter);

// The runtime as GetServerInfo sends it.
v1::Runtime RuntimeProto(const RuntimeInfo& info);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_PROTO_CONVERT_H_
