// A gRPC server interceptor that answers a request which does not parse as
// its method's message (truncated, an overlong varint, a proto3 string that
// is not UTF-8) with INVALID_ARGUMENT "the request could not be parsed ...".
// gRPC 1.51's callback handlers answer such a request UNIMPLEMENTED with no
// message, as if the method did not exist.
//
//   creators.push_back(RefuseUnparsableRequestsInterceptor());
//   creators.push_back(...);  // Later ones see INVALID_ARGUMENT.
//   builder.experimental().SetInterceptorCreators(std::move(creators));
//
// Only requests gRPC parses before the handler runs (unary and
// server-streaming methods); a client-streaming handler parses its own.
#ifndef LORAPLEX_SERVER_GRPC_UNPARSABLE_REQUESTS_H_
#define LORAPLEX_SERVER_GRPC_UNPARSABLE_REQUESTS_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>

namespace loraplex {

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RefuseUnparsableRequestsInterceptor();

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_GRPC_UNPARSABLE_REQUESTS_H_
