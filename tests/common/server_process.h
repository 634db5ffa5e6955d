// Runs the real loraplex-server (LORAPLEX_BIN_DIR/loraplex-server) as a
// child process for end-to-end tests, on a free local port.
//
//   ServerProcessOptions options;
//   options.state_dir = FreshTestDir("state");
//   auto server = ServerProcess::Start(options);
//   ASSERT_TRUE(server.ok()) << server.status();
//   ... connect to (*server)->address() ...
//   EXPECT_TRUE((*server)->Stop().ok()) << (*server)->Log();
//
// The server's stdout and stderr go to <state_dir>/server.log; Log() reads
// it back for failure messages. A ServerProcess destroyed while the server
// runs kills it, and the server also gets SIGTERM if the test process dies.
#ifndef LORAPLEX_TESTS_COMMON_SERVER_PROCESS_H_
#define LORAPLEX_TESTS_COMMON_SERVER_PROCESS_H_

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace loraplex {

struct ServerProcessOptions {
  // --state-dir; also holds `ready` and `server.log`. Created if missing.
  std::string state_dir;
  // --model; empty: the server's built-in tiny model.
  std::string model_dir;
  int slots = 4;
  // More flags, appended last.
  std::vector<std::string> extra_args;
};

class ServerProcess {
 public:
  // Seconds Start() waits for the ready file and Stop() for the exit.
  static constexpr int kReadySeconds = 60;
  static constexpr int kStopSeconds = 60;

  // Starts LORAPLEX_BIN_DIR/loraplex-server with --state-dir, --listen
  // 127.0.0.1:0, --ready-file <state_dir>/ready, --slots and --model (when
  // set), then the extra args, and waits for the ready file. Fails early,
  // with the log's tail, when the server exits first.
  static absl::StatusOr<std::unique_ptr<ServerProcess>> Start(
      const ServerProcessOptions& options) {
    const std::string binary =
        std::string(LORAPLEX_BIN_DIR) + "/loraplex-server";
    if (::access(binary.c_str(), X_OK) != 0) {
      return absl::NotFoundError(
          absl::StrCat(binary, ": ", std::strerror(errno)));
    }
    if (options.state_dir.empty()) {
      return absl::InvalidArgumentError("state_dir must be set");
    }
    std::error_code error;
    std::filesystem::create_directories(options.state_dir, error);
    if (error) {
      return absl::InternalError(
          absl::StrCat("state_dir ", options.state_dir, ": ", error.message()));
    }
    const std::string ready_path = options.state_dir + "/ready";
    const std::string log_path = options.state_dir + "/server.log";
    std::filesystem::remove(ready_path, error);

    std::vector<std::string> args = {
        binary,     "--state-dir", options.state_dir,
        "--listen", "127.0.0.1:0", "--ready-file",
        ready_path, "--slots",     std::to_string(options.slots)};
    if (!options.model_dir.empty()) {
      args.push_back("--model");
      args.push_back(options.model_dir);
    }
    args.insert(args.end(), options.extra_args.begin(),
                options.extra_args.end());
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);

    const int log_fd = ::open(log_path.c_str(),
                              O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (log_fd < 0) {
      return absl::InternalError(
          absl::StrCat(log_path, ": ", std::strerror(errno)));
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid < 0) {
      const int fork_errno = errno;  // close() may change errno.
      ::close(log_fd);
      return absl::InternalError(
          absl::StrCat("fork: ", std::strerror(fork_errno)));
    }
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(127);
      const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
      if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(log_fd);
    std::unique_ptr<ServerProcess> server(new ServerProcess(pid, log_path));

    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(kReadySeconds);
    while (true) {
      std::string ready = ReadFile(ready_path);
      if (!ready.empty() && ready.back() == '\n') {
        server->address_ = std::string(absl::StripAsciiWhitespace(ready));
        return server;
      }
      int wait_status = 0;
      if (::waitpid(pid, &wait_status, WNOHANG) == pid) {
        server->pid_ = -1;
        return absl::FailedPreconditionError(absl::StrCat(
            "loraplex-server ", DescribeWaitStatus(wait_status),
            " before it was ready; log tail:\n", server->LogTail(30)));
      }
      if (std::chrono::steady_clock::now() >= deadline) {
        server->Kill();
        return absl::DeadlineExceededError(
            absl::StrCat("loraplex-server not ready within ", kReadySeconds,
                         " s; log tail:\n", server->LogTail(30)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  ~ServerProcess() { Kill(); }

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  // -1 once the process was reaped.
  pid_t pid() const { return pid_; }
  const std::string& log_path() const { return log_path_; }

  // SIGTERM and wait up to kStopSeconds (then SIGKILL and an error); an
  // error too when the exit status is not 0.
  absl::Status Stop() {
    if (pid_ <= 0) return absl::OkStatus();
    ::kill(pid_, SIGTERM);
    const int wait_status = WaitForExit(std::chrono::seconds(kStopSeconds));
    if (wait_status == -1) {
      Kill();
      return absl::DeadlineExceededError(
          absl::StrCat("loraplex-server did not exit within ", kStopSeconds,
                       " s of SIGTERM; killed it. Log tail:\n", LogTail(30)));
    }
    if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
      return absl::InternalError(
          absl::StrCat("loraplex-server ", DescribeWaitStatus(wait_status),
                       " after SIGTERM. Log tail:\n", LogTail(30)));
    }
    return absl::OkStatus();
  }

  // SIGKILL and reap (nothing when already reaped).
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    WaitForExit(std::chrono::seconds(30));
    pid_ = -1;
  }

  // The whole server.log.
  std::string Log() const { return ReadFile(log_path_); }

 private:
  ServerProcess(pid_t pid, std::string log_path)
      : pid_(pid), log_path_(std::move(log_path)) {}

  static std::string ReadFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "";
    std::ostringstream contents;
    contents << in.rdbuf();
    return contents.str();
  }

  static std::string DescribeWaitStatus(int wait_status) {
    if (WIFEXITED(wait_status)) {
      return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
    }
    if (WIFSIGNALED(wait_status)) {
      return absl::StrCat("was killed by signal ", WTERMSIG(wait_status));
    }
    return absl::StrCat("ended with wait status ", wait_status);
  }

  std::string LogTail(size_t max_lines) const {
    const std::string log = Log();
    size_t start = log.size();
    for (size_t lines = 0; start > 0 && lines <= max_lines;) {
      --start;
      if (log[start] == '\n') ++lines;
    }
    return log.substr(start);
  }

  // The wait status once the process exits within `timeout` (it is then
  // reaped), or -1 if it still runs.
  int WaitForExit(std::chrono::seconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (true) {
      int wait_status = 0;
      const pid_t done = ::waitpid(pid_, &wait_status, WNOHANG);
      if (done == pid_) {
        pid_ = -1;
        return wait_status;
      }
      if (done < 0 && errno != EINTR) {
        pid_ = -1;
        return 0;
      }
      if (std::chrono::steady_clock::now() >= deadline) return -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  pid_t pid_;
  std::string address_;
  std::string log_path_;
};

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_SERVER_PROCESS_H_
