// What the gRPC services add to the edges' ServiceContext
// (server/edges/service_context.h): absl::Status as a gRPC status, unary
// calls finished with it, and the caller's tenant from its metadata.
//
//   grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* call,
//                                    const v1::GetJobRequest* request,
//                                    v1::Job* response) override {
//     return FinishUnary(call, [&]() -> absl::Status { ... });
//   }
#ifndef LORAPLEX_SERVER_GRPC_UNARY_CALLS_H_
#define LORAPLEX_SERVER_GRPC_UNARY_CALLS_H_

#include <grpcpp/grpcpp.h>

#include <exception>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/runtime/exception_message.h"
#include "loraplex/v1/server.pb.h"
#include "server/edges/service_context.h"

namespace loraplex {

grpc::Status ToGrpcStatus(const absl::Status& status);

// Runs `handler` and finishes the call with its status; exceptions end as
// INTERNAL so none reaches gRPC.
template <typename Handler>
grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* call,
                                      Handler&& handler) {
  absl::Status status;
  try {
    status = handler();
  } catch (const std::exception& error) {
    status = absl::InternalError(ExceptionMessage(error));
  }
  grpc::ServerUnaryReactor* reactor = call->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

inline absl::StatusOr<std::string> Authenticate(
    const ServiceContext& context, grpc::CallbackServerContext* call) {
  return context.auth->Authenticate(call->client_metadata());
}

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_UNARY_CALLS_H_
