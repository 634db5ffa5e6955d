// loraplex-tokenize, run as a real process on the committed tokenizer.json
// fixtures: its ids and decodes are HF tokenizers' (expected.jsonl).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/common/cli_process.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::HasSubstr;

const std::string kFixtures =
    std::string(LORAPLEX_SOURCE_DIR) + "/tests/fixtures/golden/tokenizers";

CliResult Tokenize(const std::vector<std::string>& args) {
  CliRunOptions options;
  options.program = "loraplex-tokenize";
  return RunCli(args, options);
}

// Line `index` of a JSONL file.
json JsonLine(const std::string& path, size_t index) {
  std::ifstream in(path);
  std::string line;
  for (size_t i = 0; i <= index; ++i) std::getline(in, line);
  return json::parse(line);
}

TEST(TokenizeToolTest, TextIdsAndDecodeAreHfs) {
  const std::string model = kFixtures + "/llama3_like";
  for (size_t index : {30u, 75u, 1500u}) {
    const std::string text =
        JsonLine(kFixtures + "/corpus.jsonl", index)["text"];
    const json expected = JsonLine(model + "/expected.jsonl", index);
    CliResult result = Tokenize({"--model", model, "--text", text});
    ASSERT_EQ(result.exit_code, 0) << result.Describe();
    EXPECT_EQ(json::parse(result.out)["ids"], expected["ids"]) << text;

    std::vector<int64_t> ids = expected["ids"];
    result = Tokenize({"--model", model, "--decode", absl::StrJoin(ids, ",")});
    ASSERT_EQ(result.exit_code, 0) << result.Describe();
    EXPECT_EQ(result.out, expected["decoded"].get<std::string>() + "\n");
  }
}

TEST(TokenizeToolTest, DatasetLinesShowIdsMaskAndErrors) {
  const fs::path dir = FreshTestDir();
  const std::string data = (dir / "data.jsonl").string();
  std::ofstream(data) << R"({"text": "hello world"})"
                      << "\n\n"
                      << R"({"text": 3})"
                      << "\n"
                      << R"({"prompt": "Q: hi", "completion": " A: yo"})"
                      << "\n";
  const std::string model = kFixtures + "/qwen2_like";
  CliResult result = Tokenize({"--model", model, "--input", data});
  EXPECT_EQ(result.exit_code, 1) << result.Describe();
  EXPECT_THAT(result.err, HasSubstr("1 of 4 lines are bad"));
  const std::vector<std::string> lines =
      absl::StrSplit(result.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << result.out;
  const json text = json::parse(lines[0]);
  CliResult ids = Tokenize({"--model", model, "--text", "hello world"});
  std::vector<int64_t> want = json::parse(ids.out)["ids"];
  // Qwen2 has no BOS: the text's ids, then EOS (<|im_end|>, one added
  // token).
  const json eos = json::parse(
      Tokenize({"--model", model, "--text", "<|im_end|>"}).out)["ids"];
  ASSERT_EQ(eos.size(), 1u);
  want.push_back(eos[0].get<int64_t>());
  EXPECT_EQ(text["ids"], json(want));
  std::vector<int> mask(want.size(), 1);
  mask[0] = 0;
  EXPECT_EQ(text["mask"], json(mask));
  EXPECT_EQ(json::parse(lines[1])["line"], 3);
  EXPECT_THAT(json::parse(lines[1])["error"].get<std::string>(),
              HasSubstr("text must be a string"));
  EXPECT_TRUE(json::parse(lines[2]).contains("mask"));
}

TEST(TokenizeToolTest, BadArgumentsAreClearErrors) {
  CliResult result =
      Tokenize({"--model", kFixtures + "/gpt2", "--decode", "1,x"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("\"x\" is not an integer"));
  result = Tokenize({"--model", FreshTestDir("empty"), "--text", "a"});
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_THAT(result.err, HasSubstr("no tokenizer found"));
  result = Tokenize({"--model", kFixtures + "/gpt2"});
  EXPECT_EQ(result.exit_code, 2);
}

}  // namespace
}  // namespace loraplex
