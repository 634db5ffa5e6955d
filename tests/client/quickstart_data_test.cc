#include "client/quickstart_data.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "absl/strings/str_split.h"
#include "core/data/dataset.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {
namespace {

TEST(QuickstartDataTest, EveryLineParsesAndHasTargets) {
  const std::string jsonl = QuickstartDatasetJsonl();
  ByteTokenizer tokenizer;
  absl::StatusOr<Dataset> dataset = ParseJsonlDataset(jsonl, tokenizer);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->examples.size(),
            static_cast<size_t>(kQuickstartExampleCount));
  for (const Example& example : dataset->examples) {
    int targets = 0;
    for (uint8_t mask : example.loss_mask) targets += mask;
    EXPECT_GT(targets, 0);
    // Fits the quickstart's seq_len of 64 without truncation.
    EXPECT_LE(example.input_ids.size(), 64u);
  }
}

TEST(QuickstartDataTest, OneObjectPerLine) {
  const std::string jsonl = QuickstartDatasetJsonl(5);
  ASSERT_FALSE(jsonl.empty());
  EXPECT_EQ(jsonl.back(), '\n');
  std::vector<std::string> lines =
      absl::StrSplit(jsonl, '\n', absl::SkipEmpty());
  EXPECT_EQ(lines.size(), 5u);
  ByteTokenizer tokenizer;
  for (const std::string& line : lines) {
    EXPECT_TRUE(ParseJsonlDataset(line, tokenizer).ok()) << line;
  }
}

TEST(QuickstartDataTest, CompletionReversesTheWord) {
  for (const QuickstartExample& example : QuickstartExamples()) {
    ASSERT_EQ(example.prompt.rfind("reverse: ", 0), 0u) << example.prompt;
    std::string word = example.prompt.substr(9);
    ASSERT_FALSE(word.empty());
    ASSERT_EQ(word.back(), '\n');
    word.pop_back();
    EXPECT_GE(word.size(), 3u);
    EXPECT_LE(word.size(), 8u);
    EXPECT_EQ(example.completion, std::string(word.rbegin(), word.rend()));
  }
}

TEST(QuickstartDataTest, DeterministicAndPrefixStable) {
  EXPECT_EQ(QuickstartDatasetJsonl(), QuickstartDatasetJsonl());
  const auto all = QuickstartExamples(64);
  const auto first = QuickstartExamples(10);
  ASSERT_EQ(first.size(), 10u);
  for (size_t i = 0; i < first.size(); ++i) {
    EXPECT_EQ(first[i].prompt, all[i].prompt);
    EXPECT_EQ(first[i].completion, all[i].completion);
  }
  EXPECT_TRUE(QuickstartExamples(-3).empty());
}

TEST(QuickstartDataTest, WordsAreVaried) {
  std::set<std::string> prompts;
  for (const QuickstartExample& example : QuickstartExamples()) {
    prompts.insert(example.prompt);
  }
  // A few repeats among short words are fine; most are distinct.
  EXPECT_GT(prompts.size(),
            static_cast<size_t>(kQuickstartExampleCount * 9 / 10));
}

}  // namespace
}  // namespace loraplex
