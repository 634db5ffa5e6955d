// Requests answered, by transport, method and outcome, for /metrics:
//
//   counters.Count("grpc", "/loraplex.v1.JobService/GetJob", "NOT_FOUND");
//   counters.Count("http", HttpRoute(request.path), "404");
//   for (const RequestCount& c : counters.Snapshot()) ...
//
// Thread-safe; counts only grow.
#ifndef LORAPLEX_SERVER_COMMON_REQUEST_COUNTERS_H_
#define LORAPLEX_SERVER_COMMON_REQUEST_COUNTERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace loraplex {

struct RequestCount {
  std::string transport;  // "grpc" or "http".
  std::string method;     // A gRPC method's full name, or an HTTP route.
  std::string code;       // A gRPC status code's name, or an HTTP status.
  int64_t count = 0;
};

class RequestCounters {
 public:
  void Count(absl::string_view transport, absl::string_view method,
             absl::string_view code);
  // Every (transport, method, code) counted so far, sorted.
  std::vector<RequestCount> Snapshot() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::tuple<std::string, std::string, std::string>, int64_t> counts_
      ABSL_GUARDED_BY(mu_);
};

// The route of an HTTP path, for a label with few values: each segment
// that is not a plain word (lower-case letters, digits after the first
// letter, '_' and '.') becomes "{id}", and an empty path "/".
//   "/api/v1/sessions/tinker-4x8/finish" -> "/api/v1/sessions/{id}/finish"
std::string HttpRoute(absl::string_view path);

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_COMMON_REQUEST_COUNTERS_H_
