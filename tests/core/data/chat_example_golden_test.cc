// Chat, prompt/completion and TRL conversational lines give the ids and
// loss masks that transformers and HF tokenizers give (committed goldens
// from tools/golden/make_chat_template_golden.py): ids equal to
// apply_chat_template(tokenize=True) and to tokenizing prompt + completion
// as one text; masks equal to return_assistant_tokens_mask where the
// template has {% generation %} blocks, and otherwise to an independent
// Python implementation of the prefix rule, or, where a template is not
// prefix-stable, of the per-turn rule (one example per assistant turn).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
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

  absl::StatusOr<std::vector<Example>> ParseAll(
      const ordered_json& line, const std::string& template_name) {
    DatasetParseOptions options;
    options.chat_template = &Template(template_name);
    return ParseJsonlLine(line.dump(), *tokenizer_, options);
  }

  // A line that must give exactly one example.
  absl::StatusOr<Example> Parse(const ordered_json& line,
                                const std::string& template_name) {
    absl::StatusOr<std::vector<Example>> examples =
        ParseAll(line, template_name);
    if (!examples.ok()) return examples.status();
    EXPECT_EQ(examples->size(), 1u) << line.dump();
    if (examples->empty()) return absl::InternalError("no example");
    return examples->front();
  }

  std::unique_ptr<HfTokenizer> tokenizer_;
  std::vector<std::pair<std::string, std::string>> special_;
  std::map<std::string, ChatTemplate> templates_;
};

// Expects `examples` to be the golden per-turn examples `turns`.
void ExpectTurnExamples(const std::vector<Example>& examples,
                        const ordered_json& turns, const std::string& where) {
  ASSERT_EQ(examples.size(), turns.size()) << where;
  for (size_t k = 0; k < turns.size(); ++k) {
    EXPECT_EQ(examples[k].input_ids, Ids(turns[k]["ids"]))
        << where << " turn " << k;
    EXPECT_EQ(examples[k].loss_mask, Mask(turns[k]["mask"]))
        << where << " turn " << k;
  }
}

bool AnyTarget(const ordered_json& mask) {
  for (size_t i = 1; i < mask.size(); ++i) {
    if (mask[i].get<int>() != 0) return true;
  }
  return false;
}

TEST_F(ChatExampleGoldenTest, MessagesTrainOnTheAssistantTokensHfMarks) {
  std::map<std::string, ordered_json> conversations;
  for (const ordered_json& c :
       ReadGoldenLines(GoldenPath("chat_templates/conversations.jsonl"))) {
    conversations[c["name"].get<std::string>()] = c;
  }
  int by_generation = 0, by_prefix = 0, per_turn = 0, refused = 0;
  for (const ordered_json& expected :
       ReadGoldenLines(GoldenPath("chat_templates/expected.jsonl"))) {
    if (expected["add_generation_prompt"] == true ||
        !expected["error"].is_null()) {
      continue;
    }
    const std::string name = expected["template"];
    const ordered_json& conversation =
        conversations.at(expected["conversation"].get<std::string>());
    const std::string where =
        absl::StrCat(name, " / ", expected["conversation"].get<std::string>());
    ordered_json line = {{"messages", conversation["messages"]}};
    if (conversation.contains("tools")) line["tools"] = conversation["tools"];
    // Template variables, as transformers' **kwargs.
    if (conversation.contains("kwargs")) {
      line["chat_template_kwargs"] = conversation["kwargs"];
    }
    const bool generation = !expected["assistant_mask"].is_null();
    const ordered_json& golden =
        generation ? expected["weighted_mask"] : expected["prefix_mask"];
    absl::StatusOr<std::vector<Example>> examples = ParseAll(line, name);
    if (!golden.is_null() && AnyTarget(golden)) {
      // One example per conversation, as transformers masks it.
      ASSERT_TRUE(examples.ok()) << where << ": " << examples.status();
      ASSERT_EQ(examples->size(), 1u) << where;
      const Example& example = examples->front();
      EXPECT_EQ(example.input_ids, Ids(expected["ids"])) << where;
      EXPECT_EQ(example.loss_mask, Mask(golden)) << where;
      if (generation) {
        ++by_generation;
        // Without weights the generation spans are HF's own assistant mask.
        if (expected["weighted_mask"] == expected["assistant_mask"]) {
          EXPECT_EQ(example.loss_mask, Mask(expected["assistant_mask"]))
              << where;
        }
      } else {
        ++by_prefix;
      }
    } else if (golden.is_null() && !generation &&
               expected.contains("turn_examples") &&
               !expected["turn_examples"].empty()) {
      // Not prefix-stable: one example per trained assistant turn, each
      // rendered as the model sees it at inference.
      ASSERT_TRUE(examples.ok()) << where << ": " << examples.status();
      ExpectTurnExamples(*examples, expected["turn_examples"], where);
      line["turns"] = "last";
      absl::StatusOr<std::vector<Example>> last = ParseAll(line, name);
      if (expected.contains("last_turn_examples") &&
          !expected["last_turn_examples"].empty()) {
        ASSERT_TRUE(last.ok()) << where << ": " << last.status();
        ExpectTurnExamples(*last, expected["last_turn_examples"],
                           where + " (last turn)");
      } else {
        EXPECT_FALSE(last.ok()) << where << " (last turn)";
      }
      ++per_turn;
    } else {
      // Nothing to train, or no rule places a turn: refused, naming why.
      ASSERT_FALSE(examples.ok()) << where;
      EXPECT_EQ(examples.status().code(), absl::StatusCode::kInvalidArgument);
      ++refused;
    }
  }
  EXPECT_GE(by_generation, 25);
  EXPECT_GE(by_prefix, 90);
  EXPECT_GE(per_turn, 7);
  EXPECT_GE(refused, 1);
}

// Two user/assistant turns, each answer with its reasoning.
ordered_json ReasoningConversation() {
  return {{{"role", "user"}, {"content", "Hi"}},
          {{"role", "assistant"},
           {"content", "Hello."},
           {"reasoning_content", "They greet me."}},
          {{"role", "user"}, {"content", "How are you?"}},
          {{"role", "assistant"},
           {"content", "Fine."},
           {"reasoning_content", "Small talk."}}};
}

// A reasoning template's single user/assistant pair, and its multi-turn
// conversations: once refused by the prefix rule, now trained turn by turn.
TEST_F(ChatExampleGoldenTest, ReasoningTemplateTrainsEveryTurn) {
  const ordered_json line = {{"messages", ReasoningConversation()}};
  absl::StatusOr<std::vector<Example>> examples = ParseAll(line, "qwen3");
  ASSERT_TRUE(examples.ok()) << examples.status();
  ASSERT_EQ(examples->size(), 2u);
  // Each example is a prefix of the conversation as rendered at its turn;
  // the first turn's example is shorter.
  EXPECT_LT((*examples)[0].input_ids.size(), (*examples)[1].input_ids.size());
  ordered_json last = line;
  last["turns"] = "last";
  absl::StatusOr<std::vector<Example>> only_last = ParseAll(last, "qwen3");
  ASSERT_TRUE(only_last.ok()) << only_last.status();
  ASSERT_EQ(only_last->size(), 1u);
  EXPECT_EQ(only_last->front().input_ids, (*examples)[1].input_ids);
  EXPECT_EQ(only_last->front().loss_mask, (*examples)[1].loss_mask);
}

// An assistant message with empty content trains its end of turn.
TEST_F(ChatExampleGoldenTest, AnEmptyAnswerTrainsItsEndOfTurn) {
  const ordered_json line = {{"messages",
                              {{{"role", "user"}, {"content", "Say nothing."}},
                               {{"role", "assistant"}, {"content", ""}}}}};
  absl::StatusOr<std::vector<Example>> examples = ParseAll(line, "qwen25");
  ASSERT_TRUE(examples.ok()) << examples.status();
  ASSERT_EQ(examples->size(), 1u);
  const std::vector<uint8_t>& mask = examples->front().loss_mask;
  EXPECT_NE(std::find(mask.begin(), mask.end(), 1), mask.end());
}

TEST_F(ChatExampleGoldenTest, BadTurnsAndKwargsAreNamed) {
  const ordered_json messages = {{{"role", "user"}, {"content", "Hi"}},
                                 {{"role", "assistant"}, {"content", "Yo"}}};
  ordered_json line = {{"messages", messages}, {"turns", "first"}};
  EXPECT_THAT(std::string(ParseAll(line, "qwen3").status().message()),
              HasSubstr("turns must be \"all\" or \"last\", got \"first\""));
  line = {{"messages", messages}, {"chat_template_kwargs", "thinking"}};
  EXPECT_THAT(std::string(ParseAll(line, "qwen3").status().message()),
              HasSubstr("chat_template_kwargs must be an object"));
  line = {{"messages", messages},
          {"chat_template_kwargs", {{"add_generation_prompt", true}}}};
  EXPECT_THAT(std::string(ParseAll(line, "qwen3").status().message()),
              HasSubstr("chat_template_kwargs.add_generation_prompt: set by "
                        "the line itself"));
  line = {{"text", "plain"}, {"turns", "last"}};
  EXPECT_THAT(std::string(ParseAll(line, "qwen3").status().message()),
              HasSubstr("unknown key \"turns\""));
  // Without a template there is nothing to pass variables to.
  line = {{"messages", messages}, {"chat_template_kwargs", {{"x", 1}}}};
  EXPECT_THAT(
      std::string(ParseJsonlLine(line.dump(), *tokenizer_).status().message()),
      HasSubstr("chat_template_kwargs needs the base model's chat template"));
}

// The upload's chat_template_kwargs and turns act as each line's own keys;
// a line's kwargs merge over the upload's key by key, its turns replace.
TEST_F(ChatExampleGoldenTest, UploadDefaultsActAsTheLinesOwnKeys) {
  const ordered_json messages = ReasoningConversation();
  const ordered_json plain = {{"messages", messages}};
  auto parse = [&](const ordered_json& line, absl::string_view kwargs,
                   absl::string_view turns) {
    absl::StatusOr<ChatLineDefaults> defaults =
        ParseChatLineDefaults(kwargs, turns, "header.");
    EXPECT_TRUE(defaults.ok()) << defaults.status();
    DatasetParseOptions options;
    options.chat_template = &Template("qwen3");
    options.chat_defaults = *defaults;
    absl::StatusOr<std::vector<Example>> examples =
        ParseJsonlLine(line.dump(), *tokenizer_, options);
    EXPECT_TRUE(examples.ok()) << examples.status();
    return examples.value_or(std::vector<Example>{});
  };
  auto same = [](const std::vector<Example>& a, const std::vector<Example>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i].input_ids != b[i].input_ids ||
          a[i].loss_mask != b[i].loss_mask) {
        return false;
      }
    }
    return true;
  };
  ordered_json own = plain;
  own["chat_template_kwargs"] = {{"enable_thinking", false}};
  own["turns"] = "last";
  const std::vector<Example> defaults =
      parse(plain, R"({"enable_thinking": false})", "last");
  ASSERT_EQ(defaults.size(), 1u);
  EXPECT_TRUE(same(defaults, parse(own, "", "")));
  // The variable changes what is trained: without it, other examples.
  EXPECT_FALSE(same(defaults, parse(plain, "", "last")));
  EXPECT_EQ(parse(plain, "", "").size(), 2u);
  // A line's own keys win: its turns, and its kwargs merged key by key.
  ordered_json line = plain;
  line["turns"] = "all";
  line["chat_template_kwargs"] = {{"enable_thinking", true}};
  EXPECT_TRUE(same(parse(line, R"({"enable_thinking": false, "x": 1})", "last"),
                   parse(plain, R"({"enable_thinking": true, "x": 1})", "")));
  line.erase("turns");
  line["chat_template_kwargs"] = {{"x", 2}};
  EXPECT_TRUE(
      same(parse(line, R"({"enable_thinking": false})", "last"),
           parse(plain, R"({"enable_thinking": false, "x": 2})", "last")));
  // Lines of other kinds are untouched.
  EXPECT_EQ(parse({{"text", "plain"}}, R"({"enable_thinking": false})", "last")
                .size(),
            1u);
}

TEST_F(ChatExampleGoldenTest, BadUploadDefaultsAreNamed) {
  auto message = [](absl::string_view kwargs, absl::string_view turns) {
    return std::string(
        ParseChatLineDefaults(kwargs, turns, "header.").status().message());
  };
  EXPECT_THAT(message("", "first"),
              HasSubstr("header.turns must be \"all\" or \"last\", got "
                        "\"first\""));
  EXPECT_THAT(message("[1]", ""),
              HasSubstr("header.chat_template_kwargs must be a JSON object"));
  EXPECT_THAT(message("{", ""), HasSubstr("header.chat_template_kwargs"));
  EXPECT_THAT(message(R"({"messages": []})", ""),
              HasSubstr("header.chat_template_kwargs.messages: set by each "
                        "line"));
  // Stored and read back as they were.
  absl::StatusOr<ChatLineDefaults> defaults =
      ParseChatLineDefaults(R"({"b": 1, "a": [true]})", "last");
  ASSERT_TRUE(defaults.ok()) << defaults.status();
  absl::StatusOr<ChatLineDefaults> stored =
      ChatLineDefaultsFromJson(ChatLineDefaultsToJson(*defaults));
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->chat_template_kwargs.dump(), R"({"b":1,"a":[true]})");
  EXPECT_EQ(stored->turns, "last");
  EXPECT_FALSE(ChatLineDefaultsFromJson("nonsense").ok());
  // Without a template there is nothing to pass the upload's variables to.
  DatasetParseOptions options;
  options.chat_defaults = *defaults;
  const ordered_json line = {{"messages",
                              {{{"role", "user"}, {"content", "Hi"}},
                               {{"role", "assistant"}, {"content", "Yo"}}}}};
  EXPECT_THAT(
      std::string(
          ParseJsonlLine(line.dump(), *tokenizer_, options).status().message()),
      HasSubstr("the upload's chat_template_kwargs needs the base "
                "model's chat template"));
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
    absl::StatusOr<std::vector<Example>> examples =
        ParseJsonlLine(line.dump(), tokenizer);
    const std::string where = absl::StrCat(name, " / ", line.dump());
    ASSERT_TRUE(examples.ok()) << where << ": " << examples.status();
    ASSERT_EQ(examples->size(), 1u) << where;
    const Example* example = &examples->front();
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
