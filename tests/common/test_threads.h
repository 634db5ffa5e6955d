// LORAPLEX_TEST_THREADS: the thread count every server and worker process a
// test starts runs with, whatever the test asks for, so the whole suite can
// be run with 1 and with 2 threads (.ci/run does both for the numerics
// tests). Unset: each test's own choice.
#ifndef LORAPLEX_TESTS_COMMON_TEST_THREADS_H_
#define LORAPLEX_TESTS_COMMON_TEST_THREADS_H_

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"

namespace loraplex {

// The override, when LORAPLEX_TEST_THREADS holds a positive integer.
inline std::optional<int> TestThreadsOverride() {
  const char* value = std::getenv("LORAPLEX_TEST_THREADS");
  int threads = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &threads) || threads < 1) {
    return std::nullopt;
  }
  return threads;
}

// `args` of a loraplex-server command line with any --threads replaced by
// the override (unchanged without one).
inline std::vector<std::string> WithTestThreads(
    const std::vector<std::string>& args) {
  const std::optional<int> threads = TestThreadsOverride();
  if (!threads) return args;
  std::vector<std::string> out;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--threads") {
      ++i;  // And its value.
      continue;
    }
    if (absl::StartsWith(args[i], "--threads=")) continue;
    out.push_back(args[i]);
  }
  out.push_back("--threads=" + std::to_string(*threads));
  return out;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_TEST_THREADS_H_
