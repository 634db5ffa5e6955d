// TrainingSessionService (proto/loraplex/v1/sessions.proto): requests are
// checked and converted at this edge (datums against the base model's
// vocabulary and positions, losses and their settings, hyperparameters),
// then ordered and applied by the SessionManager on the trainer.
#ifndef LORAPLEX_SERVER_SERVICE_SESSION_SERVICE_H_
#define LORAPLEX_SERVER_SERVICE_SESSION_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "loraplex/v1/sessions.grpc.pb.h"
#include "server/jobs/session_manager.h"
#include "server/service/service_context.h"

namespace loraplex {

class SessionServiceImpl final
    : public v1::TrainingSessionService::CallbackService {
 public:
  explicit SessionServiceImpl(const ServiceContext* context);

  grpc::ServerUnaryReactor* CreateSession(
      grpc::CallbackServerContext* call,
      const v1::CreateSessionRequest* request, v1::Session* response) override;
  grpc::ServerUnaryReactor* GetSession(grpc::CallbackServerContext* call,
                                       const v1::GetSessionRequest* request,
                                       v1::Session* response) override;
  grpc::ServerUnaryReactor* ListSessions(
      grpc::CallbackServerContext* call, const v1::ListSessionsRequest* request,
      v1::ListSessionsResponse* response) override;
  grpc::ServerUnaryReactor* ForwardBackward(
      grpc::CallbackServerContext* call,
      const v1::ForwardBackwardRequest* request,
      v1::SessionResult* response) override;
  grpc::ServerUnaryReactor* OptimStep(grpc::CallbackServerContext* call,
                                      const v1::OptimStepRequest* request,
                                      v1::SessionResult* response) override;
  grpc::ServerUnaryReactor* SaveWeightsForSampler(
      grpc::CallbackServerContext* call,
      const v1::SaveWeightsForSamplerRequest* request,
      v1::SessionResult* response) override;
  grpc::ServerUnaryReactor* SaveState(grpc::CallbackServerContext* call,
                                      const v1::SaveStateRequest* request,
                                      v1::SessionResult* response) override;
  grpc::ServerUnaryReactor* LoadState(grpc::CallbackServerContext* call,
                                      const v1::LoadStateRequest* request,
                                      v1::SessionResult* response) override;
  grpc::ServerUnaryReactor* RetrieveResult(
      grpc::CallbackServerContext* call,
      const v1::RetrieveResultRequest* request,
      v1::RetrieveResultResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* call,
                                         const v1::CloseSessionRequest* request,
                                         v1::Session* response) override;

 private:
  // Submits `request` as operation `seq_id` of the named session and
  // finishes the call with its result.
  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* call,
                                   const std::string& session, int64_t seq_id,
                                   absl::StatusOr<SessionRequest> request,
                                   v1::SessionResult* response);

  const ServiceContext* context_;
};

// The datums of `request` checked against `limits` for its loss. Errors
// are INVALID_ARGUMENT naming the field ("data[2].loss_fn_inputs.weights:
// ...", "loss_fn_config.beta ...").
absl::StatusOr<SessionRequest> ForwardBackwardRequestOf(
    const v1::ForwardBackwardRequest& request, const DatumLimits& limits,
    int64_t max_datums);

// ForwardBackwardRequestOf with the server's limits (datums and tokens
// per call), as the gRPC and the Tinker HTTP API take them.
absl::StatusOr<SessionRequest> SessionForwardBackwardOf(
    const ServiceContext& context, const v1::ForwardBackwardRequest& request);

void SessionResultToProto(const SessionResult& result,
                          v1::SessionResult* proto);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_SERVICE_SESSION_SERVICE_H_
