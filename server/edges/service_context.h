// What the API edges share (the v1 gRPC services, the Tinker and the OpenAI
// HTTP APIs, /metrics): the store, the scheduler, the session manager, the
// dataset loader, the authenticator, the model, the server's limits. Plain
// C++: no gRPC, no protobuf, no LibTorch.
//
//   LORAPLEX_ASSIGN_OR_RETURN(int page_size, PageSize(request.page_size));
//   context.store->ListJobs(tenant, page_size, ...);
#ifndef LORAPLEX_SERVER_EDGES_SERVICE_CONTEXT_H_
#define LORAPLEX_SERVER_EDGES_SERVICE_CONTEXT_H_

#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/chat/chat_template.h"
#include "core/lora/lora_config.h"
#include "core/model/model_config.h"
#include "core/runtime/runtime_info.h"
#include "server/common/logger.h"
#include "server/common/request_counters.h"
#include "server/common/work_queue.h"
#include "server/edges/tenant_auth.h"
#include "server/jobs/job_data.h"
#include "server/jobs/job_scheduler.h"
#include "server/sessions/session_manager.h"
#include "server/store/job_store.h"

namespace loraplex {

struct ServiceLimits {
  int64_t max_dataset_bytes = int64_t{256} << 20;
  int64_t max_adapter_bytes = int64_t{256} << 20;
  int64_t max_rank = 256;
  // Smallest training.checkpoint_interval a job may set (0 is always
  // allowed): every due job checkpoints the whole pool.
  int64_t min_checkpoint_interval = 1;
  int slot_capacity = 8;
  int slots_per_tenant = 8;
  // Sample / StreamSample calls a tenant may have in flight.
  int max_samples_per_tenant = 16;
  // Samples per request (SampleRequest.n).
  int max_samples_per_request = 16;
  // Generated tokens per sample.
  int64_t max_sample_tokens = 4096;
  // Datums per ForwardBackward call, and their tokens together.
  int64_t max_session_datums = 1024;
  int64_t max_session_tokens = int64_t{1} << 20;
  // Tokens one trained row may have: what the activation memory holds with
  // the server's checkpointing (MaxRowTokens); 0: no limit known.
  int64_t max_row_tokens = 0;
};

struct ServiceContext {
  JobStore* store = nullptr;
  JobScheduler* scheduler = nullptr;
  DatasetLoader* datasets = nullptr;
  const TenantAuthenticator* auth = nullptr;
  Logger* logger = nullptr;
  WorkQueue* work = nullptr;
  SessionManager* sessions = nullptr;
  // Calls answered, by transport, method and code (/metrics).
  const RequestCounters* requests = nullptr;
  ModelConfig model;
  // Reads an adapter directory and checks it against the base model,
  // answering its LoRA configuration or INVALID_ARGUMENT (LoadPeftAdapter,
  // which needs LibTorch: the program gives it, the handlers have none).
  std::function<absl::StatusOr<LoraConfig>(const std::string& dir)>
      check_adapter;
  // Renders chat prompts for sampling; null when the model has no template
  // (then chat_template_error may say why one could not be used).
  const ChatTemplate* chat_template = nullptr;
  absl::Status chat_template_error;
  std::string base_model_name;
  std::string state_dir;
  std::string device;
  std::string version;
  RuntimeInfo runtime;  // What the server runs on (GetServerInfo).
  ServiceLimits limits;
};

// page_size 0 means 100; INVALID_ARGUMENT outside [0, 1000].
absl::StatusOr<int> PageSize(int requested);

// INVALID_ARGUMENT when `value` is longer than 256 bytes.
absl::Status CheckDisplayName(const std::string& value,
                              absl::string_view field);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_EDGES_SERVICE_CONTEXT_H_
