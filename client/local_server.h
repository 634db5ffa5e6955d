// A loraplex-server child process for `loraplex quickstart`: started on a
// free local port, with its log in a file, and stopped on request or when
// this object goes away.
//
//   LocalServerOptions options;
//   options.binary = ServerBinaryNextTo(SelfExecutablePath());
//   options.state_dir = "loraplex-quickstart/state";
//   LORAPLEX_ASSIGN_OR_RETURN(auto server, LocalServer::Start(options));
//   ... connect to server->address() ...
//   LORAPLEX_RETURN_IF_ERROR(server->Stop());
#ifndef LORAPLEX_CLIENT_LOCAL_SERVER_H_
#define LORAPLEX_CLIENT_LOCAL_SERVER_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace loraplex {

struct LocalServerOptions {
  // Path of the loraplex-server program.
  std::string binary;
  // --state-dir; also holds `ready` (the bound address) and `server.log`.
  std::string state_dir;
  // How long to wait for the server to write its ready file.
  absl::Duration ready_timeout = absl::Seconds(60);
  // More flags, after --state-dir, --listen and --ready-file.
  std::vector<std::string> extra_args;
};

// This program's path, from /proc/self/exe; "" when unknown.
std::string SelfExecutablePath();

// "loraplex-server" in the directory of `executable_path`.
std::string ServerBinaryNextTo(const std::string& executable_path);

// The last `max_lines` lines of the file at `path` ("" when unreadable).
std::string FileTail(const std::string& path, int max_lines);

class LocalServer {
 public:
  // Starts the server with `--listen 127.0.0.1:0` and waits for its ready
  // file. FAILED_PRECONDITION (with the log's tail) when it exits first,
  // DEADLINE_EXCEEDED when it is not ready in time (it is killed then).
  static absl::StatusOr<std::unique_ptr<LocalServer>> Start(
      const LocalServerOptions& options);

  LocalServer(const LocalServer&) = delete;
  LocalServer& operator=(const LocalServer&) = delete;
  // Stops the server if it still runs.
  ~LocalServer();

  // "127.0.0.1:PORT" the server listens on.
  const std::string& address() const { return address_; }
  const std::string& log_path() const { return log_path_; }
  pid_t pid() const { return pid_; }

  // SIGTERM, then waits up to `timeout` for a graceful exit (SIGKILL after
  // it). An error when the server did not exit with status 0.
  absl::Status Stop(absl::Duration timeout = absl::Seconds(60));
  // SIGKILL and reap, as a crash would end it (nothing when it has exited).
  void Kill();

 private:
  LocalServer(pid_t pid, std::string address, std::string log_path)
      : pid_(pid),
        address_(std::move(address)),
        log_path_(std::move(log_path)) {}

  pid_t pid_;  // -1 once reaped.
  std::string address_;
  std::string log_path_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CLIENT_LOCAL_SERVER_H_
