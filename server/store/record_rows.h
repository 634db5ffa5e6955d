// Conversions between the store's records (records.h) and rows of its
// SQLite tables (internal to server/store/, included only by
// job_store.cc). Each kXColumns list names the columns in the order that
// BindX binds and ReadX reads them.
#ifndef LORAPLEX_SERVER_STORE_RECORD_ROWS_H_
#define LORAPLEX_SERVER_STORE_RECORD_ROWS_H_

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "core/common/enum_names.h"
#include "core/common/status_macros.h"
#include "server/store/records.h"
#include "server/store/sqlite_statement.h"

namespace loraplex {
namespace store_internal {

// Column lists in the order the Bind*/Read* functions below use; row_id
// is selected after them where a listing needs it for its page token.
inline constexpr char kDatasetColumns[] =
    "id, tenant, display_name, size_bytes, num_examples, sha256, "
    "create_time_ms";
inline constexpr int kNumDatasetColumns = 7;
inline constexpr char kMetricsColumns[] =
    "step, loss, lr, grad_norm, tokens_per_second, tokens, skipped_steps, "
    "validation_loss, expert_tokens";
inline constexpr char kJobColumnsBeforeMetrics[] =
    "id, tenant, display_name, base_model, training_dataset_id, "
    "validation_dataset_id, initial_adapter_id, spec, status, slot, "
    "total_steps";
inline constexpr char kJobColumnsAfterMetrics[] =
    "error_code, error_message, adapter_id, create_time_ms, start_time_ms, "
    "end_time_ms";
inline constexpr int kNumJobColumns = 26;
inline constexpr char kEventColumnsBeforeMetrics[] =
    "job_id, sequence, time_ms, status, message, error_code, error_message";
inline constexpr int kNumEventColumns = 16;
inline constexpr char kAdapterColumns[] =
    "id, tenant, display_name, job_id, base_model, lora, create_time_ms";
inline constexpr int kNumAdapterColumns = 7;

inline std::string JobColumns() {
  return absl::StrCat(kJobColumnsBeforeMetrics, ", ", kMetricsColumns, ", ",
                      kJobColumnsAfterMetrics);
}

inline std::string EventColumns() {
  return absl::StrCat(kEventColumnsBeforeMetrics, ", ", kMetricsColumns);
}

// nlohmann::json throws on strings that are not UTF-8; exceptions must not
// leave the store.
inline absl::StatusOr<std::string> DumpJson(const nlohmann::json& value,
                                            absl::string_view field) {
  try {
    return value.dump();
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " cannot be stored: ", e.what()));
  }
}

inline absl::StatusOr<nlohmann::json> ParseStoredJson(
    const std::string& text, absl::string_view kind, absl::string_view id,
    absl::string_view column) {
  nlohmann::json value = nlohmann::json::parse(text, nullptr, false);
  if (value.is_discarded()) {
    return absl::InternalError(
        absl::StrCat("stored ", kind, " \"", id, "\" has unreadable ", column));
  }
  return value;
}

inline absl::StatusOr<JobStatus> ParseStoredStatus(const std::string& name,
                                                   absl::string_view job_id) {
  std::optional<JobStatus> status =
      ParseEnumName(name, kAllJobStatuses, &JobStatusName);
  if (!status.has_value()) {
    return absl::InternalError(absl::StrCat(
        "stored job \"", job_id, "\" has unknown status \"", name, "\""));
  }
  return *status;
}

inline void BindDataset(Statement& stmt, const DatasetRecord& dataset) {
  stmt.BindText(dataset.id);
  stmt.BindText(dataset.tenant);
  stmt.BindText(dataset.display_name);
  stmt.BindInt(dataset.size_bytes);
  stmt.BindInt(dataset.num_examples);
  stmt.BindText(dataset.sha256);
  stmt.BindInt(dataset.create_time_ms);
}

inline absl::StatusOr<DatasetRecord> ReadDataset(const Statement& stmt) {
  DatasetRecord dataset;
  dataset.id = stmt.Text(0);
  dataset.tenant = stmt.Text(1);
  dataset.display_name = stmt.Text(2);
  dataset.size_bytes = stmt.Int(3);
  dataset.num_examples = stmt.Int(4);
  dataset.sha256 = stmt.Text(5);
  dataset.create_time_ms = stmt.Int(6);
  return dataset;
}

inline void BindMetrics(Statement& stmt, const JobMetricsRecord& metrics) {
  stmt.BindInt(metrics.step);
  stmt.BindDouble(metrics.loss);
  stmt.BindDouble(metrics.lr);
  stmt.BindDouble(metrics.grad_norm);
  stmt.BindDouble(metrics.tokens_per_second);
  stmt.BindInt(metrics.tokens);
  stmt.BindInt(metrics.skipped_steps);
  stmt.BindOptionalDouble(metrics.validation_loss);
  stmt.BindText(absl::StrJoin(metrics.expert_tokens, ","));
}

inline JobMetricsRecord ReadMetrics(const Statement& stmt, int first_column) {
  JobMetricsRecord metrics;
  int column = first_column;
  metrics.step = stmt.Int(column++);
  metrics.loss = stmt.Double(column++);
  metrics.lr = stmt.Double(column++);
  metrics.grad_norm = stmt.Double(column++);
  metrics.tokens_per_second = stmt.Double(column++);
  metrics.tokens = stmt.Int(column++);
  metrics.skipped_steps = stmt.Int(column++);
  metrics.validation_loss = stmt.OptionalDouble(column++);
  // Written by BindMetrics: comma-separated counts, empty for none.
  for (absl::string_view count :
       absl::StrSplit(stmt.Text(column++), ',', absl::SkipEmpty())) {
    int64_t value = 0;
    if (absl::SimpleAtoi(count, &value)) metrics.expert_tokens.push_back(value);
  }
  return metrics;
}

inline absl::Status BindJob(Statement& stmt, const JobRecord& job) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string spec, DumpJson(job.spec, "job.spec"));
  stmt.BindText(job.id);
  stmt.BindText(job.tenant);
  stmt.BindText(job.display_name);
  stmt.BindText(job.base_model);
  stmt.BindText(job.training_dataset_id);
  stmt.BindText(job.validation_dataset_id);
  stmt.BindText(job.initial_adapter_id);
  stmt.BindText(spec);
  stmt.BindText(JobStatusName(job.status));
  stmt.BindInt(job.slot);
  stmt.BindInt(job.total_steps);
  BindMetrics(stmt, job.metrics);
  stmt.BindText(job.error_code);
  stmt.BindText(job.error_message);
  stmt.BindText(job.adapter_id);
  stmt.BindInt(job.create_time_ms);
  stmt.BindInt(job.start_time_ms);
  stmt.BindInt(job.end_time_ms);
  return absl::OkStatus();
}

inline absl::StatusOr<JobRecord> ReadJob(const Statement& stmt) {
  JobRecord job;
  job.id = stmt.Text(0);
  job.tenant = stmt.Text(1);
  job.display_name = stmt.Text(2);
  job.base_model = stmt.Text(3);
  job.training_dataset_id = stmt.Text(4);
  job.validation_dataset_id = stmt.Text(5);
  job.initial_adapter_id = stmt.Text(6);
  LORAPLEX_ASSIGN_OR_RETURN(
      job.spec, ParseStoredJson(stmt.Text(7), "job", job.id, "spec"));
  LORAPLEX_ASSIGN_OR_RETURN(job.status,
                            ParseStoredStatus(stmt.Text(8), job.id));
  job.slot = static_cast<int>(stmt.Int(9));
  job.total_steps = stmt.Int(10);
  job.metrics = ReadMetrics(stmt, 11);
  job.error_code = stmt.Text(20);
  job.error_message = stmt.Text(21);
  job.adapter_id = stmt.Text(22);
  job.create_time_ms = stmt.Int(23);
  job.start_time_ms = stmt.Int(24);
  job.end_time_ms = stmt.Int(25);
  return job;
}

inline void BindEvent(Statement& stmt, const JobEventRecord& event) {
  stmt.BindText(event.job_id);
  stmt.BindInt(event.sequence);
  stmt.BindInt(event.time_ms);
  if (event.status.has_value()) {
    stmt.BindText(JobStatusName(*event.status));
  } else {
    stmt.BindNull();
  }
  stmt.BindText(event.message);
  stmt.BindText(event.error_code);
  stmt.BindText(event.error_message);
  BindMetrics(stmt, event.metrics);
}

inline absl::StatusOr<JobEventRecord> ReadEvent(const Statement& stmt) {
  JobEventRecord event;
  event.job_id = stmt.Text(0);
  event.sequence = stmt.Int(1);
  event.time_ms = stmt.Int(2);
  if (!stmt.IsNull(3)) {
    LORAPLEX_ASSIGN_OR_RETURN(event.status,
                              ParseStoredStatus(stmt.Text(3), event.job_id));
  }
  event.message = stmt.Text(4);
  event.error_code = stmt.Text(5);
  event.error_message = stmt.Text(6);
  event.metrics = ReadMetrics(stmt, 7);
  return event;
}

inline absl::Status BindAdapter(Statement& stmt, const AdapterRecord& adapter) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string lora,
                            DumpJson(adapter.lora, "adapter.lora"));
  stmt.BindText(adapter.id);
  stmt.BindText(adapter.tenant);
  stmt.BindText(adapter.display_name);
  stmt.BindText(adapter.job_id);
  stmt.BindText(adapter.base_model);
  stmt.BindText(lora);
  stmt.BindInt(adapter.create_time_ms);
  return absl::OkStatus();
}

inline absl::StatusOr<AdapterRecord> ReadAdapter(const Statement& stmt) {
  AdapterRecord adapter;
  adapter.id = stmt.Text(0);
  adapter.tenant = stmt.Text(1);
  adapter.display_name = stmt.Text(2);
  adapter.job_id = stmt.Text(3);
  adapter.base_model = stmt.Text(4);
  LORAPLEX_ASSIGN_OR_RETURN(
      adapter.lora,
      ParseStoredJson(stmt.Text(5), "adapter", adapter.id, "lora"));
  adapter.create_time_ms = stmt.Int(6);
  return adapter;
}

}  // namespace store_internal
}  // namespace loraplex

#endif  // LORAPLEX_SERVER_STORE_RECORD_ROWS_H_
