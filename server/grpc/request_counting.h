// A gRPC server interceptor that counts every call's final status by method
// in RequestCounters (transport "grpc"), for /metrics:
//
//   std::vector<std::unique_ptr<
//       grpc::experimental::ServerInterceptorFactoryInterface>> creators;
//   creators.push_back(CountRequestsInterceptor(&counters));
//   builder.experimental().SetInterceptorCreators(std::move(creators));
#ifndef LORAPLEX_SERVER_GRPC_REQUEST_COUNTING_H_
#define LORAPLEX_SERVER_GRPC_REQUEST_COUNTING_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

#include "server/common/request_counters.h"

namespace loraplex {

// `counters` must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CountRequestsInterceptor(RequestCounters* counters);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_REQUEST_COUNTING_H_
