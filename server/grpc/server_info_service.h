// ServerService: what this server runs (base model, slots, limits).
#ifndef LORAPLEX_SERVER_GRPC_SERVER_INFO_SERVICE_H_
#define LORAPLEX_SERVER_GRPC_SERVER_INFO_SERVICE_H_

#include "loraplex/v1/server.grpc.pb.h"
#include "server/grpc/unary_calls.h"

namespace loraplex {

class ServerInfoServiceImpl final : public v1::ServerService::CallbackService {
 public:
  explicit ServerInfoServiceImpl(const ServiceContext* context)
      : context_(context) {}

  grpc::ServerUnaryReactor* GetServerInfo(
      grpc::CallbackServerContext* call,
      const v1::GetServerInfoRequest* request,
      v1::ServerInfo* response) override;

 private:
  const ServiceContext* context_;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_SERVER_INFO_SERVICE_H_
