#include "server/http/http_listener.h"

#include <httplib.h>

#include <filesystem>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace loraplex {

std::optional<std::string> ApiKeyHeader(const httplib::Request& request) {
  if (!request.has_header("X-API-Key")) return std::nullopt;
  return request.get_header_value("X-API-Key");
}

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(
    const HttpListenerOptions& options,
    const std::function<void(httplib::Server&)>& add_routes) {
  const size_t colon = options.address.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(options.address.substr(colon + 1), &port) || port < 0 ||
      port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--http-listen must be HOST:PORT, got \"", options.address, "\""));
  }
  std::string host = options.address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  std::unique_ptr<HttpListener> listener(new HttpListener());
  if (!options.tls_cert.empty()) {
    for (const std::string& file : {options.tls_cert, options.tls_key}) {
      if (!std::filesystem::is_regular_file(file)) {
        return absl::InvalidArgumentError(
            absl::StrCat("cannot read the TLS file ", file));
      }
    }
    auto tls = std::make_unique<httplib::SSLServer>(options.tls_cert.c_str(),
                                                    options.tls_key.c_str());
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the TLS certificate ", options.tls_cert, " and key ",
                       options.tls_key, " do not load"));
    }
    listener->server_ = std::move(tls);
  } else {
    listener->server_ = std::make_unique<httplib::Server>();
  }
  httplib::Server& server = *listener->server_;
  const int threads = options.threads;
  server.new_task_queue = [threads] {
    return new httplib::ThreadPool(threads);
  };
  server.set_keep_alive_max_count(100000);
  // Stop() waits for idle keep-alive connections to time out (httplib
  // checks for a stop only between requests), so keep that short.
  server.set_keep_alive_timeout(5);
  server.set_read_timeout(60);
  server.set_write_timeout(60);
  server.set_payload_max_length(options.max_body_bytes);
  if (RequestCounters* counters = options.counters) {
    server.set_logger([counters](const httplib::Request& request,
                                 const httplib::Response& response) {
      counters->Count("http", HttpRoute(request.path),
                      absl::StrCat(response.status));
    });
  }
  add_routes(server);
  listener->port_ = port == 0 ? server.bind_to_any_port(host)
                              : (server.bind_to_port(host, port) ? port : -1);
  if (listener->port_ <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.address, " (HTTP)"));
  }
  listener->thread_ = std::thread([&server] { server.listen_after_bind(); });
  return listener;
}

HttpListener::~HttpListener() { Stop(); }

void HttpListener::Stop() {
  if (server_ != nullptr) server_->stop();
  if (thread_.joinable()) thread_.join();
}

}  // namespace loraplex
