// The server's HTTP listener (cpp-httplib): the Tinker REST API and
// /metrics, on a pool of threads so that long polls do not hold up other
// calls.
//
//   LORAPLEX_ASSIGN_OR_RETURN(
//       std::unique_ptr<HttpListener> http,
//       HttpListener::Start(options, [&](httplib::Server& s) { ... }));
//   http->port();
//   http->Stop();
#ifndef LORAPLEX_SERVER_HTTP_HTTP_LISTENER_H_
#define LORAPLEX_SERVER_HTTP_HTTP_LISTENER_H_

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/common/request_counters.h"

namespace httplib {
class Server;
struct Request;
}  // namespace httplib

namespace loraplex {

struct HttpListenerOptions {
  std::string address;  // HOST:PORT; port 0 picks a free one.
  // PEM files for HTTPS; both empty: plain HTTP.
  std::string tls_cert;
  std::string tls_key;
  // Calls served at once (long polls each hold one).
  int threads = 128;
  // Largest request body.
  size_t max_body_bytes = size_t{256} << 20;
  // Counts each answered request (transport "http", its HttpRoute and
  // status); may be null. Must outlive the listener.
  RequestCounters* counters = nullptr;
};

// The X-API-Key header of `request` (the Tinker SDK's key), if it has one.
std::optional<std::string> ApiKeyHeader(const httplib::Request& request);

class HttpListener {
 public:
  // Binds and starts serving the routes `add_routes` adds. UNAVAILABLE
  // when the address cannot be bound; INVALID_ARGUMENT for a malformed one
  // or TLS files that do not load.
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(
      const HttpListenerOptions& options,
      const std::function<void(httplib::Server&)>& add_routes);
  ~HttpListener();  // Stop()s.

  int port() const { return port_; }
  // Stops accepting, ends the open connections and joins. Idempotent.
  void Stop();

 private:
  HttpListener() = default;

  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace loraplex

#endif  // LORAPLEX_SERVER_HTTP_HTTP_LISTENER_H_
