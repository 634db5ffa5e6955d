#include "server/grpc/proto_convert.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/common/quoted.h"
#include "core/common/status_macros.h"
#include "core/optim/config_json.h"

namespace loraplex {
namespace {

namespace pb = google::protobuf;
using Field = pb::FieldDescriptor;

// The config messages and the core's JSON forms share one vocabulary:
// field names are JSON keys, and an enum value is the lowercase rest of its
// name after the enum's prefix (NS_COEFFICIENT_SET_POLAR_EXPRESS is
// "polar_express"). Walking the descriptors keeps a new proto field from
// being forgotten in one direction.

// "NS_COEFFICIENT_SET_" for NsCoefficientSet: its zero value's name less
// "UNSPECIFIED".
absl::string_view EnumPrefix(const pb::EnumDescriptor& type) {
  absl::string_view zero = type.FindValueByNumber(0)->name();
  absl::ConsumeSuffix(&zero, "UNSPECIFIED");
  return zero;
}

std::string EnumJsonName(const pb::EnumValueDescriptor& value) {
  absl::string_view name = value.name();
  absl::ConsumePrefix(&name, EnumPrefix(*value.type()));
  return absl::AsciiStrToLower(name);
}

absl::Status UnknownEnum(const pb::EnumDescriptor& type, absl::string_view path,
                         int number) {
  std::vector<std::string> names;
  for (int i = 0; i < type.value_count(); ++i) {
    if (type.value(i)->number() != 0) names.push_back(type.value(i)->name());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      path, " must be one of ", absl::StrJoin(names, ", "), "; got ", number));
}

// The JSON form of `field` of `message` (element `index` when repeated).
// A message element (NsCoefficients) is the list of its field values.
absl::StatusOr<nlohmann::json> ValueToJson(const pb::Message& message,
                                           const Field& field, int index,
                                           absl::string_view path) {
  const pb::Reflection& r = *message.GetReflection();
  const bool repeated = field.is_repeated();
  switch (field.cpp_type()) {
    case Field::CPPTYPE_INT32:
      return nlohmann::json(repeated
                                ? r.GetRepeatedInt32(message, &field, index)
                                : r.GetInt32(message, &field));
    case Field::CPPTYPE_INT64:
      return nlohmann::json(repeated
                                ? r.GetRepeatedInt64(message, &field, index)
                                : r.GetInt64(message, &field));
    case Field::CPPTYPE_UINT32:
      return nlohmann::json(repeated
                                ? r.GetRepeatedUInt32(message, &field, index)
                                : r.GetUInt32(message, &field));
    case Field::CPPTYPE_UINT64: {
      // The core's JSON integers are int64.
      const uint64_t value = repeated
                                 ? r.GetRepeatedUInt64(message, &field, index)
                                 : r.GetUInt64(message, &field);
      constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
      if (value > static_cast<uint64_t>(kMax)) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, " must be <= ", kMax, ", got ", value));
      }
      return nlohmann::json(static_cast<int64_t>(value));
    }
    case Field::CPPTYPE_DOUBLE:
      return nlohmann::json(repeated
                                ? r.GetRepeatedDouble(message, &field, index)
                                : r.GetDouble(message, &field));
    case Field::CPPTYPE_FLOAT:
      return nlohmann::json(repeated
                                ? r.GetRepeatedFloat(message, &field, index)
                                : r.GetFloat(message, &field));
    case Field::CPPTYPE_BOOL:
      return nlohmann::json(repeated ? r.GetRepeatedBool(message, &field, index)
                                     : r.GetBool(message, &field));
    case Field::CPPTYPE_STRING:
      return nlohmann::json(repeated
                                ? r.GetRepeatedString(message, &field, index)
                                : r.GetString(message, &field));
    case Field::CPPTYPE_ENUM: {
      const int number = repeated
                             ? r.GetRepeatedEnumValue(message, &field, index)
                             : r.GetEnumValue(message, &field);
      const pb::EnumValueDescriptor* value =
          field.enum_type()->FindValueByNumber(number);
      if (value == nullptr || number == 0) {
        return UnknownEnum(*field.enum_type(), path, number);
      }
      return nlohmann::json(EnumJsonName(*value));
    }
    case Field::CPPTYPE_MESSAGE: {
      const pb::Message& element =
          repeated ? r.GetRepeatedMessage(message, &field, index)
                   : r.GetMessage(message, &field);
      const pb::Descriptor& type = *element.GetDescriptor();
      nlohmann::json tuple = nlohmann::json::array();
      for (int i = 0; i < type.field_count(); ++i) {
        LORAPLEX_ASSIGN_OR_RETURN(
            nlohmann::json value,
            ValueToJson(element, *type.field(i), -1,
                        absl::StrCat(path, ".", type.field(i)->name())));
        tuple.push_back(std::move(value));
      }
      return tuple;
    }
  }
  return absl::InternalError(absl::StrCat(path, " has an unsupported type"));
}

// A JSON object of the fields the client set: optional scalars that are
// present, non-empty repeated fields and enums other than *_UNSPECIFIED.
absl::StatusOr<nlohmann::json> SetFieldsToJson(const pb::Message& message,
                                               absl::string_view part) {
  const pb::Descriptor& type = *message.GetDescriptor();
  const pb::Reflection& r = *message.GetReflection();
  nlohmann::json json = nlohmann::json::object();
  for (int i = 0; i < type.field_count(); ++i) {
    const Field& field = *type.field(i);
    const std::string path = absl::StrCat(part, ".", field.name());
    if (!field.is_repeated()) {
      if (!r.HasField(message, &field)) continue;
      LORAPLEX_ASSIGN_OR_RETURN(json[field.name()],
                                ValueToJson(message, field, -1, path));
      continue;
    }
    const int size = r.FieldSize(message, &field);
    if (size == 0) continue;
    nlohmann::json list = nlohmann::json::array();
    for (int j = 0; j < size; ++j) {
      LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json value,
                                ValueToJson(message, field, j, path));
      list.push_back(std::move(value));
    }
    json[field.name()] = std::move(list);
  }
  return json;
}

// Stores `value` (a core *ToJson output) into `field`, appending when the
// field is repeated.
void StoreValue(const nlohmann::json& value, const Field& field,
                pb::Message* message) {
  const pb::Reflection& r = *message->GetReflection();
  const bool add = field.is_repeated();
  switch (field.cpp_type()) {
    case Field::CPPTYPE_INT32:
      add ? r.AddInt32(message, &field, value.get<int32_t>())
          : r.SetInt32(message, &field, value.get<int32_t>());
      return;
    case Field::CPPTYPE_INT64:
      add ? r.AddInt64(message, &field, value.get<int64_t>())
          : r.SetInt64(message, &field, value.get<int64_t>());
      return;
    case Field::CPPTYPE_UINT32:
      add ? r.AddUInt32(message, &field, value.get<uint32_t>())
          : r.SetUInt32(message, &field, value.get<uint32_t>());
      return;
    case Field::CPPTYPE_UINT64:
      add ? r.AddUInt64(message, &field, value.get<uint64_t>())
          : r.SetUInt64(message, &field, value.get<uint64_t>());
      return;
    case Field::CPPTYPE_DOUBLE:
      add ? r.AddDouble(message, &field, value.get<double>())
          : r.SetDouble(message, &field, value.get<double>());
      return;
    case Field::CPPTYPE_FLOAT:
      add ? r.AddFloat(message, &field, value.get<float>())
          : r.SetFloat(message, &field, value.get<float>());
      return;
    case Field::CPPTYPE_BOOL:
      add ? r.AddBool(message, &field, value.get<bool>())
          : r.SetBool(message, &field, value.get<bool>());
      return;
    case Field::CPPTYPE_STRING:
      add ? r.AddString(message, &field, value.get<std::string>())
          : r.SetString(message, &field, value.get<std::string>());
      return;
    case Field::CPPTYPE_ENUM: {
      const pb::EnumDescriptor& type = *field.enum_type();
      const pb::EnumValueDescriptor* enum_value = type.FindValueByName(
          absl::StrCat(EnumPrefix(type),
                       absl::AsciiStrToUpper(value.get<std::string>())));
      if (enum_value == nullptr) return;
      add ? r.AddEnum(message, &field, enum_value)
          : r.SetEnum(message, &field, enum_value);
      return;
    }
    case Field::CPPTYPE_MESSAGE: {
      pb::Message* element = add ? r.AddMessage(message, &field)
                                 : r.MutableMessage(message, &field);
      const pb::Descriptor& type = *element->GetDescriptor();
      for (int i = 0;
           i < type.field_count() && i < static_cast<int>(value.size()); ++i) {
        StoreValue(value[i], *type.field(i), element);
      }
      return;
    }
  }
}

// Replaces `message` with the fields of `json` (keys without a field of
// that name are not part of the API and are skipped).
void JsonToFields(const nlohmann::json& json, pb::Message* message) {
  message->Clear();
  const pb::Descriptor& type = *message->GetDescriptor();
  for (auto it = json.begin(); it != json.end(); ++it) {
    const Field* field = type.FindFieldByName(it.key());
    if (field == nullptr) continue;
    if (!field->is_repeated()) {
      StoreValue(it.value(), *field, message);
      continue;
    }
    for (const nlohmann::json& element : it.value()) {
      StoreValue(element, *field, message);
    }
  }
}

// Sets a timestamp field of `message` for a real time; 0 (never) leaves
// the field absent rather than present at the epoch.
template <typename Message>
void SetTime(int64_t ms, Message* message,
             pb::Timestamp* (Message::*mutable_field)()) {
  if (ms != 0) TimestampFromMillis(ms, (message->*mutable_field)());
}

void JobErrorToProto(const std::string& code, const std::string& message,
                     v1::JobError* error) {
  error->set_code(code);
  error->set_message(message);
}

}  // namespace

absl::StatusOr<JobSpec> JobSpecFromProto(const v1::LoraConfig& lora,
                                         const v1::OptimizerConfig& optimizer,
                                         const v1::LrSchedule& schedule,
                                         const v1::TrainingConfig& training) {
  nlohmann::json json = nlohmann::json::object();
  LORAPLEX_ASSIGN_OR_RETURN(json["lora"], SetFieldsToJson(lora, "lora"));
  LORAPLEX_ASSIGN_OR_RETURN(json["optimizer"],
                            SetFieldsToJson(optimizer, "optimizer"));
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json schedule_json,
                            SetFieldsToJson(schedule, "schedule"));
  // 0 means "the job's step count", which is known only once the data is
  // (PrepareJobData fills it in and checks warmup_steps against it). Until
  // then a stand-in that any warmup fits.
  const bool spans_job =
      !schedule.has_total_steps() || schedule.total_steps() == 0;
  if (spans_job) {
    schedule_json["total_steps"] =
        std::max<int64_t>(1, schedule.warmup_steps());
  }
  json["schedule"] = std::move(schedule_json);
  json["schedule_spans_job"] = spans_job;
  LORAPLEX_ASSIGN_OR_RETURN(json["training"],
                            SetFieldsToJson(training, "training"));
  return JobSpecFromJson(json);
}

void JobSpecToProto(const JobSpec& spec, v1::LoraConfig* lora,
                    v1::OptimizerConfig* optimizer, v1::LrSchedule* schedule,
                    v1::TrainingConfig* training) {
  if (lora != nullptr) LoraConfigToProto(spec.lora, lora);
  if (optimizer != nullptr) {
    JsonToFields(OptimizerConfigToJson(spec.optimizer), optimizer);
  }
  if (schedule != nullptr) {
    JsonToFields(LrScheduleConfigToJson(spec.schedule), schedule);
  }
  if (training != nullptr) {
    JsonToFields(TrainingConfigToJson(spec.training), training);
  }
}

absl::StatusOr<LoraConfig> LoraConfigFromProto(const v1::LoraConfig& proto) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json json,
                            SetFieldsToJson(proto, "lora"));
  return LoraConfigFromJson(json);
}

void LoraConfigToProto(const LoraConfig& config, v1::LoraConfig* proto) {
  JsonToFields(LoraConfigToJson(config), proto);
}

v1::JobStatus JobStatusToProto(JobStatus status) {
  switch (status) {
    case JobStatus::kValidating:
      return v1::JOB_STATUS_VALIDATING;
    case JobStatus::kQueued:
      return v1::JOB_STATUS_QUEUED;
    case JobStatus::kRunning:
      return v1::JOB_STATUS_RUNNING;
    case JobStatus::kSucceeded:
      return v1::JOB_STATUS_SUCCEEDED;
    case JobStatus::kFailed:
      return v1::JOB_STATUS_FAILED;
    case JobStatus::kCancelled:
      return v1::JOB_STATUS_CANCELLED;
    case JobStatus::kPaused:
      return v1::JOB_STATUS_PAUSED;
  }
  return v1::JOB_STATUS_UNSPECIFIED;
}

std::optional<JobStatus> JobStatusFromProto(v1::JobStatus status) {
  for (JobStatus native : kAllJobStatuses) {
    if (JobStatusToProto(native) == status) return native;
  }
  return std::nullopt;
}

void TimestampFromMillis(int64_t ms, google::protobuf::Timestamp* timestamp) {
  timestamp->Clear();
  if (ms == 0) return;
  // Floor division: nanos must be in [0, 1e9) even before 1970.
  int64_t seconds = ms / 1000;
  int64_t millis = ms % 1000;
  if (millis < 0) {
    millis += 1000;
    --seconds;
  }
  timestamp->set_seconds(seconds);
  timestamp->set_nanos(static_cast<int32_t>(millis * 1000000));
}

void DatasetToProto(const DatasetRecord& record, v1::Dataset* dataset) {
  dataset->Clear();
  dataset->set_name(FormatResourceName("datasets", record.id));
  dataset->set_display_name(record.display_name);
  dataset->set_size_bytes(record.size_bytes);
  dataset->set_num_examples(record.num_examples);
  dataset->set_sha256(record.sha256);
  SetTime(record.create_time_ms, dataset, &v1::Dataset::mutable_create_time);
}

absl::Status JobToProto(const JobRecord& record, v1::Job* job) {
  absl::StatusOr<JobSpec> spec = JobSpecFromJson(record.spec);
  if (!spec.ok()) {
    return absl::InternalError(
        absl::StrCat("job ", record.id,
                     " has an invalid stored spec: ", spec.status().message()));
  }
  job->Clear();
  job->set_name(FormatResourceName("jobs", record.id));
  job->set_display_name(record.display_name);
  job->set_base_model(record.base_model);
  if (!record.training_dataset_id.empty()) {
    job->set_training_dataset(
        FormatResourceName("datasets", record.training_dataset_id));
  }
  if (!record.validation_dataset_id.empty()) {
    job->set_validation_dataset(
        FormatResourceName("datasets", record.validation_dataset_id));
  }
  if (!record.initial_adapter_id.empty()) {
    job->set_initial_adapter(
        FormatResourceName("adapters", record.initial_adapter_id));
  }
  JobSpecToProto(*spec, job->mutable_lora(), job->mutable_optimizer(),
                 job->mutable_schedule(), job->mutable_training());
  job->set_status(JobStatusToProto(record.status));
  job->set_slot(record.status == JobStatus::kRunning ? record.slot : -1);
  job->set_total_steps(record.total_steps);
  if (record.metrics.step > 0 || record.metrics.validation_loss.has_value()) {
    JobMetricsToProto(record.metrics, job->mutable_metrics());
  }
  if (!record.error_code.empty() || !record.error_message.empty()) {
    JobErrorToProto(record.error_code, record.error_message,
                    job->mutable_error());
  }
  if (!record.adapter_id.empty()) {
    job->set_adapter(FormatResourceName("adapters", record.adapter_id));
  }
  SetTime(record.create_time_ms, job, &v1::Job::mutable_create_time);
  SetTime(record.start_time_ms, job, &v1::Job::mutable_start_time);
  SetTime(record.end_time_ms, job, &v1::Job::mutable_end_time);
  return absl::OkStatus();
}

void JobMetricsToProto(const JobMetricsRecord& record,
                       v1::JobMetrics* metrics) {
  metrics->Clear();
  metrics->set_step(record.step);
  metrics->set_loss(record.loss);
  metrics->set_lr(record.lr);
  metrics->set_grad_norm(record.grad_norm);
  metrics->set_tokens_per_second(record.tokens_per_second);
  metrics->set_tokens(record.tokens);
  metrics->set_skipped_steps(record.skipped_steps);
  if (record.validation_loss.has_value()) {
    metrics->set_validation_loss(*record.validation_loss);
  }
  metrics->mutable_expert_tokens()->Add(record.expert_tokens.begin(),
                                        record.expert_tokens.end());
}

void JobEventToProto(const JobEventRecord& record, v1::JobEvent* event) {
  event->Clear();
  event->set_sequence(record.sequence);
  SetTime(record.time_ms, event, &v1::JobEvent::mutable_time);
  if (!record.status.has_value()) {
    JobMetricsToProto(record.metrics, event->mutable_metrics());
    return;
  }
  v1::JobStatusChange* change = event->mutable_status_change();
  change->set_status(JobStatusToProto(*record.status));
  change->set_message(record.message);
  if (!record.error_code.empty() || !record.error_message.empty()) {
    JobErrorToProto(record.error_code, record.error_message,
                    change->mutable_error());
  }
}

absl::Status AdapterToProto(const AdapterRecord& record, v1::Adapter* adapter) {
  absl::StatusOr<LoraConfig> lora = LoraConfigFromJson(record.lora);
  if (!lora.ok()) {
    return absl::InternalError(absl::StrCat(
        "adapter ", record.id,
        " has invalid stored settings: ", lora.status().message()));
  }
  adapter->Clear();
  adapter->set_name(FormatResourceName("adapters", record.id));
  adapter->set_display_name(record.display_name);
  if (!record.job_id.empty()) {
    adapter->set_job(FormatResourceName("jobs", record.job_id));
  }
  adapter->set_base_model(record.base_model);
  LoraConfigToProto(*lora, adapter->mutable_lora());
  SetTime(record.create_time_ms, adapter, &v1::Adapter::mutable_create_time);
  return absl::OkStatus();
}

v1::Runtime RuntimeProto(const RuntimeInfo& info) {
  v1::Runtime proto;
  proto.set_torch_version(info.torch_version);
  proto.set_blas(info.blas);
  proto.set_cpu_capability(info.cpu_capability);
  proto.set_intra_op_threads(info.intra_op_threads);
  proto.set_inter_op_threads(info.inter_op_threads);
  proto.set_openmp_wait_policy(info.openmp_wait_policy);
  proto.set_cuda_compiled(info.cuda_compiled);
  proto.set_cuda_runtime_version(info.cuda_runtime_version);
  proto.set_cuda_driver_version(info.cuda_driver_version);
  for (const CudaDeviceInfo& device : info.cuda_devices) {
    v1::CudaDevice* out = proto.add_cuda_devices();
    out->set_index(device.index);
    out->set_name(device.name);
    out->set_compute_capability_major(device.compute_capability_major);
    out->set_compute_capability_minor(device.compute_capability_minor);
    out->set_total_memory_bytes(device.total_memory_bytes);
  }
  proto.set_cuda_note(info.cuda_note);
  return proto;
}

}  // namespace loraplex
