// The chat templates of tests/fixtures/golden/chat_templates (written in
// the styles of Llama 3, Qwen2.5, Qwen3, Mistral, Gemma, Phi-3, SmolLM2 and
// ChatML) render every fixture conversation exactly as transformers'
// apply_chat_template did, errors included.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "absl/strings/str_cat.h"
#include "core/chat/chat_template.h"
#include "core/tokenizer/hf_tokenizer.h"
#include "tests/common/golden_files.h"

namespace loraplex {
namespace {

using nlohmann::ordered_json;
using ::testing::HasSubstr;

std::string Golden(const std::string& relative) {
  return GoldenPath("chat_templates/" + relative);
}

TEST(ChatTemplateGoldenTest, RendersAsTransformers) {
  std::map<std::string, ordered_json> conversations;
  for (const ordered_json& c : ReadGoldenLines(Golden("conversations.jsonl"))) {
    conversations[c["name"].get<std::string>()] = c;
  }
  auto special = ReadSpecialTokenStrings(Golden("tokenizer"));
  ASSERT_TRUE(special.ok()) << special.status();
  std::map<std::string, ChatTemplate> templates;
  int rendered = 0, errors = 0;
  for (const ordered_json& expected :
       ReadGoldenLines(Golden("expected.jsonl"))) {
    const std::string name = expected["template"];
    if (templates.count(name) == 0) {
      auto parsed = ChatTemplate::Parse(
          {{"default", ReadGoldenText(Golden("templates/" + name + ".jinja"))}},
          name, {special->begin(), special->end()});
      ASSERT_TRUE(parsed.ok()) << parsed.status();
      templates.emplace(name, *std::move(parsed));
    }
    const ordered_json& conversation =
        conversations.at(expected["conversation"]);
    ChatRenderOptions options;
    options.add_generation_prompt = expected["add_generation_prompt"];
    if (conversation.contains("tools")) options.tools = conversation["tools"];
    if (conversation.contains("kwargs")) {
      options.variables = conversation["kwargs"];
    }
    const std::string where = absl::StrCat(
        name, " / ", expected["conversation"].get<std::string>(),
        options.add_generation_prompt ? " + generation prompt" : "");
    auto rendering =
        templates.at(name).Render(conversation["messages"], options);
    if (!expected["error"].is_null()) {
      ASSERT_FALSE(rendering.ok()) << where;
      EXPECT_EQ(rendering.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(rendering.status().message()),
                  HasSubstr(expected["error"].get<std::string>()))
          << where;
      ++errors;
      continue;
    }
    ASSERT_TRUE(rendering.ok()) << where << ": " << rendering.status();
    EXPECT_EQ(rendering->text, expected["text"].get<std::string>()) << where;
    ++rendered;
  }
  EXPECT_GE(rendered, 300);
  EXPECT_GE(errors, 10);
}

// Single constructs (snippets.jsonl, from
// tools/golden/make_jinja_snippets_golden.py with transformers' jinja2
// environment): output equal to jinja2's; where jinja2 raises, so does the
// subset, with the same message for undefined values and raise_exception.
TEST(JinjaSnippetGoldenTest, RendersAsJinja2) {
  int rendered = 0, errors = 0;
  for (const ordered_json& expected :
       ReadGoldenLines(Golden("snippets.jsonl"))) {
    const std::string source = expected["template"];
    std::vector<std::pair<std::string, jinja::Value>> variables;
    for (auto it = expected["variables"].begin();
         it != expected["variables"].end(); ++it) {
      variables.emplace_back(it.key(), jinja::Value::FromJson(*it));
    }
    absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(source);
    absl::StatusOr<jinja::Rendering> rendering =
        parsed.ok() ? parsed->Render(variables)
                    : absl::StatusOr<jinja::Rendering>(parsed.status());
    if (expected.contains("error")) {
      ASSERT_FALSE(rendering.ok()) << source;
      EXPECT_EQ(rendering.status().code(), absl::StatusCode::kInvalidArgument);
      const std::string type = expected["error_type"];
      if (type == "TemplateError" || type == "UndefinedError") {
        EXPECT_THAT(std::string(rendering.status().message()),
                    HasSubstr(expected["error"].get<std::string>()))
            << source;
      }
      ++errors;
      continue;
    }
    ASSERT_TRUE(rendering.ok()) << source << ": " << rendering.status();
    EXPECT_EQ(rendering->text, expected["output"].get<std::string>()) << source;
    ++rendered;
  }
  EXPECT_GE(rendered, 40);
  EXPECT_GE(errors, 8);
}

// What the subset lacks is refused when the template is read, naming the
// construct and its line.
TEST(JinjaTemplateTest, UnsupportedConstructsAreNamedWithTheirLine) {
  const std::pair<std::string, std::string> cases[] = {
      {"a\n{% extends 'base' %}",
       "line 2: the tag \"extends\" is not supported"},
      {"{% include 'x' %}", "the tag \"include\" is not supported"},
      {"{{ x | wordwrap }}",
       "line 1: the filter \"wordwrap\" is not supported"},
      {"{{ x is hugetest }}", "line 1: No test named 'hugetest'."},
      {"{{ '[1]' | from_json }}", "line 1: No filter named 'from_json'."},
      {"{% if x %}{% for y in x %}{{ y | from_json }}{% endfor %}{% endif %}",
       "line 1: No filter named 'from_json'."},
      {"{% filter wordwrap %}x{% endfilter %}",
       "the filter \"wordwrap\" is not supported"},
      {"{% call m %}x{% endcall %}", "line 1: expected call"},
      {"{% raw %}x{% endraw %}", "the tag \"raw\" is not supported"},
      {"{% for x in xs %}", "missing {% endfor %} before the end"},
      {"{% endif %}", "{% endif %} without its opening tag"},
      {"{{ 'open }}", "a string literal is not closed"},
  };
  for (const auto& [source, message] : cases) {
    absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(source);
    ASSERT_FALSE(parsed.ok()) << source;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(parsed.status().message()), HasSubstr(message))
        << source;
  }
  // Inside an {% if %}, as in jinja2, an unknown filter fails only if it
  // runs.
  auto deferred = jinja::Template::Parse(
      "{% if x %}{{ x | from_json }}{% endif %}{{ y | wordwrap if z }}");
  ASSERT_TRUE(deferred.ok()) << deferred.status();
  EXPECT_EQ(deferred->Render({})->text, "");
  auto ran = deferred->Render({{"x", jinja::Value::String("[1]")}});
  ASSERT_FALSE(ran.ok());
  EXPECT_THAT(std::string(ran.status().message()),
              HasSubstr("line 1: No filter named 'from_json' found."));
  // Methods are looked up when they run.
  auto t = jinja::Template::Parse("\n{{ 'a'.zfill(3) }}");
  ASSERT_TRUE(t.ok()) << t.status();
  auto rendering = t->Render({});
  ASSERT_FALSE(rendering.ok());
  EXPECT_THAT(std::string(rendering.status().message()),
              HasSubstr("line 2: 'str object' has no attribute 'zfill'"));
}

// Where transformers 5 finds a directory's template: chat_template.jinja
// wins over tokenizer_config.json; a list of named templates gives
// "tool_use" to lines with tools and "default" to the rest.
TEST(LoadChatTemplateTest, FindsTheTemplateAsTransformersDoes) {
  const std::string dir = ::testing::TempDir() + "/chat-template-load";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto none = LoadChatTemplate(dir);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->has_value());

  nlohmann::json config = {
      {"bos_token", "<s>"},
      {"chat_template",
       {{{"name", "default"}, {"template", "D{{ bos_token }}"}},
        {{"name", "tool_use"}, {"template", "T{{ tools | length }}"}}}}};
  std::ofstream(dir + "/tokenizer_config.json") << config.dump();
  auto named = LoadChatTemplate(dir);
  ASSERT_TRUE(named.ok()) << named.status();
  ASSERT_TRUE(named->has_value());
  const ordered_json messages = ordered_json::array();
  EXPECT_EQ((*named)->Render(messages, {})->text, "D<s>");
  ChatRenderOptions with_tools;
  with_tools.tools = ordered_json::array({{{"type", "function"}}});
  EXPECT_EQ((*named)->Render(messages, with_tools)->text, "T1");

  std::ofstream(dir + "/chat_template.jinja") << "J\n";
  auto file = LoadChatTemplate(dir);
  ASSERT_TRUE(file.ok()) << file.status();
  ASSERT_TRUE(file->has_value());
  EXPECT_EQ((*file)->Render(messages, with_tools)->text, "J");

  std::ofstream(dir + "/chat_template.jinja") << "{% for %}";
  auto bad = LoadChatTemplate(dir);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr("chat_template.jinja: line 1: expected a name"));
}

// A template that generates without bound is stopped, not run out of
// memory.
TEST(JinjaTemplateTest, RunawayOutputIsAnError) {
  auto t = jinja::Template::Parse(
      "{% for i in range(1000000) %}{{ 'x' * 100 }}{% endfor %}");
  ASSERT_TRUE(t.ok()) << t.status();
  auto rendering = t->Render({});
  ASSERT_FALSE(rendering.ok());
  EXPECT_THAT(std::string(rendering.status().message()), HasSubstr("64 MiB"));
}

}  // namespace
}  // namespace loraplex
