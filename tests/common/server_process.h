// Runs the real loraplex-server (LORAPLEX_BIN_DIR/loraplex-server) as a
// child process for end-to-end tests, on a free local port: the CLI's
// LocalServer with the flags tests use and the log read back for failure
// messages.
//
//   ServerProcessOptions options;
//   options.state_dir = FreshTestDir("state");
//   auto server = ServerProcess::Start(options);
//   ASSERT_TRUE(server.ok()) << server.status();
//   ... connect to (*server)->address() ...
//   EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
//
// The server's stdout and stderr go to <state_dir>/server.log. A
// ServerProcess destroyed while the server still runs kills it, as a crash
// would.
#ifndef LORAPLEX_TESTS_COMMON_SERVER_PROCESS_H_
#define LORAPLEX_TESTS_COMMON_SERVER_PROCESS_H_

#include <sys/types.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "client/local_server.h"
#include "tests/common/test_threads.h"

namespace loraplex {

struct ServerProcessOptions {
  // --state-dir; also holds `ready` and `server.log`. Created if missing.
  std::string state_dir;
  // --model; empty: the server's built-in tiny model.
  std::string model_dir;
  int slots = 4;
  // More flags, appended last.
  std::vector<std::string> extra_args;
  // The program to run; empty: LORAPLEX_BIN_DIR/loraplex-server.
  std::string binary;
};

class ServerProcess {
 public:
  // Seconds Start() waits for the ready file and Stop() for the exit.
  static constexpr int kReadySeconds = 60;
  static constexpr int kStopSeconds = 60;

  // Starts the server with --slots and --model (when set), then the extra
  // args, and waits for it to serve. Fails early, with the log's tail, when
  // the server exits first.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const ServerProcessOptions& options) {
    if (options.state_dir.empty()) {
      return absl::InvalidArgumentError("state_dir must be set");
    }
    LocalServerOptions local;
    local.binary = options.binary.empty()
                       ? std::string(LORAPLEX_BIN_DIR) + "/loraplex-server"
                       : options.binary;
    local.state_dir = options.state_dir;
    local.ready_timeout = absl::Seconds(kReadySeconds);
    local.extra_args = {"--slots", std::to_string(options.slots)};
    if (!options.model_dir.empty()) {
      local.extra_args.push_back("--model");
      local.extra_args.push_back(options.model_dir);
    }
    local.extra_args.insert(local.extra_args.end(), options.extra_args.begin(),
                            options.extra_args.end());
    local.extra_args = WithTestThreads(local.extra_args);
    absl::StatusOr<std::unique_ptr<LocalServer>> server =
        LocalServer::Start(local);
    if (!server.ok()) return server.status();
    return std::unique_ptr<ServerProcess>(
        new ServerProcess(*std::move(server)));
  }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Kill(); }

  // "127.0.0.1:PORT".
  const std::string& address() const { return server_->address(); }
  // -1 once the process was reaped.
  pid_t pid() const { return server_->pid(); }
  const std::string& log_path() const { return server_->log_path(); }

  // SIGTERM and wait up to kStopSeconds (then SIGKILL and an error); an
  // error too when the exit status is not 0. Errors end with the log's
  // tail.
  absl::Status Stop() {
    absl::Status status = server_->Stop(absl::Seconds(kStopSeconds));
    if (status.ok()) return status;
    return absl::Status(status.code(),
                        absl::StrCat(status.message(), "; log tail:\n",
                                     FileTail(log_path(), 30)));
  }

  // SIGKILL and reap (nothing when already reaped).
  void Kill() { server_->Kill(); }

  // The whole server.log.
  std::string Log() const {
    std::ifstream in(log_path(), std::ios::binary);
    std::ostringstream contents;
    contents << in.rdbuf();
    return contents.str();
  }

 private:
  explicit ServerProcess(std::unique_ptr<LocalServer> server)
      : server_(std::move(server)) {}

  std::unique_ptr<LocalServer> server_;
};

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_SERVER_PROCESS_H_
