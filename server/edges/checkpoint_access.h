// Finding a tenant's checkpoint by resource name for the service's
// ExportAdapter, Sample and CreateJob(initial_checkpoint) at every edge,
// and the adapter weights of a stored adapter or a job for ExportAdapter and
// Sample.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::string dir,
//       FindCheckpoint(context, tenant, request.checkpoint(), "checkpoint"));
//   LORAPLEX_RETURN_IF_ERROR(CheckCheckpoint(dir, "checkpoint"));  // worker
#ifndef LORAPLEX_SERVER_EDGES_CHECKPOINT_ACCESS_H_
#define LORAPLEX_SERVER_EDGES_CHECKPOINT_ACCESS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/edges/service_context.h"

namespace loraplex {

// The directory of the checkpoint `name` ("jobs/{job_id}/checkpoints/
// {step}") of request field `field`. INVALID_ARGUMENT for a malformed name;
// NOT_FOUND when the job is not the tenant's or that checkpoint is not on
// disk (the server keeps the newest --keep-checkpoints of each job).
absl::StatusOr<std::string> FindCheckpoint(const ServiceContext& context,
                                           const std::string& tenant,
                                           absl::string_view name,
                                           absl::string_view field);

// DATA_LOSS naming the field when the checkpoint in `dir` fails
// verification against its manifest. Reads every file: call on a worker.
absl::Status CheckCheckpoint(const std::string& dir, absl::string_view field);

// The directory of the tenant's stored adapter `name` ("adapters/{id}") of
// request field `field`: INVALID_ARGUMENT for a malformed name, NOT_FOUND.
absl::StatusOr<std::string> FindStoredAdapter(const ServiceContext& context,
                                              const std::string& tenant,
                                              absl::string_view name,
                                              absl::string_view field);

// Where the adapter weights of the tenant's job `name` ("jobs/{id}") are:
// its trained adapter's directory once SUCCEEDED, or, while it trains, the
// job itself (the trainer holds its current weights). FAILED_PRECONDITION
// for any other job, saying it has no `what` ("adapter to export").
struct JobWeights {
  std::string dir;             // A SUCCEEDED job's adapter.
  std::string running_job_id;  // A RUNNING training job.
};
absl::StatusOr<JobWeights> FindJobWeights(const ServiceContext& context,
                                          const std::string& tenant,
                                          absl::string_view name,
                                          absl::string_view what);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_EDGES_CHECKPOINT_ACCESS_H_
