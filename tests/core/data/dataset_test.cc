// JSONL dataset parsing: the ids and loss mask of every line kind, and every
// kind of bad line reported with its line number.
#include "core/data/dataset.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "core/tokenizer/load_tokenizer.h"

namespace loraplex {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int64_t kBos = 256;
constexpr int64_t kEos = 257;

// The byte tokenizer's ids of `text`: one id per byte.
std::vector<int64_t> Bytes(const std::string& text) {
  std::vector<int64_t> ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

void Append(std::vector<int64_t>* ids, std::vector<uint8_t>* mask,
            const std::vector<int64_t>& more, uint8_t target) {
  ids->insert(ids->end(), more.begin(), more.end());
  mask->insert(mask->end(), more.size(), target);
}

std::vector<std::string> MessageLines(const absl::Status& status) {
  return absl::StrSplit(std::string(status.message()), '\n');
}

class DatasetTest : public ::testing::Test {
 protected:
  absl::StatusOr<Dataset> Parse(const std::string& contents,
                                const DatasetParseOptions& options = {}) {
    return ParseJsonlDataset(contents, tokenizer_, options);
  }
  // The reason given for `line` when it is the only line.
  std::string ReasonFor(const std::string& line) {
    absl::StatusOr<Dataset> dataset = Parse(line);
    EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument)
        << line;
    if (dataset.ok()) return "";
    std::vector<std::string> lines = MessageLines(dataset.status());
    EXPECT_EQ(lines.size(), 2u) << dataset.status();
    EXPECT_THAT(lines[1], StartsWith("line 1: "));
    return lines.size() < 2 ? "" : lines[1].substr(8);
  }

  ByteTokenizer tokenizer_;
};

TEST_F(DatasetTest, TextLineTrainsEveryTokenAfterBos) {
  absl::StatusOr<Dataset> dataset = Parse(R"({"text": "hi!"})");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->examples.size(), 1u);
  EXPECT_THAT(dataset->examples[0].input_ids,
              ElementsAre(kBos, 104, 105, 33, kEos));
  EXPECT_THAT(dataset->examples[0].loss_mask, ElementsAre(0, 1, 1, 1, 1));
  EXPECT_EQ(dataset->num_tokens, 5);
  EXPECT_EQ(dataset->num_target_tokens, 4);
}

TEST_F(DatasetTest, PromptCompletionTrainsOnlyTheCompletionAndEos) {
  absl::StatusOr<Dataset> dataset =
      Parse(R"({"prompt": "ab", "completion": "c"})"
            "\n"
            R"({"completion": "z", "prompt": ""})");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->examples.size(), 2u);
  EXPECT_THAT(dataset->examples[0].input_ids,
              ElementsAre(kBos, 97, 98, 99, kEos));
  EXPECT_THAT(dataset->examples[0].loss_mask, ElementsAre(0, 0, 0, 1, 1));
  EXPECT_THAT(dataset->examples[1].input_ids, ElementsAre(kBos, 122, kEos));
  EXPECT_THAT(dataset->examples[1].loss_mask, ElementsAre(0, 1, 1));
  EXPECT_EQ(dataset->num_tokens, 8);
  EXPECT_EQ(dataset->num_target_tokens, 4);
}

TEST_F(DatasetTest, MessagesFollowTheChatTemplate) {
  EXPECT_EQ(ChatRoleHeader("user"), "<|user|>\n");
  absl::StatusOr<Dataset> dataset =
      Parse(R"({"messages": [{"role": "system", "content": "S"},)"
            R"( {"role": "user", "content": "Hi"},)"
            R"( {"content": "Yo", "role": "assistant"},)"
            R"( {"role": "user", "content": ""},)"
            R"( {"role": "assistant", "content": "!"}]})");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> ids = {kBos};
  std::vector<uint8_t> mask = {0};
  Append(&ids, &mask, Bytes("<|system|>\n"), 0);
  Append(&ids, &mask, {'S', kEos}, 0);
  Append(&ids, &mask, Bytes("<|user|>\n"), 0);
  Append(&ids, &mask, {'H', 'i', kEos}, 0);
  Append(&ids, &mask, Bytes("<|assistant|>\n"), 0);
  Append(&ids, &mask, {'Y', 'o', kEos}, 1);
  Append(&ids, &mask, Bytes("<|user|>\n"), 0);
  Append(&ids, &mask, {kEos}, 0);
  Append(&ids, &mask, Bytes("<|assistant|>\n"), 0);
  Append(&ids, &mask, {'!', kEos}, 1);
  ASSERT_EQ(dataset->examples.size(), 1u);
  EXPECT_THAT(dataset->examples[0].input_ids, ElementsAreArray(ids));
  EXPECT_THAT(dataset->examples[0].loss_mask, ElementsAreArray(mask));
  EXPECT_EQ(dataset->num_target_tokens, 5);
  EXPECT_EQ(dataset->num_tokens, static_cast<int64_t>(ids.size()));
}

TEST_F(DatasetTest, TokenLineIsUsedAsIs) {
  absl::StatusOr<Dataset> dataset =
      Parse(R"({"input_ids": [256, 0, 258, 7], "loss_mask": [0, 1, 0, 1]})");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->examples.size(), 1u);
  EXPECT_THAT(dataset->examples[0].input_ids, ElementsAre(256, 0, 258, 7));
  EXPECT_THAT(dataset->examples[0].loss_mask, ElementsAre(0, 1, 0, 1));
  EXPECT_EQ(dataset->num_tokens, 4);
  EXPECT_EQ(dataset->num_target_tokens, 2);
}

TEST_F(DatasetTest, BlankLinesAreSkippedButCounted) {
  absl::StatusOr<Dataset> dataset = Parse(
      "\n  \t\n{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n \n{\"text\": 1}\n");
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(MessageLines(dataset.status()),
              ElementsAre("dataset has 1 bad line (nothing was loaded):",
                          "line 7: text must be a string, got 1"));

  dataset = Parse("\n\n{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n\n");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->examples.size(), 2u);
  EXPECT_THAT(dataset->examples[1].input_ids, ElementsAre(kBos, 98, kEos));
}

TEST_F(DatasetTest, RefusesImagePartsNamingTheLine) {
  absl::StatusOr<Dataset> dataset = Parse(
      "{\"text\": \"a\"}\n"
      R"({"messages": [{"role": "user", "content": [{"type": "image", )"
      R"("url": "cat.png"}, {"type": "text", "text": "what is it?"}]}, )"
      R"({"role": "assistant", "content": "a cat"}]})"
      "\n");
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MessageLines(dataset.status()).back(),
            "line 2: messages[0].content has an image part (type \"image\"): "
            "images are not supported, only text (a multimodal base model "
            "such as gemma3 trains its text model)");
  EXPECT_EQ(
      ReasonFor(R"({"messages": [{"role": "user", "content": [{"type": )"
                R"("image_url", "image_url": {"url": "x"}}]}]})"),
      "messages[0].content has an image part (type \"image_url\"): images "
      "are not supported, only text (a multimodal base model such as gemma3 "
      "trains its text model)");
}

TEST_F(DatasetTest, AcceptsCrlfAndAByteOrderMark) {
  absl::StatusOr<Dataset> dataset =
      Parse("\xEF\xBB\xBF{\"text\": \"a\"}\r\n\r\n{\"text\": \"b\"}\r\n");
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->examples.size(), 2u);
  EXPECT_THAT(dataset->examples[0].input_ids, ElementsAre(kBos, 97, kEos));
  EXPECT_THAT(dataset->examples[1].input_ids, ElementsAre(kBos, 98, kEos));

  dataset = Parse("{\"text\": \"a\"}\r\n\r\n{\"text\": []}\r\n");
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(MessageLines(dataset.status()).back(),
            "line 3: text must be a string, got a JSON array");
}

TEST_F(DatasetTest, EmptyDatasetIsAnError) {
  absl::StatusOr<Dataset> dataset = Parse("");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dataset.status().message(), "dataset is empty");
  dataset = Parse("\n \r\n\t\n");
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(dataset.status().message(),
            "dataset has no examples: all 3 lines are blank");
}

TEST_F(DatasetTest, RejectsLinesThatAreNotOneJsonObject) {
  EXPECT_THAT(ReasonFor(R"({"text": "a")"),
              AllOf(StartsWith("not valid JSON (parse error at column "),
                    HasSubstr("unexpected end of input")));
  EXPECT_THAT(ReasonFor("hello"), StartsWith("not valid JSON ("));
  EXPECT_THAT(ReasonFor(R"({"text": "a"} {"text": "b"})"),
              StartsWith("not valid JSON ("));
  EXPECT_THAT(ReasonFor("{\"text\": \"\xff\"}"),
              AllOf(StartsWith("not valid JSON ("), HasSubstr("UTF-8")));
  EXPECT_EQ(ReasonFor("[1, 2]"), "must be a JSON object, got a JSON array");
  EXPECT_EQ(ReasonFor("\"text\""), "must be a JSON object, got \"text\"");
  EXPECT_EQ(ReasonFor(R"({"text": "a", "text": "b"})"),
            "key \"text\" appears more than once");
  EXPECT_EQ(ReasonFor(std::string(30, '[') + std::string(30, ']')),
            "JSON nested deeper than 8 levels");
}

TEST_F(DatasetTest, RejectsLinesOfNoKindOrMixedKinds) {
  const std::string expected =
      "\"text\", \"prompt\" and \"completion\", \"messages\", or "
      "\"input_ids\" and \"loss_mask\"";
  EXPECT_EQ(ReasonFor("{}"), "has no recognised keys (expected " + expected +
                                 "), got an empty object");
  EXPECT_EQ(ReasonFor(R"({"txt": "a", "a\nb": 1})"),
            "has no recognised keys (expected " + expected +
                R"(), got "a\nb", "txt")");
  EXPECT_EQ(ReasonFor(R"({"text": "a", "prompt": "b", "completion": "c"})"),
            "mixes keys of two kinds: \"completion\" and \"text\"; a line has "
            "exactly one of " +
                expected);
  EXPECT_EQ(ReasonFor(R"({"text": "a", "label": 1})"),
            "has unknown key \"label\" (a line with \"text\" has only "
            "\"text\")");
  EXPECT_EQ(
      ReasonFor(R"({"prompt": "a", "completion": "b", "x": 1, "y": 2})"),
      "has unknown keys \"x\", \"y\" (a line with \"completion\" has only "
      "\"prompt\" and \"completion\")");
  EXPECT_EQ(ReasonFor(R"({"prompt": "a"})"),
            "has no \"completion\" (a line with \"prompt\" needs \"prompt\" "
            "and \"completion\")");
  EXPECT_EQ(ReasonFor(R"({"loss_mask": [0, 1]})"),
            "has no \"input_ids\" (a line with \"loss_mask\" needs "
            "\"input_ids\" and \"loss_mask\")");
}

TEST_F(DatasetTest, RejectsBadTextAndPromptCompletionFields) {
  EXPECT_EQ(ReasonFor(R"({"text": 3})"), "text must be a string, got 3");
  EXPECT_EQ(ReasonFor(R"({"text": null})"), "text must be a string, got null");
  EXPECT_EQ(ReasonFor(R"({"text": ""})"), "text must not be empty");
  EXPECT_EQ(ReasonFor(R"({"prompt": ["a"], "completion": "b"})"),
            "prompt and completion must be both strings or both lists of "
            "messages, got a list and a string");
  EXPECT_EQ(ReasonFor(R"({"prompt": "a", "completion": true})"),
            "completion must be a string or a list of messages, got true");
  EXPECT_EQ(ReasonFor(R"({"prompt": "a", "completion": "b", "tools": []})"),
            "tools go with conversational prompt/completion (lists of "
            "messages), not with text");
  EXPECT_EQ(ReasonFor(R"({"text": "a", "tools": []})"),
            "has unknown key \"tools\" (a line with \"text\" has only "
            "\"text\")");
  EXPECT_EQ(ReasonFor(R"({"prompt": "a", "completion": ""})"),
            "completion must not be empty");
}

TEST_F(DatasetTest, RejectsBadMessages) {
  EXPECT_EQ(ReasonFor(R"({"messages": []})"),
            "messages must be a non-empty list, got []");
  EXPECT_EQ(ReasonFor(R"({"messages": {"role": "user"}})"),
            "messages must be a non-empty list, got a JSON object");
  EXPECT_EQ(ReasonFor(R"({"messages": ["hi"]})"),
            "messages[0] must be an object with \"role\" and \"content\", got "
            "\"hi\"");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "assistant", "content": "a"},)"
                      R"( {"content": "b"}]})"),
            "messages[1] has no \"role\"");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "assistant"}]})"),
            "messages[0] has no \"content\"");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "bot", "content": "a"}]})"),
            "messages[0].role must be one of \"system\", \"user\", "
            "\"assistant\"; got \"bot\"");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": 1, "content": "a"}]})"),
            "messages[0].role must be one of \"system\", \"user\", "
            "\"assistant\"; got 1");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "user", "content": 5}]})"),
            "messages[0].content must be a string, got 5");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "assistant", "content": "a",)"
                      R"( "name": "x"}]})"),
            "messages[0] has unknown key \"name\" (a message has only "
            "\"role\", \"content\" and \"weight\" when the base model has no "
            "chat template)");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "user", "content": "a",)"
                      R"( "weight": 1}]})"),
            "messages[0].weight: only assistant messages have a weight");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "assistant", "content": "a",)"
                      R"( "weight": 0.5}]})"),
            "messages[0].weight must be 0 or 1, got 0.5");
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "assistant", "content": "a"}],)"
                      R"( "tools": []})"),
            "tools need the base model's chat template, and it has none");
  const std::string no_answer =
      "messages has no assistant turn with weight 1, so nothing would be "
      "trained";
  EXPECT_EQ(ReasonFor(R"({"messages": [{"role": "user", "content": "a"}]})"),
            no_answer);
  // An empty answer still trains its end of turn (EOS here), as HF's
  // generation-block mask does.
  absl::StatusOr<Dataset> empty_answer =
      Parse(R"({"messages": [{"role": "user", "content": "a"},)"
            R"( {"role": "assistant", "content": ""}]})");
  ASSERT_TRUE(empty_answer.ok()) << empty_answer.status();
  EXPECT_EQ(empty_answer->num_target_tokens, 1);  // The EOS.
  EXPECT_EQ(empty_answer->examples[0].loss_mask.back(), 1);
  EXPECT_EQ(
      ReasonFor(R"({"messages": [{"role": "user", "content": "a"},)"
                R"( {"role": "assistant", "content": "b", "weight": 0}]})"),
      no_answer);
}

TEST_F(DatasetTest, RejectsBadTokenLines) {
  EXPECT_EQ(ReasonFor(R"({"input_ids": [], "loss_mask": []})"),
            "input_ids must be a non-empty list of integers, got []");
  EXPECT_EQ(ReasonFor(R"({"input_ids": "1 2", "loss_mask": [0, 1]})"),
            "input_ids must be a non-empty list of integers, got \"1 2\"");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2], "loss_mask": 1})"),
            "loss_mask must be a list of 0 and 1, got 1");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1]})"),
            "loss_mask has 2 values but input_ids has 3");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2.5], "loss_mask": [0, 1]})"),
            "input_ids[1] must be an integer in [0, 259), got 2.5");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, "2"], "loss_mask": [0, 1]})"),
            "input_ids[1] must be an integer in [0, 259), got \"2\"");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2, 259], "loss_mask": [0, 1, 1]})"),
            "input_ids[2] must be an integer in [0, 259), got 259");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [-1, 2], "loss_mask": [0, 1]})"),
            "input_ids[0] must be an integer in [0, 259), got -1");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 18446744073709551615],)"
                      R"( "loss_mask": [0, 1]})"),
            "input_ids[1] must be an integer in [0, 259), got "
            "18446744073709551615");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2], "loss_mask": [0, 2]})"),
            "loss_mask[1] must be 0 or 1, got 2");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2], "loss_mask": [0, true]})"),
            "loss_mask[1] must be 0 or 1, got true");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2], "loss_mask": [1, 1]})"),
            "loss_mask[0] must be 0: the first token has nothing before it to "
            "be predicted from");
  EXPECT_EQ(ReasonFor(R"({"input_ids": [1, 2], "loss_mask": [0, 0]})"),
            "loss_mask has no 1, so the line has no target tokens");
}

// Models often have more embedding rows than tokens (Qwen2.5: 151,936 vs
// 151,665): pre-tokenized lines may use every row, and no more.
TEST_F(DatasetTest, TokenLinesAreBoundedByTheModelsEmbedding) {
  DatasetParseOptions options;
  options.vocab_size = 300;
  absl::StatusOr<Dataset> dataset =
      Parse(R"({"input_ids": [1, 299], "loss_mask": [0, 1]})", options);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  EXPECT_EQ(dataset->examples[0].input_ids, (std::vector<int64_t>{1, 299}));
  dataset = Parse(R"({"input_ids": [1, 300], "loss_mask": [0, 1]})", options);
  EXPECT_THAT(std::string(dataset.status().message()),
              HasSubstr("input_ids[1] must be an integer in [0, 300), got "
                        "300"));
}

// A tokenizer.json model without BOS (Qwen2 style): text starts with the
// text's own first token, which is context, not a target.
TEST(DatasetWithoutBosTest, TextStartsWithItsFirstToken) {
  auto tokenizer =
      LoadTokenizer(std::string(LORAPLEX_SOURCE_DIR) +
                    "/tests/fixtures/golden/tokenizers/qwen2_like");
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  ASSERT_FALSE((*tokenizer)->bos_id().has_value());
  absl::StatusOr<Dataset> dataset =
      ParseJsonlDataset(R"({"text": "hello world"})", **tokenizer);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  std::vector<int64_t> ids = (*tokenizer)->Encode("hello world").value();
  ids.push_back((*tokenizer)->eos_id());
  std::vector<uint8_t> mask(ids.size(), 1);
  mask[0] = 0;
  EXPECT_EQ(dataset->examples[0].input_ids, ids);
  EXPECT_EQ(dataset->examples[0].loss_mask, mask);
}

TEST_F(DatasetTest, ListsEveryBadLineInOrder) {
  absl::StatusOr<Dataset> dataset = Parse(
      "{\"text\": \"ok\"}\n"
      "{\"text\": 1}\n"
      "{\"text\": \"ok\"}\n"
      "nope\n"
      "\n"
      "{\"prompt\": \"a\", \"completion\": \"\"}\n");
  ASSERT_FALSE(dataset.ok());
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::string> lines = MessageLines(dataset.status());
  ASSERT_EQ(lines.size(), 4u) << dataset.status();
  EXPECT_EQ(lines[0], "dataset has 3 bad lines (nothing was loaded):");
  EXPECT_EQ(lines[1], "line 2: text must be a string, got 1");
  EXPECT_THAT(lines[2], StartsWith("line 4: not valid JSON ("));
  EXPECT_EQ(lines[3], "line 6: completion must not be empty");
}

TEST_F(DatasetTest, CapsTheListAndCountsTheRest) {
  std::string contents = "{\"text\": \"ok\"}\n";
  for (int i = 0; i < 9; ++i) contents += "{\"text\": 7}\n";
  DatasetParseOptions options;
  options.max_reported_problems = 2;
  absl::StatusOr<Dataset> dataset = Parse(contents, options);
  ASSERT_FALSE(dataset.ok());
  EXPECT_THAT(MessageLines(dataset.status()),
              ElementsAre("dataset has 9 bad lines (nothing was loaded):",
                          "line 2: text must be a string, got 7",
                          "line 3: text must be a string, got 7",
                          "... and 7 more bad lines"));

  options.max_reported_problems = 8;
  dataset = Parse(contents, options);
  ASSERT_FALSE(dataset.ok());
  std::vector<std::string> lines = MessageLines(dataset.status());
  ASSERT_EQ(lines.size(), 10u);
  EXPECT_EQ(lines[8], "line 9: text must be a string, got 7");
  EXPECT_EQ(lines[9], "... and 1 more bad line");

  options.max_reported_problems = 0;
  dataset = Parse(contents, options);
  EXPECT_THAT(MessageLines(dataset.status()),
              ElementsAre("dataset has 9 bad lines (nothing was loaded):",
                          "... and 9 more bad lines"));
}

class LoadDatasetTest : public DatasetTest {
 protected:
  std::string WriteFile(const std::string& name, const std::string& text) {
    std::string path = ::testing::TempDir() + "/" + name;
    std::ofstream out(path, std::ios::binary);
    out << text;
    return path;
  }
};

TEST_F(LoadDatasetTest, ReadsAFileWithCrlf) {
  std::string path = WriteFile(
      "crlf.jsonl",
      "{\"prompt\": \"q\", \"completion\": \"a\"}\r\n{\"text\": \"t\"}\r\n");
  absl::StatusOr<Dataset> dataset = LoadJsonlDataset(path, tokenizer_);
  ASSERT_TRUE(dataset.ok()) << dataset.status();
  ASSERT_EQ(dataset->examples.size(), 2u);
  EXPECT_THAT(dataset->examples[0].input_ids,
              ElementsAre(kBos, 'q', 'a', kEos));
  EXPECT_THAT(dataset->examples[0].loss_mask, ElementsAre(0, 0, 1, 1));
  EXPECT_THAT(dataset->examples[1].input_ids, ElementsAre(kBos, 't', kEos));
  EXPECT_EQ(dataset->num_target_tokens, 4);
}

TEST_F(LoadDatasetTest, ErrorsStartWithThePath) {
  const std::string missing = ::testing::TempDir() + "/no_such_dataset.jsonl";
  absl::StatusOr<Dataset> dataset = LoadJsonlDataset(missing, tokenizer_);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(dataset.status().message(), missing + ": cannot be read");

  std::string path = WriteFile("bad.jsonl", "{\"text\": \"a\"}\n{\"x\": 1}\n");
  dataset = LoadJsonlDataset(path, tokenizer_);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<std::string> lines = MessageLines(dataset.status());
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0], path + ": dataset has 1 bad line (nothing was loaded):");
  EXPECT_THAT(lines[1], StartsWith("line 2: has no recognised keys"));

  dataset = LoadJsonlDataset(::testing::TempDir(), tokenizer_);
  EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(dataset.status().message()),
              StartsWith(::testing::TempDir() + ": is a directory"));
}

// Random bytes, damaged good lines and random JSON values: every line is
// either accepted with a consistent example or rejected, never a crash.
TEST_F(DatasetTest, SurvivesGarbageLines) {
  std::mt19937 random(1234);
  auto pick = [&](int n) { return static_cast<int>(random() % n); };
  const std::vector<std::string> good = {
      R"({"text": "hello"})", R"({"prompt": "p", "completion": "c"})",
      R"({"messages": [{"role": "user", "content": "u"}, )"
      R"({"role": "assistant", "content": "a"}]})",
      R"({"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]})"};
  const std::vector<std::string> atoms = {
      "0",     "1",           "-1",      "2.5",
      "1e400", "true",        "null",    "\"\"",
      "\"a\"", "\"user\"",    "[]",      "{}",
      "259",   "\"\\u0000\"", "\"\\n\"", "18446744073709551616"};
  const std::vector<std::string> keys = {"text",     "prompt",    "completion",
                                         "messages", "input_ids", "loss_mask",
                                         "role",     "content",   "x"};
  std::function<std::string(int)> value = [&](int depth) -> std::string {
    int kind = depth > 4 ? 0 : pick(3);
    if (kind == 0) return atoms[pick(static_cast<int>(atoms.size()))];
    std::string out = kind == 1 ? "[" : "{";
    int n = pick(4);
    for (int i = 0; i < n; ++i) {
      if (i > 0) out += ",";
      if (kind == 2)
        out += "\"" + keys[pick(static_cast<int>(keys.size()))] + "\":";
      out += value(depth + 1);
    }
    return out + (kind == 1 ? "]" : "}");
  };
  int accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string line;
    switch (trial % 3) {
      case 0:
        for (int i = pick(40); i > 0; --i) {
          char c = static_cast<char>(random());
          line.push_back(c == '\n' ? ' ' : c);
        }
        break;
      case 1:
        line = good[pick(static_cast<int>(good.size()))];
        for (int i = 1 + pick(3); i > 0; --i) {
          char c = static_cast<char>(random());
          line[pick(static_cast<int>(line.size()))] = c == '\n' ? ' ' : c;
        }
        if (pick(2) == 0) line.resize(1 + pick(static_cast<int>(line.size())));
        break;
      default:
        line = value(0);
    }
    absl::StatusOr<Dataset> dataset = Parse(line);
    if (!dataset.ok()) {
      EXPECT_EQ(dataset.status().code(), absl::StatusCode::kInvalidArgument)
          << line;
      continue;
    }
    ++accepted;
    for (const Example& example : dataset->examples) {
      ASSERT_EQ(example.input_ids.size(), example.loss_mask.size()) << line;
      ASSERT_FALSE(example.input_ids.empty());
      EXPECT_EQ(example.loss_mask[0], 0) << line;
      for (int64_t id : example.input_ids) {
        EXPECT_TRUE(id >= 0 && id < ByteTokenizer::kVocabSize) << line;
      }
    }
    EXPECT_GT(dataset->num_target_tokens, 0) << line;
  }
  // The damaged good lines keep some lines valid, so both paths are run.
  EXPECT_GT(accepted, 0);
}

}  // namespace
}  // namespace loraplex
