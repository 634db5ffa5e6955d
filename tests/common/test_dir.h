// Fresh, empty scratch directories for tests, unique per process and test:
// <TempDir>/loraplex-<pid>/<Suite>.<Test>[-<suffix>].
#ifndef LORAPLEX_TESTS_COMMON_TEST_DIR_H_
#define LORAPLEX_TESTS_COMMON_TEST_DIR_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace loraplex {

inline std::string FreshTestDir(const std::string& suffix = "") {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  // No test runs during a suite's SetUpTestSuite.
  std::string name = info == nullptr ? std::string("SetUpTestSuite")
                                     : std::string(info->test_suite_name()) +
                                           "." + info->name();
  if (!suffix.empty()) name += "-" + suffix;
  for (char& c : name) {
    if (c == '/') c = '_';  // Parameterized test names contain slashes.
  }
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) /
      ("loraplex-" + std::to_string(::getpid())) / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_TEST_DIR_H_
