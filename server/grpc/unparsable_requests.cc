#include "server/grpc/unparsable_requests.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace loraplex {
namespace {

using grpc::experimental::InterceptionHookPoints;
using grpc::experimental::ServerRpcInfo;

// One per call. gRPC parses a unary or server-streaming request before the
// handler runs and hands the interceptors no message when it could not:
// then no handler ran, and the status it sends is gRPC's own.
class UnparsableRequestInterceptor : public grpc::experimental::Interceptor {
 public:
  explicit UnparsableRequestInterceptor(const ServerRpcInfo& info)
      : parsed_by_grpc_(info.type() == ServerRpcInfo::Type::UNARY ||
                        info.type() == ServerRpcInfo::Type::SERVER_STREAMING),
        method_(info.method() == nullptr ? "" : info.method()) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (parsed_by_grpc_ && methods->QueryInterceptionHookPoint(
                               InterceptionHookPoints::POST_RECV_MESSAGE)) {
      unparsable_ = methods->GetRecvMessage() == nullptr;
      parsed_by_grpc_ = false;  // The request is the only message.
    }
    if (unparsable_ && methods->QueryInterceptionHookPoint(
                           InterceptionHookPoints::PRE_SEND_STATUS)) {
      methods->ModifySendStatus(grpc::Status(
          grpc::StatusCode::INVALID_ARGUMENT,
          absl::StrCat("the request could not be parsed as the message ",
                       method_,
                       " takes (malformed, truncated, or a string that is "
                       "not UTF-8)")));
    }
    methods->Proceed();
  }

 private:
  bool parsed_by_grpc_;  // Until its request was seen.
  bool unparsable_ = false;
  std::string method_;
};

class UnparsableRequestFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(
      ServerRpcInfo* info) override {
    return new UnparsableRequestInterceptor(*info);
  }
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
RefuseUnparsableRequestsInterceptor() {
  return std::make_unique<UnparsableRequestFactory>();
}

}  // namespace loraplex
