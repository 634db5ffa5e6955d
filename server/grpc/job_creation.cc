#include "server/grpc/job_creation.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "adapters/peft_files.h"
#include "core/common/status_macros.h"
#include "core/common/test_faults.h"
#include "server/checkpoints/checkpoint_files.h"
#include "server/edges/checkpoint_access.h"
#include "server/grpc/proto_convert.h"
#include "server/grpc/request_ids.h"
#include "server/grpc/staged_adapter.h"
#include "server/jobs/job_data.h"
#include "server/jobs/resource_id.h"

namespace loraplex {
namespace {

absl::Status Prefixed(absl::string_view field, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(),
                      absl::StrCat(field, ": ", status.message()));
}

// The dataset id a request field names, checked to exist for `tenant`.
absl::StatusOr<std::string> DatasetReference(const ServiceContext& context,
                                             const std::string& tenant,
                                             const std::string& name,
                                             absl::string_view field) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string id,
                            ParseResourceName(name, "datasets", field));
  LORAPLEX_RETURN_IF_ERROR(
      Prefixed(field, context.store->GetDataset(tenant, id).status()));
  return id;
}

// INVALID_ARGUMENT when a training row is longer than the server can train
// (ServiceLimits::max_row_tokens). Validation rows run forward only, which
// keeps no activations.
absl::Status CheckRowsFit(const JobData& data, const JobSpec& spec,
                          int64_t max_row_tokens) {
  if (max_row_tokens <= 0 || data.training == nullptr) return absl::OkStatus();
  size_t longest = 0;
  for (const Sequence& sequence : data.training->sequences) {
    longest = std::max(longest, sequence.input_ids.size());
  }
  if (static_cast<int64_t>(longest) <= max_row_tokens) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "training_dataset: its longest ", spec.training.pack ? "packed " : "",
      "row has ", longest, " tokens (training.seq_len ", spec.training.seq_len,
      "); a row this server trains may have at most ", max_row_tokens,
      " (its activation memory holds no more, with the server's activation "
      "checkpointing): set training.seq_len to at most ",
      max_row_tokens));
}

}  // namespace

absl::StatusOr<PendingJob> ValidateCreateJob(
    const ServiceContext& context, const std::string& tenant,
    const v1::CreateJobRequest& request, const AdapterRecord* initial_adapter) {
  PendingJob pending;
  JobRecord& record = pending.record;
  LORAPLEX_RETURN_IF_ERROR(
      CheckDisplayName(request.display_name(), "display_name"));
  if (!request.base_model().empty() &&
      request.base_model() != context.base_model_name) {
    // Echoed at most kEchoed bytes: a huge value must not make the error
    // itself too large to deliver.
    constexpr size_t kEchoed = 200;
    const std::string& given = request.base_model();
    return absl::InvalidArgumentError(absl::StrCat(
        "base_model: this server trains adapters for \"",
        context.base_model_name, "\", got \"", given.substr(0, kEchoed),
        given.size() > kEchoed
            ? absl::StrCat("...\" (", given.size(), " bytes)")
            : std::string("\"")));
  }
  const bool has_adapter =
      initial_adapter != nullptr || !request.initial_adapter().empty();
  if (request.training_dataset().empty() &&
      (!has_adapter || request.validation_dataset().empty())) {
    return absl::InvalidArgumentError(
        "training_dataset is required (a job without one only evaluates "
        "initial_adapter on validation_dataset, and needs both)");
  }
  if (!request.training_dataset().empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(
        record.training_dataset_id,
        DatasetReference(context, tenant, request.training_dataset(),
                         "training_dataset"));
  }
  if (!request.validation_dataset().empty()) {
    LORAPLEX_ASSIGN_OR_RETURN(
        record.validation_dataset_id,
        DatasetReference(context, tenant, request.validation_dataset(),
                         "validation_dataset"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      pending.spec, JobSpecFromProto(request.lora(), request.optimizer(),
                                     request.schedule(), request.training()));
  if (has_adapter) {
    absl::StatusOr<AdapterRecord> adapter;
    if (initial_adapter != nullptr) {
      adapter = *initial_adapter;
    } else {
      LORAPLEX_ASSIGN_OR_RETURN(
          std::string id, ParseResourceName(request.initial_adapter(),
                                            "adapters", "initial_adapter"));
      adapter = context.store->GetAdapter(tenant, id);
      LORAPLEX_RETURN_IF_ERROR(Prefixed("initial_adapter", adapter.status()));
    }
    record.initial_adapter_id = adapter->id;
    // The adapter's own LoRA settings win: its tensors are shaped by them.
    absl::StatusOr<LoraConfig> lora = LoraConfigFromJson(adapter->lora);
    LORAPLEX_RETURN_IF_ERROR(Prefixed("initial_adapter", lora.status()));
    pending.spec.lora = *lora;
  }
  const int64_t interval = pending.spec.training.checkpoint_interval;
  if (interval > 0 && interval < context.limits.min_checkpoint_interval) {
    return absl::InvalidArgumentError(absl::StrCat(
        "training.checkpoint_interval must be 0 or at least ",
        context.limits.min_checkpoint_interval,
        " on this server (--min-checkpoint-interval), got ", interval));
  }
  if (pending.spec.lora.rank > context.limits.max_rank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora.rank must be at most ", context.limits.max_rank,
        " on this server (--max-rank), got ", pending.spec.lora.rank));
  }
  // A fused layout (Phi-3) adapts q/k/v or gate/up only together; adapted
  // experts (mixture-of-experts bases) take no dropout.
  LORAPLEX_RETURN_IF_ERROR(FitLoraTargets(context.model,
                                          pending.spec.lora.targets,
                                          pending.spec.lora.dropout)
                               .status());
  // The default seq_len is a default for any model: on one with fewer
  // positions it is the model's (a seq_len asked for is never changed).
  if (!request.training().has_seq_len()) {
    pending.spec.training.seq_len = std::min(
        pending.spec.training.seq_len, context.model.max_position_embeddings);
  }
  // Every sequence is cut or packed to seq_len: bounding it here keeps a
  // job's data from ever failing the co-batched step of other jobs.
  if (pending.spec.training.seq_len > context.model.max_position_embeddings) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.seq_len must be at most the base model's "
                     "max_position_embeddings (",
                     context.model.max_position_embeddings, "), got ",
                     pending.spec.training.seq_len));
  }
  LORAPLEX_ASSIGN_OR_RETURN(
      pending.request,
      RequestKeyOf(tenant, "CreateJob", request.request_id(), "request_id"));
  record.id = NewResourceId("job");
  record.tenant = tenant;
  record.display_name = request.display_name();
  record.base_model = context.base_model_name;
  return pending;
}

absl::StatusOr<JobRecord> CreateJobFromCheckpoint(
    const ServiceContext& context, const std::string& tenant,
    const v1::CreateJobRequest& request, const std::string& checkpoint_dir) {
  constexpr absl::string_view kField = "initial_checkpoint";
  LORAPLEX_RETURN_IF_ERROR(CheckCheckpoint(checkpoint_dir, kField));
  LORAPLEX_ASSIGN_OR_RETURN(
      std::string config, ReadCheckpointFile(checkpoint_dir, kPeftConfigFile));
  LORAPLEX_ASSIGN_OR_RETURN(
      std::string weights,
      ReadCheckpointFile(checkpoint_dir, kPeftWeightsFile));
  LORAPLEX_ASSIGN_OR_RETURN(
      CheckpointRef source,
      ParseCheckpointName(request.initial_checkpoint(), kField));
  absl::StatusOr<std::unique_ptr<StagedAdapter>> staged = StagedAdapter::Create(
      context, tenant,
      absl::StrCat("step ", source.step, " of job ", source.job_id), config,
      weights);
  LORAPLEX_RETURN_IF_ERROR(Prefixed(kField, staged.status()));
  AdapterRecord& adapter = (*staged)->record();
  adapter.job_id = source.job_id;
  LORAPLEX_ASSIGN_OR_RETURN(
      PendingJob pending,
      ValidateCreateJob(context, tenant, request, &adapter));
  // Stored only for a job that is queued.
  return SubmitJob(context, std::move(pending), staged->get());
}

absl::StatusOr<JobRecord> SubmitJob(const ServiceContext& context,
                                    PendingJob pending, StagedAdapter* upload) {
  LORAPLEX_ASSIGN_OR_RETURN(
      JobData data,
      PrepareJobData(*context.datasets, pending.record, &pending.spec));
  LORAPLEX_RETURN_IF_ERROR(
      CheckRowsFit(data, pending.spec, context.limits.max_row_tokens));
  const std::optional<RequestKey> request = pending.request;
  if (request) TestMeet();
  if (upload != nullptr) LORAPLEX_RETURN_IF_ERROR(upload->Publish());
  absl::StatusOr<JobRecord> job = context.scheduler->Submit(
      std::move(pending.record), std::move(pending.spec), std::move(data),
      request);
  if (request && absl::IsAlreadyExists(job.status())) {
    // A repeat that ran alongside the first: the first's job answers, and
    // this one's upload goes (the first stored its own).
    LORAPLEX_ASSIGN_OR_RETURN(std::optional<JobRecord> earlier,
                              EarlierJobOf(context, request));
    if (earlier) {
      if (upload != nullptr) {
        if (absl::Status withdrawn = upload->Withdraw(); !withdrawn.ok()) {
          // Still the right answer; the copy stays as a stored adapter.
          context.logger->Warning(
              "adapter ", upload->record().id,
              " of a repeated request stays stored: ", withdrawn.ToString());
        }
      }
      return *std::move(earlier);
    }
  }
  return job;
}

absl::StatusOr<std::optional<JobRecord>> EarlierJobOf(
    const ServiceContext& context, const std::optional<RequestKey>& request) {
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<std::string> id,
                            EarlierResult(context, request));
  if (!id) return std::nullopt;
  return context.store->GetJob(request->tenant, *id);
}

}  // namespace loraplex
