// SamplingService: Sample and StreamSample (proto/loraplex/v1/sampling.proto).
// Requests become native ones (SamplingRequestOf) and are checked,
// tokenized (text, or chat messages through the model's template) and their
// weights resolved on a worker (SampleCommandOf, sampling_request.h, as the
// Tinker API's), then decoded on the trainer between training steps
// (JobTrainer::Sample). Each tenant has at most
// ServiceLimits::max_samples_per_tenant requests in flight.
#ifndef LORAPLEX_SERVER_GRPC_SAMPLING_SERVICE_H_
#define LORAPLEX_SERVER_GRPC_SAMPLING_SERVICE_H_

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "loraplex/v1/sampling.grpc.pb.h"
#include "server/edges/sample_admissions.h"
#include "server/edges/sampling_request.h"
#include "server/grpc/unary_calls.h"
#include "server/jobs/job_trainer.h"

namespace loraplex {

class SamplingServiceImpl final : public v1::SamplingService::CallbackService {
 public:
  // `admissions`: the tenants' requests in flight, shared with the other
  // edges that sample; null: this service's own, of
  // limits.max_samples_per_tenant.
  explicit SamplingServiceImpl(
      const ServiceContext* context,
      std::shared_ptr<SampleAdmissions> admissions = nullptr);

  grpc::ServerUnaryReactor* Sample(grpc::CallbackServerContext* call,
                                   const v1::SampleRequest* request,
                                   v1::SampleResponse* response) override;
  grpc::ServerWriteReactor<v1::SampleStreamChunk>* StreamSample(
      grpc::CallbackServerContext* call,
      const v1::SampleRequest* request) override;

 private:
  // The caller's tenant, counted in flight (SampleAdmissions::Leave when
  // its call is answered).
  absl::StatusOr<std::string> Admit(grpc::CallbackServerContext* call);

  const ServiceContext* context_;
  std::shared_ptr<SampleAdmissions> admissions_;
};

// The native request of `request` (its zeros read as the proto's
// defaults); checked by SampleCommandOf.
SamplingRequest SamplingRequestOf(const v1::SampleRequest& request);

// The response for a finished command.
void SampleResponseOf(const SampleCommand& command, const SampleResult& result,
                      int64_t weights_step, v1::SampleResponse* response);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_SAMPLING_SERVICE_H_
