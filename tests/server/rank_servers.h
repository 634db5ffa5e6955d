// The real loraplex-server as the ranks of a data-parallel run on
// 127.0.0.1, for the server tests: rank 0 serves (ServerProcess), ranks
// 1... are started directly so that a test can kill them.
#ifndef LORAPLEX_TESTS_SERVER_RANK_SERVERS_H_
#define LORAPLEX_TESTS_SERVER_RANK_SERVERS_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/common/free_port.h"
#include "tests/common/test_dir.h"
#include "tests/common/test_threads.h"
#include "tests/server/service_fixture.h"

namespace loraplex {

// A script that runs loraplex-server as `rank` of a run of `world` ranks
// whose rank 0 hosts the rendezvous on 127.0.0.1:port.
inline std::string RankScript(const std::string& dir, int rank, int world,
                              int port, int timeout_seconds) {
  const std::string path = absl::StrCat(dir, "/rank", rank, ".sh");
  std::ofstream(path) << "#!/bin/sh\n"
                      << "export RANK=" << rank << " LOCAL_RANK=" << rank
                      << " WORLD_SIZE=" << world
                      << " MASTER_ADDR=127.0.0.1 MASTER_PORT=" << port
                      << " LORAPLEX_DIST_TIMEOUT_SECONDS=" << timeout_seconds
                      << "\nexec '" << LORAPLEX_BIN_DIR
                      << "/loraplex-server' \"$@\"\n";
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
  return path;
}

// A rank other than 0, started directly so a test can kill it; killed when
// destroyed (and when this test program dies).
class FollowerProcess {
 public:
  FollowerProcess(const std::string& script, std::vector<std::string> args,
                  const std::string& log_path)
      : log_path_(log_path) {
    args = WithTestThreads(args);
    args.insert(args.begin(), script);
    std::vector<char*> argv;
    for (std::string& arg : args) argv.push_back(arg.data());
    argv.push_back(nullptr);
    const int log_fd =
        ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(log_fd);
  }
  ~FollowerProcess() { Kill(); }

  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    ::waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }

  // The exit status, or -1 if it still runs after `seconds`.
  int Wait(int seconds) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (pid_ > 0 && std::chrono::steady_clock::now() < deadline) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return -1;
  }

  std::string Log() const { return ReadFileForTest(log_path_); }

 private:
  pid_t pid_ = -1;
  std::string log_path_;
};

// The ranks of a multi-process server on `state`.
struct Ranks {
  std::vector<std::unique_ptr<FollowerProcess>> followers;  // Ranks 1...
  std::unique_ptr<ServerProcess> server;                    // Rank 0.

  FollowerProcess& follower() { return *followers.front(); }
};

// Every run computes in fp64, so one rank and N ranks (rows regrouped,
// gradients summed over the ranks) agree far below fp32 rounding.
inline std::vector<std::string> Flags(const std::string& checkpoint_interval) {
  return {"--threads=1", "--dtype=float64",
          "--checkpoint-interval=" + checkpoint_interval};
}

// Starts ranks 1..world-1 with `follower_args`, then rank 0 with `flags`
// (and waits for it to serve when `expect_serving`).
inline Ranks StartRanks(const std::string& state, int world, int slots,
                        const std::vector<std::string>& flags,
                        int timeout_seconds = 60,
                        std::vector<std::string> follower_args = {},
                        bool expect_serving = true) {
  Ranks ranks;
  const int port = FreePort();
  EXPECT_GT(port, 0);
  follower_args.insert(follower_args.begin(), flags.begin(), flags.end());
  for (int rank = 1; rank < world; ++rank) {
    ranks.followers.push_back(std::make_unique<FollowerProcess>(
        RankScript(state, rank, world, port, timeout_seconds), follower_args,
        absl::StrCat(state, "/rank", rank, ".log")));
  }
  ServerProcessOptions options;
  options.state_dir = state;
  options.slots = slots;
  options.extra_args = flags;
  options.extra_args.push_back("--log-level=debug");
  options.binary = RankScript(state, 0, world, port, timeout_seconds);
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(options);
  if (server.ok()) {
    ranks.server = *std::move(server);
  } else if (expect_serving) {
    ADD_FAILURE() << server.status() << "\nrank 1:\n" << ranks.follower().Log();
  }
  return ranks;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_SERVER_RANK_SERVERS_H_
