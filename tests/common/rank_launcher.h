// Runs this test program once per rank of a process group on 127.0.0.1:
// each child gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT), LORAPLEX_DIST_TIMEOUT_SECONDS and a scenario
// variable, re-executes /proc/self/exe, and is expected to run the
// scenario before GoogleTest starts and exit with its status.
//
//   RankLaunch launch{.scenario_var = "MY_SCENARIO", .scenario = "train",
//                     .world_size = 3};
//   EXPECT_THAT(LaunchRanks(launch).exit_codes, testing::Each(0));
#ifndef LORAPLEX_TESTS_COMMON_RANK_LAUNCHER_H_
#define LORAPLEX_TESTS_COMMON_RANK_LAUNCHER_H_

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "tests/common/free_port.h"
#include "tests/common/rank_process.h"
#include "tests/common/test_threads.h"

namespace loraplex {

struct RankLaunch {
  std::string scenario_var;  // The environment variable naming the scenario.
  std::string scenario;
  int world_size = 2;
  std::vector<int> ranks;    // The ranks to start; empty: all of them.
  int timeout_seconds = 20;  // LORAPLEX_DIST_TIMEOUT_SECONDS.
  // Ranks still running then are killed (SIGKILL).
  std::chrono::seconds kill_after{600};
};

struct RankExits {
  std::vector<int> exit_codes;  // Per started rank; -1: killed at deadline.
  double seconds = 0;
};

// In a rank's process (`scenario_var` set): runs `worker` with the
// scenario named there and exits with its outcome, printing its error;
// false in the test program itself. Called from a static initializer, so
// a rank runs before GoogleTest starts anything:
//
//   [[maybe_unused]] const bool kRanAsWorker =
//       RunAsRankWorker(kScenarioVar, RunWorker);
inline bool RunAsRankWorker(const char* scenario_var,
                            absl::Status (*worker)(const std::string&)) {
  const char* scenario = std::getenv(scenario_var);
  if (scenario == nullptr) return false;
  torch::set_num_threads(TestThreadsOverride().value_or(1));
  absl::Status status = worker(scenario);
  if (!status.ok()) {
    std::fprintf(stderr, "[rank %s] %s: %s\n", std::getenv("RANK"), scenario,
                 status.ToString().c_str());
  }
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(status.ok() ? 0 : 1);
}

inline RankExits LaunchRanks(const RankLaunch& launch) {
  const int port = FreePort();
  EXPECT_GT(port, 0);
  std::vector<int> ranks = launch.ranks;
  if (ranks.empty()) {
    for (int r = 0; r < launch.world_size; ++r) ranks.push_back(r);
  }
  const std::vector<std::string> inherited =
      InheritedEnvironment({"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                            "MASTER_PORT", "LORAPLEX_DIST_TIMEOUT_SECONDS",
                            "GLOO_SOCKET_IFNAME", launch.scenario_var});
  const auto start = std::chrono::steady_clock::now();
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  std::vector<pid_t> pids;
  for (int rank : ranks) {
    const pid_t pid = StartRank(
        argv, inherited, rank, launch.world_size, port,
        {absl::StrCat("LORAPLEX_DIST_TIMEOUT_SECONDS=", launch.timeout_seconds),
         absl::StrCat(launch.scenario_var, "=", launch.scenario)});
    EXPECT_GT(pid, 0) << "fork failed";
    pids.push_back(pid);
  }
  RankExits result;
  result.exit_codes.assign(pids.size(), -1);
  std::vector<bool> done(pids.size(), false);
  size_t running = pids.size();
  while (running > 0) {
    for (size_t k = 0; k < pids.size(); ++k) {
      if (done[k]) continue;
      int status = 0;
      if (pids[k] <= 0 || waitpid(pids[k], &status, WNOHANG) == pids[k]) {
        if (pids[k] > 0) {
          result.exit_codes[k] = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
        }
        done[k] = true;
        --running;
      }
    }
    if (running > 0 &&
        std::chrono::steady_clock::now() - start > launch.kill_after) {
      for (size_t k = 0; k < pids.size(); ++k) {
        if (done[k]) continue;
        kill(pids[k], SIGKILL);
        waitpid(pids[k], nullptr, 0);
        done[k] = true;
        --running;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  result.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start)
          .count();
  return result;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_RANK_LAUNCHER_H_
