// Creating a job from a CreateJobRequest, shared by CreateJob and
// AttachAdapter: a quick validation of every field and reference on the
// handler thread, then data preparation and queueing on a worker.
//
//   LORAPLEX_ASSIGN_OR_RETURN(PendingJob pending,
//                             ValidateCreateJob(context, tenant, request));
//   context.work->Post([=] { absl::StatusOr<JobRecord> job =
//                                SubmitJob(context, std::move(pending)); });
#ifndef LORAPLEX_SERVER_GRPC_JOB_CREATION_H_
#define LORAPLEX_SERVER_GRPC_JOB_CREATION_H_

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "loraplex/v1/jobs.pb.h"
#include "server/grpc/staged_adapter.h"
#include "server/grpc/unary_calls.h"
#include "server/jobs/job_spec.h"
#include "server/store/job_store.h"
#include "server/store/records.h"

namespace loraplex {

struct PendingJob {
  JobRecord record;  // Everything but the spec, which preparation fills.
  JobSpec spec;
  // The request's request_id (recorded with the job), if it has one.
  std::optional<RequestKey> request;
};

// INVALID_ARGUMENT naming the field for a bad value; NOT_FOUND naming the
// field for a dataset or adapter the tenant does not have. A non-null
// `initial_adapter` is the job's starting adapter in place of
// request.initial_adapter (an upload that is stored only if the job is
// valid).
absl::StatusOr<PendingJob> ValidateCreateJob(
    const ServiceContext& context, const std::string& tenant,
    const v1::CreateJobRequest& request,
    const AdapterRecord* initial_adapter = nullptr);

// CreateJob with request.initial_checkpoint (found at `checkpoint_dir`):
// verifies the checkpoint, stores its adapter weights as a new adapter of
// the tenant (only once the job validates; it is the job's
// initial_adapter) and submits the job. Reads files: call on a worker.
absl::StatusOr<JobRecord> CreateJobFromCheckpoint(
    const ServiceContext& context, const std::string& tenant,
    const v1::CreateJobRequest& request, const std::string& checkpoint_dir);

// Builds the job's sequences (errors name the dataset field) and queues it.
// `upload`, when set, is the adapter the job starts from: published once the
// data is ready (a failure there fails the job) and withdrawn again when the
// request turns out to repeat one that ran alongside it, whose job (and
// initial adapter) then answers.
absl::StatusOr<JobRecord> SubmitJob(const ServiceContext& context,
                                    PendingJob pending,
                                    StagedAdapter* upload = nullptr);

// The job that an earlier request with the key `request` created, or
// nullopt (none, or no key): a repeat answers with it.
absl::StatusOr<std::optional<JobRecord>> EarlierJobOf(
    const ServiceContext& context, const std::optional<RequestKey>& request);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_JOB_CREATION_H_
