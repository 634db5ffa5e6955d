#include "client/local_server.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "core/common/read_file.h"

namespace loraplex {
namespace {

constexpr int kLogTailLines = 20;

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) {
    return absl::StrCat("exited with status ", WEXITSTATUS(wait_status));
  }
  if (WIFSIGNALED(wait_status)) {
    return absl::StrCat("was killed by signal ", WTERMSIG(wait_status), " (",
                        strsignal(WTERMSIG(wait_status)), ")");
  }
  return absl::StrCat("ended with wait status ", wait_status);
}

// The address in a complete ready file ("host:port\n"); "" until then.
std::string ReadReadyFile(const std::string& path) {
  const std::string text = ReadFile(path).value_or("");
  if (text.empty() || text.back() != '\n') return "";
  return std::string(absl::StripAsciiWhitespace(text));
}

// Waits up to `timeout` for `pid` to exit; its wait status, or -1 if it
// is still running.
int WaitForExit(pid_t pid, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int wait_status = 0;
    const pid_t done = ::waitpid(pid, &wait_status, WNOHANG);
    if (done == pid) return wait_status;
    if (done < 0 && errno != EINTR) return 0;  // Already reaped elsewhere.
    if (absl::Now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace

std::string SelfExecutablePath() {
  std::error_code error;
  const std::filesystem::path path =
      std::filesystem::read_symlink("/proc/self/exe", error);
  if (error) return "";
  return path.string();
}

std::string ServerBinaryNextTo(const std::string& executable_path) {
  return (std::filesystem::path(executable_path).parent_path() /
          "loraplex-server")
      .string();
}

std::string FileTail(const std::string& path, int max_lines) {
  std::ifstream in(path);
  if (!in) return "";
  std::deque<std::string> lines;
  std::string line;
  while (std::getline(in, line)) {
    lines.push_back(line);
    if (static_cast<int>(lines.size()) > max_lines) lines.pop_front();
  }
  std::string tail;
  for (const std::string& kept : lines) absl::StrAppend(&tail, kept, "\n");
  return tail;
}

absl::StatusOr<std::unique_ptr<LocalServer>> LocalServer::Start(
    const LocalServerOptions& options) {
  if (::access(options.binary.c_str(), X_OK) != 0) {
    return absl::NotFoundError(absl::StrCat("loraplex-server not found at ",
                                            options.binary, ": ",
                                            std::strerror(errno)));
  }
  std::error_code error;
  std::filesystem::create_directories(options.state_dir, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("state directory ", options.state_dir,
                     ": cannot create: ", error.message()));
  }
  const std::string ready_path =
      (std::filesystem::path(options.state_dir) / "ready").string();
  const std::string log_path =
      (std::filesystem::path(options.state_dir) / "server.log").string();
  std::filesystem::remove(ready_path, error);  // A stale one would mislead.

  std::vector<std::string> args = {
      options.binary, "--state-dir",  options.state_dir, "--listen",
      "127.0.0.1:0",  "--ready-file", ready_path};
  args.insert(args.end(), options.extra_args.begin(), options.extra_args.end());
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);

  const int log_fd =
      ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "server log ", log_path, ": cannot open: ", std::strerror(errno)));
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    const int fork_errno = errno;
    ::close(log_fd);
    return absl::InternalError(
        absl::StrCat("fork: ", std::strerror(fork_errno)));
  }
  if (pid == 0) {
    // Child: only async-signal-safe calls until exec. The server goes down
    // with this program rather than lingering unnoticed.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    static constexpr char kExecFailed[] =
        "loraplex: exec loraplex-server failed\n";
    [[maybe_unused]] ssize_t ignored =
        ::write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
    ::_exit(127);
  }
  ::close(log_fd);
  std::unique_ptr<LocalServer> server(new LocalServer(pid, "", log_path));

  const absl::Time deadline = absl::Now() + options.ready_timeout;
  while (true) {
    std::string address = ReadReadyFile(ready_path);
    if (!address.empty()) {
      server->address_ = std::move(address);
      return server;
    }
    int wait_status = 0;
    if (::waitpid(pid, &wait_status, WNOHANG) == pid) {
      server->pid_ = -1;
      return absl::FailedPreconditionError(
          absl::StrCat("loraplex-server ", DescribeWaitStatus(wait_status),
                       " before it was ready; its log (", log_path,
                       ") ends with:\n", FileTail(log_path, kLogTailLines)));
    }
    if (absl::Now() >= deadline) {
      ::kill(pid, SIGKILL);
      WaitForExit(pid, absl::Seconds(10));
      server->pid_ = -1;
      return absl::DeadlineExceededError(
          absl::StrCat("loraplex-server was not ready within ",
                       absl::FormatDuration(options.ready_timeout),
                       "; see its log ", log_path));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

LocalServer::~LocalServer() {
  if (pid_ > 0) Stop(absl::Seconds(10)).IgnoreError();
}

absl::Status LocalServer::Stop(absl::Duration timeout) {
  if (pid_ <= 0) return absl::OkStatus();
  const pid_t pid = pid_;
  ::kill(pid, SIGTERM);
  int wait_status = WaitForExit(pid, timeout);
  if (wait_status == -1) {
    ::kill(pid, SIGKILL);
    WaitForExit(pid, absl::Seconds(10));
    pid_ = -1;
    return absl::DeadlineExceededError(absl::StrCat(
        "loraplex-server did not stop within ", absl::FormatDuration(timeout),
        " of SIGTERM and was killed; see its log ", log_path_));
  }
  pid_ = -1;
  if (!WIFEXITED(wait_status) || WEXITSTATUS(wait_status) != 0) {
    return absl::InternalError(
        absl::StrCat("loraplex-server ", DescribeWaitStatus(wait_status),
                     " on shutdown; see its log ", log_path_));
  }
  return absl::OkStatus();
}

void LocalServer::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  WaitForExit(pid_, absl::Seconds(30));
  pid_ = -1;
}

}  // namespace loraplex
