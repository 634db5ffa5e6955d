// Reading the committed golden fixtures under tests/fixtures/golden/.
#ifndef LORAPLEX_TESTS_COMMON_GOLDEN_FILES_H_
#define LORAPLEX_TESTS_COMMON_GOLDEN_FILES_H_

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace loraplex {

// tests/fixtures/golden/`relative`.
inline std::string GoldenPath(const std::string& relative) {
  return std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/" +
         relative;
}

inline std::string ReadGoldenText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << path;
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// The JSON objects of a JSONL file, keys in file order.
inline std::vector<nlohmann::ordered_json> ReadGoldenLines(
    const std::string& path) {
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::vector<nlohmann::ordered_json> lines;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) lines.push_back(nlohmann::ordered_json::parse(line));
  }
  return lines;
}

}  // namespace loraplex

#endif  // LORAPLEX_TESTS_COMMON_GOLDEN_FILES_H_
