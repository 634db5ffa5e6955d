// Chat, prompt/completion and TRL conversational lines give the ids and
// loss masks that transformers and HF tokenizers give (committed goldens
// from tools/golden/make_chat_template_golden.py): ids equal to
// apply_chat_template(tokenize=True) and to tokenizing prompt + completion
// as one text; masks equal to return_assistant_tokens_mask where the
// template has {% generation %} blocks, and otherwise to an independent
// Python implementation of the prefix rule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/chat/chat_template.h"
#include "core/data/dataset.h"
#include "core/tokenizer/hf_tokenizer.h"
#include "core/tokenizer/load_tokenizer.h"
#include "tests/common/golden_files.h"

namespace loraplex {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

std::vector<uint8_t> Mask(const ordered_json& values) {
  std::vector<uint8_t> mask;
  for (const auto& v : values) mask.push_back(v.get<int>() != 0);
  if (!mask.empty()) mask[0] = 0;  // Position 0 is never a target.
  return mask;
}

std::vector<int64_t> Ids(const ordered_json& values) {
  return values.get<std::vector<int64_t>>();
}

class ChatExampleGoldenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = LoadHfTokenizer(GoldenPath("chat_templates/tokenizer"));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = *std::move(tokenizer);
    auto special =
        ReadSpecialTokenStrings(GoldenPath("chat_templates/tokenizer"));
    ASSERT_TRUE(special.ok()) << special.status();
    special_.assign(special->begin(), special->end());
  }

  const ChatTemplate& Template(const std::string& name) {
    auto it = templates_.find(name);
    if (it != templates_.end()) return it->second;
    auto parsed = ChatTemplate::Parse(
        {{"default", ReadGoldenText(GoldenPath("chat_templates/templates/" +
                                               name + ".jinja"))}},
        name, special_);
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return templates_.emplace(name, *std::move(parsed)).first->second;
  }

  absl::StatusOr<Example> Parse(const ordered_json& line,
                                const std::string& template_name) {
    DatasetParseOptions options;
    options.chat_template = &Template(template_name);
    return ParseJsonlLine(line.dump(), *tokenizer_, options);
  }

  std::unique_ptr<HfTokenizer> tokenizer_;
  std::vector<std::pair<std::string, std::string>> special_;
  std::map<std::string, ChatTemplate> templates_;
};

TEST_F(ChatExampleGoldenTest, MessagesTrainOnTheAssistantTokensHfMarks) {
  std::map<std::string, ordered_json> conversations;
  for (const ordered_json& c :
       ReadGoldenLines(GoldenPath("chat_templates/conversations.jsonl"))) {
    conversations[c["name"].get<std::string>()] = c;
  }
  int by_generation = 0, by_prefix = 0, refused = 0;
  for (const ordered_json& expected :
       ReadGoldenLines(GoldenPath("chat_templates/expected.jsonl"))) {
    if (expected["add_generation_prompt"] == true ||
        !expected["error"].is_null()) {
      continue;
    }
    const std::string name = expected["template"];
    const ordered_json& conversation =
        conversations.at(expected["conversation"].get<std::string>());
    if (conversation.contains("kwargs")) continue;  // Not a dataset field.
    const std::string where =
        absl::StrCat(name, " / ", expected["conversation"].get<std::string>());
    ordered_json line = {{"messages", conversation["messages"]}};
    if (conversation.contains("tools")) line["tools"] = conversation["tools"];
    const ordered_json& golden = expected["weighted_mask"].is_null()
                                     ? expected["prefix_mask"]
                                     : expected["weighted_mask"];
    absl::StatusOr<Example> example = Parse(line, name);
    bool has_answer = false;  // A trained assistant turn with text.
    for (const ordered_json& m : conversation["messages"]) {
      has_answer = has_answer ||
                   (m["role"] == "assistant" && m.value("weight", 1) != 0 &&
                    ((m.contains("content") && m["content"].is_string() &&
                      !m["content"].get<std::string>().empty()) ||
                     (m.contains("tool_calls") && !m["tool_calls"].empty())));
    }
    if (golden.is_null() || !has_answer) {
      // The prefix rule cannot place a turn, or nothing is trained: the
      // line is refused with the message it concerns.
      ASSERT_FALSE(example.ok()) << where;
      EXPECT_EQ(example.status().code(), absl::StatusCode::kInvalidArgument);
      if (golden.is_null()) {
        EXPECT_THAT(std::string(example.status().message()),
                    HasSubstr("messages["))
            << where;
      }
      ++refused;
      continue;
    }
    ASSERT_TRUE(example.ok()) << where << ": " << example.status();
    EXPECT_EQ(example->input_ids, Ids(expected["ids"])) << where;
    EXPECT_EQ(example->loss_mask, Mask(golden)) << where;
    if (!expected["assistant_mask"].is_null()) {
      ++by_generation;
      // Without weights the generation spans are HF's own assistant mask.
      if (expected["weighted_mask"] == expected["assistant_mask"]) {
        EXPECT_EQ(example->loss_mask, Mask(expected["assistant_mask"]))
            << where;
      }
    } else {
      ++by_prefix;
    }
  }
  EXPECT_GE(by_generation, 25);
  EXPECT_GE(by_prefix, 90);
  EXPECT_GE(refused, 5);
}

TEST_F(ChatExampleGoldenTest, PromptAndCompletionAreTokenizedAsOneText) {
  std::map<std::string, std::unique_ptr<Tokenizer>> tokenizers;
  int checked = 0;
  for (const ordered_json& expected :
       ReadGoldenLines(GoldenPath("chat_templates/prompt_completion.jsonl"))) {
    const std::string name = expected["tokenizer"];
    if (tokenizers.count(name) == 0) {
      auto loaded = LoadTokenizer(name == "tokenizer"
                                      ? GoldenPath("chat_templates/tokenizer")
                                      : GoldenPath("tokenizers/" + name));
      ASSERT_TRUE(loaded.ok()) << loaded.status();
      tokenizers[name] = *std::move(loaded);
    }
    const Tokenizer& tokenizer = *tokenizers[name];
    const ordered_json line = {{"prompt", expected["prompt"]},
                               {"completion", expected["completion"]}};
    absl::StatusOr<Example> example = ParseJsonlLine(line.dump(), tokenizer);
    const std::string where = absl::StrCat(name, " / ", line.dump());
    ASSERT_TRUE(example.ok()) << where << ": " << example.status();
    std::vector<int64_t> ids = Ids(expected["ids"]);
    ids.push_back(tokenizer.eos_id());
    std::vector<uint8_t> mask = Mask(expected["target"]);
    mask.push_back(1);  // EOS ends the completion.
    EXPECT_EQ(example->input_ids, ids) << where;
    EXPECT_EQ(example->loss_mask, mask) << where;
    ++checked;
  }
  EXPECT_GE(checked, 150);
}

TEST_F(ChatExampleGoldenTest, TrlConversationalTrainsOnTheCompletion) {
  int checked = 0;
  for (const ordered_json& expected :
       ReadGoldenLines(GoldenPath("chat_templates/trl_conversational.jsonl"))) {
    const ordered_json line = {{"prompt", expected["prompt"]},
                               {"completion", expected["completion"]}};
    const std::string where = expected["template"].get<std::string>();
    absl::StatusOr<Example> example = Parse(line, where);
    ASSERT_TRUE(example.ok()) << where << ": " << example.status();
    EXPECT_EQ(example->input_ids, Ids(expected["ids"])) << where;
    EXPECT_EQ(example->loss_mask, Mask(expected["target"])) << where;
    ++checked;
  }
  EXPECT_GE(checked, 12);
}

// tools is a list of definitions on both chat kinds that take it.
TEST_F(ChatExampleGoldenTest, ToolsMustBeAList) {
  const ordered_json user = {{"role", "user"}, {"content", "hi"}};
  const ordered_json answer = {{"role", "assistant"}, {"content", "yo"}};
  for (const ordered_json& line :
       {ordered_json{{"messages", {user, answer}}, {"tools", "search"}},
        ordered_json{{"prompt", {user}},
                     {"completion", {answer}},
                     {"tools", {{"name", "search"}}}}}) {
    absl::StatusOr<Example> example = Parse(line, "qwen25");
    ASSERT_FALSE(example.ok()) << line.dump();
    EXPECT_THAT(std::string(example.status().message()),
                HasSubstr("tools must be a list of tool definitions, got "))
        << line.dump();
  }
}

}  // namespace
}  // namespace loraplex
