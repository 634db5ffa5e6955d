// Runs the built `loraplex` CLI (LORAPLEX_BIN_DIR/loraplex), or another of
// the built programs, as a child process and captures its exit code, stdout and
// stderr.
//
//   CliResult result = RunCli({"--server", address, "jobs", "list"});
//   EXPECT_EQ(result.exit_code, 0) << result.Describe();
//   EXPECT_THAT(result.out, HasSubstr("RUNNING"));
//
// LORAPLEX_SERVER and LORAPLEX_TOKEN are removed from the child's
// environment unless CliRunOptions::env sets them, so the developer's
// shell cannot change a test's outcome.
#ifndef LORAPLEX_TESTS_COMMON_CLI_PROCESS_H_
#define LORAPLEX_TESTS_COMMON_CLI_PROCESS_H_

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

extern char** environ;

namespace loraplex {

struct CliResult {
  // The exit status; 128 + N when killed by signal N; -1 when it could not
  // be started.
  int exit_code = -1;
  std::string out;  // stdout.
  std::string err;  // stderr.
  bool timed_out = false;

  // Everything, for test failure messages.
  std::string Describe() const {
    return "exit code " + std::to_string(exit_code) +
           (timed_out ? " (timed out)" : "") + "\n--- stdout ---\n" + out +
           "--- stderr ---\n" + err;
  }
};

struct CliRunOptions {
  // The program in LORAPLEX_BIN_DIR.
  std::string program = "loraplex";
  // Extra environment variables (NAME, value) for the child.
  std::vector<std::pair<std::string, std::string>> env;
  // Killed (SIGKILL) after this long.
  int timeout_seconds = 300;
  // The child's standard input (at most a pipe's buffer, 64 KiB); empty:
  // /dev/null.
  std::string input;
};

inline CliResult RunCli(const std::vector<std::string>& args,
                        const CliRunOptions& options = {}) {
  CliResult result;
  std::vector<std::string> argv_strings = {std::string(LORAPLEX_BIN_DIR) + "/" +
                                           options.program};
  argv_strings.insert(argv_strings.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& arg : argv_strings) argv.push_back(arg.data());
  argv.push_back(nullptr);

  // Inherited entries named like an override are dropped, so the override
  // is the only one the child sees.
  auto overridden = [&options](const std::string& entry) {
    for (const auto& [name, value] : options.env) {
      if (entry.rfind(name + "=", 0) == 0) return true;
    }
    return false;
  };
  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text = *entry;
    if (text.rfind("LORAPLEX_SERVER=", 0) == 0 ||
        text.rfind("LORAPLEX_TOKEN=", 0) == 0 || overridden(text)) {
      continue;
    }
    env_strings.push_back(text);
  }
  for (const auto& [name, value] : options.env) {
    env_strings.push_back(name + "=" + value);
  }
  std::vector<char*> envp;
  for (std::string& entry : env_strings) envp.push_back(entry.data());
  envp.push_back(nullptr);

  int in_pipe[2] = {-1, -1};
  if (!options.input.empty()) {
    if (::pipe2(in_pipe, O_CLOEXEC) != 0) {
      result.err = std::string("pipe: ") + std::strerror(errno);
      return result;
    }
    // Written whole before the child starts: it fits the pipe's buffer.
    const ssize_t written =
        ::write(in_pipe[1], options.input.data(), options.input.size());
    ::close(in_pipe[1]);
    if (written != static_cast<ssize_t>(options.input.size())) {
      ::close(in_pipe[0]);
      result.err = "the child's input does not fit a pipe";
      return result;
    }
  }
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) {
    result.err = std::string("pipe: ") + std::strerror(errno);
    return result;
  }
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    result.err = std::string("pipe: ") + std::strerror(errno);
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return result;
  }
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) {
    result.err = std::string("fork: ") + std::strerror(errno);
    for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1]}) {
      ::close(fd);
    }
    return result;
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);
    const int null_fd = in_pipe[0] >= 0
                            ? in_pipe[0]
                            : ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (null_fd >= 0) ::dup2(null_fd, STDIN_FILENO);
    ::dup2(out_pipe[1], STDOUT_FILENO);
    ::dup2(err_pipe[1], STDERR_FILENO);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (in_pipe[0] >= 0) ::close(in_pipe[0]);

  // Read both pipes until they close, so a chatty child never blocks.
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::seconds(options.timeout_seconds);
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_pipes = 2;
  while (open_pipes > 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      break;
    }
    const int ready = ::poll(fds, 2, static_cast<int>(left.count()));
    if (ready < 0) {
      if (errno == EINTR) continue;
      // Nothing more can be read: end the child rather than wait on it
      // forever below.
      ::kill(pid, SIGKILL);
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buffer[4096];
      const ssize_t n = ::read(fds[i].fd, buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds[i].fd);
        fds[i].fd = -1;
        --open_pipes;
      }
    }
  }
  for (const pollfd& fd : fds) {
    if (fd.fd >= 0) ::close(fd.fd);
  }
  int wait_status = 0;
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(wait_status)) {
    result.exit_code = WEXITSTATUS(wait_status);
  } else if (WIFSIGNALED(wait_status)) {
    result.exit_code = 128 + WTERMSIG(wait_status);
  }
  return result;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_CLI_PROCESS_H_
