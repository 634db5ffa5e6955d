// Starting this program as one rank of a process group on 127.0.0.1, for
// tests (rank_launcher.h) and benchmarks that re-execute themselves once per
// rank. No GoogleTest.
//
//   const auto inherited = InheritedEnvironment({"RANK", "WORLD_SIZE", ...});
//   pid_t pid = StartRank(argv, inherited, rank, world_size, port,
//                         {"MY_SCENARIO=train"});
#ifndef LORAPLEX_TESTS_COMMON_RANK_PROCESS_H_
#define LORAPLEX_TESTS_COMMON_RANK_PROCESS_H_

#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace loraplex {

// This process's environment without the variables named in `dropped`
// (those each rank gets its own value of), as "NAME=value" strings.
inline std::vector<std::string> InheritedEnvironment(
    const std::vector<std::string>& dropped) {
  std::vector<std::string> inherited;
  for (char** e = environ; *e != nullptr; ++e) {
    bool replaced = false;
    for (const std::string& name : dropped) {
      replaced = replaced || absl::StartsWith(*e, name + "=");
    }
    if (!replaced) inherited.push_back(*e);
  }
  return inherited;
}

// Starts /proc/self/exe with `argv` as `rank` of `world_size` ranks meeting
// at 127.0.0.1:`port`, with the `inherited` environment, torchrun's
// variables and `extra` ("NAME=value"). The child's pid; -1 when fork
// failed.
inline pid_t StartRank(char* const argv[],
                       const std::vector<std::string>& inherited, int rank,
                       int world_size, int port,
                       const std::vector<std::string>& extra) {
  std::vector<std::string> env = inherited;
  env.push_back(absl::StrCat("RANK=", rank));
  env.push_back(absl::StrCat("LOCAL_RANK=", rank));
  env.push_back(absl::StrCat("WORLD_SIZE=", world_size));
  env.push_back("MASTER_ADDR=127.0.0.1");
  env.push_back(absl::StrCat("MASTER_PORT=", port));
  env.insert(env.end(), extra.begin(), extra.end());
  std::vector<char*> envp;
  for (std::string& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    execve("/proc/self/exe", argv, envp.data());
    _exit(127);
  }
  return pid;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_RANK_PROCESS_H_
