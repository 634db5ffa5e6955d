// TrainingSessionService (proto/loraplex/v1/sessions.proto): requests are
// converted to native ones at this edge and checked (forward_backward's by
// session_requests.h, as the Tinker API's: datums against the base model's
// vocabulary and positions, losses and their settings), then ordered and
// applied by the SessionManager on the trainer.
#ifndef LORAPLEX_SERVER_SESSIONS_SESSION_SERVICE_H_
#define LORAPLEX_SERVER_SESSIONS_SESSION_SERVICE_H_

#include <grpcpp/grpcpp.h>

#include <string>

#include "absl/status/statusor.h"
#include "loraplex/v1/sessions.grpc.pb.h"
#include "server/grpc/unary_calls.h"
#include "server/sessions/session_manager.h"
#include "server/sessions/session_requests.h"

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

// The native request of `request` (targets_per_position 0 read as 1);
// checked by SessionForwardBackwardOf (session_requests.h).
ForwardBackwardInput ForwardBackwardInputOf(
    const v1::ForwardBackwardRequest& request);

void SessionResultToProto(const SessionResult& result,
                          v1::SessionResult* proto);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_SESSIONS_SESSION_SERVICE_H_
