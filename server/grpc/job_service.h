// JobService: create, inspect, list and cancel fine-tuning jobs, and stream
// their events (WatchJob) from the store as the scheduler commits them.
#ifndef LORAPLEX_SERVER_GRPC_JOB_SERVICE_H_
#define LORAPLEX_SERVER_GRPC_JOB_SERVICE_H_

#include "loraplex/v1/jobs.grpc.pb.h"
#include "server/grpc/unary_calls.h"
#include "server/jobs/job_event_hub.h"

namespace loraplex {

class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  JobServiceImpl(const ServiceContext* context, JobEventHub* hub)
      : context_(context), hub_(hub) {}

  grpc::ServerUnaryReactor* CreateJob(grpc::CallbackServerContext* call,
                                      const v1::CreateJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* call,
                                   const v1::GetJobRequest* request,
                                   v1::Job* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* call,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* call,
                                      const v1::CancelJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerWriteReactor<v1::JobEvent>* WatchJob(
      grpc::CallbackServerContext* call,
      const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* ListJobEvents(
      grpc::CallbackServerContext* call,
      const v1::ListJobEventsRequest* request,
      v1::ListJobEventsResponse* response) override;
  grpc::ServerUnaryReactor* PauseJob(grpc::CallbackServerContext* call,
                                     const v1::PauseJobRequest* request,
                                     v1::Job* response) override;
  grpc::ServerUnaryReactor* ResumeJob(grpc::CallbackServerContext* call,
                                      const v1::ResumeJobRequest* request,
                                      v1::Job* response) override;
  grpc::ServerUnaryReactor* ListCheckpoints(
      grpc::CallbackServerContext* call,
      const v1::ListCheckpointsRequest* request,
      v1::ListCheckpointsResponse* response) override;

  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* call,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse* response) override;

 private:
  grpc::ServerUnaryReactor* CreateJobFromCheckpoint(
      grpc::CallbackServerContext* call, const v1::CreateJobRequest* request,
      v1::Job* response);

  const ServiceContext* context_;
  JobEventHub* hub_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_JOB_SERVICE_H_
