#include "server/grpc/request_counting.h"

#include <string>

#include "absl/status/status.h"

namespace loraplex {
namespace {

using grpc::experimental::InterceptionHookPoints;

class CountingInterceptor : public grpc::experimental::Interceptor {
 public:
  CountingInterceptor(RequestCounters* counters, const char* method)
      : counters_(counters), method_(method == nullptr ? "" : method) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            InterceptionHookPoints::PRE_SEND_STATUS)) {
      counters_->Count("grpc", method_,
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(
                           methods->GetSendStatus().error_code())));
    }
    methods->Proceed();
  }

 private:
  RequestCounters* counters_;
  std::string method_;
};

class CountingFactory
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit CountingFactory(RequestCounters* counters) : counters_(counters) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new CountingInterceptor(counters_, info->method());
  }

 private:
  RequestCounters* counters_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
CountRequestsInterceptor(RequestCounters* counters) {
  return std::make_unique<CountingFactory>(counters);
}

}  // namespace loraplex
