// The service's stored resources as plain structs: datasets, jobs, job
// events and adapters. The gRPC layer converts them to and from the
// loraplex.v1 messages; the store (job_store.h) persists them.
//
// Times are Unix milliseconds. Ids are the last segment of the resource
// name ("jobs/{id}"): lowercase letters, digits and '-'.
#ifndef LORAPLEX_SERVER_STORE_RECORDS_H_
#define LORAPLEX_SERVER_STORE_RECORDS_H_

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace loraplex {

enum class JobStatus {
  kValidating,  // Being checked; not yet queued.
  kQueued,      // Waiting for a slot (FIFO, per-tenant quota).
  kRunning,     // Training (or evaluating) in a slot.
  kSucceeded,   // Finished; adapter_id names the trained adapter.
  kFailed,      // Stopped by an error; error_code/error_message say why.
  kCancelled,   // Stopped by CancelJob or RetireAdapter.
  kPaused,      // Stopped with its state kept; not queued.
};

inline constexpr std::array<JobStatus, 7> kAllJobStatuses = {
    JobStatus::kValidating, JobStatus::kQueued, JobStatus::kRunning,
    JobStatus::kSucceeded,  JobStatus::kFailed, JobStatus::kCancelled,
    JobStatus::kPaused};

// "VALIDATING", "QUEUED", ... (the proto names without the prefix).
absl::string_view JobStatusName(JobStatus status);
// SUCCEEDED, FAILED or CANCELLED: nothing changes the job any more.
bool IsTerminal(JobStatus status);

struct DatasetRecord {
  std::string id;
  std::string tenant;
  std::string display_name;
  int64_t size_bytes = 0;
  int64_t num_examples = 0;
  std::string sha256;  // Lowercase hex of the stored file.
  int64_t create_time_ms = 0;
};

struct JobMetricsRecord {
  int64_t step = 0;
  double loss = 0.0;
  double lr = 0.0;
  double grad_norm = 0.0;
  double tokens_per_second = 0.0;
  int64_t tokens = 0;
  int64_t skipped_steps = 0;
  std::optional<double> validation_loss;
  // Mixture-of-experts bases: the step's tokens per expert, summed over the
  // sparse layers (SlotStepMetrics::expert_tokens); empty otherwise.
  std::vector<int64_t> expert_tokens;
};

struct JobRecord {
  std::string id;
  std::string tenant;
  std::string display_name;
  std::string base_model;
  std::string training_dataset_id;    // Empty for an evaluation-only job.
  std::string validation_dataset_id;  // Empty when none.
  std::string initial_adapter_id;     // Empty for a fresh adapter.
  // The effective configuration, every field set:
  // {"lora": {...}, "optimizer": {...}, "schedule": {...},
  //  "training": {...}} in the JSON forms of core/ (LoraConfigToJson, ...).
  nlohmann::json spec = nlohmann::json::object();
  JobStatus status = JobStatus::kQueued;
  int slot = -1;  // While kRunning.
  int64_t total_steps = 0;
  JobMetricsRecord metrics;
  std::string error_code;  // gRPC code name, when kFailed.
  std::string error_message;
  std::string adapter_id;  // The trained adapter, once kSucceeded.
  int64_t create_time_ms = 0;
  int64_t start_time_ms = 0;  // 0 until first kRunning.
  int64_t end_time_ms = 0;    // 0 until terminal.
};

// One entry of a job's event log: a status change or one step's metrics.
struct JobEventRecord {
  std::string job_id;
  int64_t sequence = 0;  // 1, 2, ... per job; assigned by the store.
  int64_t time_ms = 0;
  // A status change when set; otherwise `metrics` is the event.
  std::optional<JobStatus> status;
  std::string message;  // Status changes: why.
  std::string error_code;
  std::string error_message;
  JobMetricsRecord metrics;
};

struct AdapterRecord {
  std::string id;
  std::string tenant;
  std::string display_name;
  std::string job_id;  // The job that trained it; empty for an upload.
  std::string base_model;
  nlohmann::json lora = nlohmann::json::object();  // LoraConfigToJson form.
  int64_t create_time_ms = 0;
};

// A training session's lifecycle (server/sessions/session_manager.h owns
// the changes; the store keeps the state and why it was reached).
enum class SessionState {
  kOpening,  // Its slot being opened, or restored after a restart.
  kOpen,     // Takes operations.
  kClosing,  // Closing (by CloseSession, or saved and closed when idle).
  kClosed,   // Ended; its reason says how. Its saved states and adapters
             // stay.
};

// "OPENING", "OPEN", "CLOSING", "CLOSED".
absl::string_view SessionStateName(SessionState state);
std::optional<SessionState> SessionStateFromName(absl::string_view name);

struct SessionRecord {
  std::string id;
  std::string tenant;
  std::string display_name;
  // {"lora": {...}, "optimizer": {...}, "seed": N} in core/'s JSON forms.
  nlohmann::json spec = nlohmann::json::object();
  SessionState state = SessionState::kOpening;
  std::string reason;  // Why it reached `state` (kClosed: how it ended).
  int64_t steps = 0;   // Optimizer steps taken.
  int slot = -1;       // While open: restored into it again if free.
  // Operations 1..next_seq_id-1 were applied (their effect since the
  // session's newest checkpoint is lost by a crash; the README says so).
  int64_t next_seq_id = 1;
  std::string idle_state;  // Closed when idle: the state saved then.
  int64_t create_time_ms = 0;
  int64_t last_activity_ms = 0;
};

// A name the Tinker API gave a client (a session, a model, a sampler, a
// tinker:// path) and what it stands for, so that it resolves after a
// restart.
struct TinkerNameRecord {
  std::string name;
  std::string kind;  // "session", "model", "sampler", "weights", ...
  std::string tenant;
  nlohmann::json value = nlohmann::json::object();
};

// A finished call's answer kept for a late or repeated read (the Tinker
// API's futures): owner and sequence number as in server/results/.
struct StoredResultRecord {
  std::string owner;
  int64_t seq = 0;
  int code = 0;  // absl::StatusCode; 0: OK, `body` is the answer.
  std::string message;
  std::string body;
  std::string content_type;
  int64_t time_ms = 0;
};

// One page of a listing; next_page_token is empty on the last page.
template <typename Record>
struct Page {
  std::vector<Record> items;
  std::string next_page_token;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_STORE_RECORDS_H_
