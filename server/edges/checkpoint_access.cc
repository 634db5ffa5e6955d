#include "server/edges/checkpoint_access.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "core/common/resource_names.h"
#include "core/common/status_macros.h"
#include "server/checkpoints/checkpoint_files.h"

namespace loraplex {
absl::StatusOr<std::string> FindCheckpoint(const ServiceContext& context,
                                           const std::string& tenant,
                                           absl::string_view name,
                                           absl::string_view field) {
  LORAPLEX_ASSIGN_OR_RETURN(CheckpointRef parsed,
                            ParseCheckpointName(name, field));
  absl::Status job = context.store->GetJob(tenant, parsed.job_id).status();
  if (!job.ok()) {
    return absl::Status(job.code(), absl::StrCat(field, ": ", job.message()));
  }
  const std::string dir = CheckpointDir(
      context.scheduler->CheckpointDir(parsed.job_id), parsed.step);
  std::error_code error;
  if (!std::filesystem::exists(absl::StrCat(dir, "/", kCheckpointManifestFile),
                               error)) {
    return absl::NotFoundError(absl::StrCat(
        field, ": job \"", parsed.job_id, "\" has no checkpoint at step ",
        parsed.step, " (ListCheckpoints shows the ones kept)"));
  }
  return dir;
}

absl::Status CheckCheckpoint(const std::string& dir, absl::string_view field) {
  absl::Status status = VerifyCheckpoint(dir);
  if (status.ok()) return status;
  std::error_code error;
  if (!std::filesystem::exists(dir, error)) {
    return absl::NotFoundError(
        absl::StrCat(field,
                     ": the checkpoint was deleted meanwhile (only the newest "
                     "--keep-checkpoints of a job are kept)"));
  }
  return absl::DataLossError(
      absl::StrCat(field, ": the checkpoint is damaged: ", status.message()));
}

absl::StatusOr<std::string> FindStoredAdapter(const ServiceContext& context,
                                              const std::string& tenant,
                                              absl::string_view name,
                                              absl::string_view field) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string id,
                            ParseResourceName(name, "adapters", field));
  LORAPLEX_RETURN_IF_ERROR(context.store->GetAdapter(tenant, id).status());
  return context.scheduler->AdapterDir(id);
}

absl::StatusOr<JobWeights> FindJobWeights(const ServiceContext& context,
                                          const std::string& tenant,
                                          absl::string_view name,
                                          absl::string_view what) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string id,
                            ParseResourceName(name, "jobs", "job"));
  LORAPLEX_ASSIGN_OR_RETURN(JobRecord job, context.store->GetJob(tenant, id));
  JobWeights weights;
  if (job.status == JobStatus::kSucceeded && !job.adapter_id.empty()) {
    weights.dir = context.scheduler->AdapterDir(job.adapter_id);
    return weights;
  }
  if (job.status != JobStatus::kRunning || job.training_dataset_id.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job \"", id, "\" is ", JobStatusName(job.status),
        ": only a running training job or a succeeded one has ", what));
  }
  weights.running_job_id = id;
  return weights;
}
}  // namespace loraplex
