// Chat lines of a dataset (dataset.h): "messages", and prompt/completion
// in its plain and conversational forms, rendered with the base model's
// chat template or loraplex's built-in format.
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/data/chat_example.h"
#include "core/data/dataset_lines.h"

namespace loraplex::data_internal {
namespace {

using nlohmann::json;

// What a chat line's messages say once checked: the role of each and
// whether it is a trained assistant turn (an empty one still learns to end
// its turn), and whether any trained turn has text.
struct CheckedMessages {
  std::vector<std::string> roles;
  std::vector<bool> trained;
  bool any_trained = false;
  bool any_trained_text = false;
};

// Message keys the model's own template may read (OpenAI's fine-tuning
// format, tool calls, reasoning); loraplex's built-in format has only
// role, content and weight.
constexpr absl::string_view kTemplateMessageKeys[] = {
    "role",     "content",    "weight",
    "name",     "tool_calls", "tool_call_id",
    "thinking", "reasoning",  "reasoning_content"};

bool IsTemplateMessageKey(absl::string_view key) {
  return std::find(std::begin(kTemplateMessageKeys),
                   std::end(kTemplateMessageKeys),
                   key) != std::end(kTemplateMessageKeys);
}

// Checks the messages of `field` ("messages", "prompt", "completion").
// With a template any role goes (the template decides) and content may be
// null beside tool calls; the built-in format has system, user and
// assistant turns with string content. weight (OpenAI's format) is 0 or 1
// on assistant messages: 0 keeps the turn as context only.
absl::StatusOr<CheckedMessages> CheckMessages(const json& messages,
                                              absl::string_view field,
                                              bool templated) {
  if (!messages.is_array() || messages.empty()) {
    return Bad(
        absl::StrCat(field, " must be a non-empty list, got ",
                     messages.is_array() ? "[]" : DescribeJson(messages)));
  }
  CheckedMessages checked;
  for (size_t index = 0; index < messages.size(); ++index) {
    const json& message = messages[index];
    const std::string name = absl::StrCat(field, "[", index, "]");
    if (!message.is_object()) {
      return Bad(absl::StrCat(name, " must be an object with \"role\" and ",
                              "\"content\", got ", DescribeJson(message)));
    }
    for (auto it = message.begin(); it != message.end(); ++it) {
      if (templated ? !IsTemplateMessageKey(it.key())
                    : it.key() != "role" && it.key() != "content" &&
                          it.key() != "weight") {
        return Bad(absl::StrCat(
            name, " has unknown key ", QuoteKey(it.key()),
            templated
                ? " (a message has role, content, weight, name, "
                  "tool_calls, tool_call_id and reasoning_content)"
                : " (a message has only \"role\", \"content\" and "
                  "\"weight\" when the base model has no chat template)"));
      }
    }
    if (!message.contains("role")) {
      return Bad(absl::StrCat(name, " has no \"role\""));
    }
    const json& role = message["role"];
    const std::string role_name =
        role.is_string() ? role.get<std::string>() : std::string();
    if (templated
            ? role_name.empty()
            : role_name != kChatRoleSystem && role_name != kChatRoleUser &&
                  role_name != kChatRoleAssistant) {
      return Bad(absl::StrCat(
          name, ".role must be ",
          templated
              ? std::string("a non-empty string")
              : absl::StrCat("one of \"", kChatRoleSystem, "\", \"",
                             kChatRoleUser, "\", \"", kChatRoleAssistant, "\""),
          "; got ", DescribeJson(role)));
    }
    const bool calls = message.contains("tool_calls");
    auto content = message.find("content");
    if (content == message.end() && !calls) {
      return Bad(absl::StrCat(name, " has no \"content\""));
    }
    if (content != message.end() && content->is_array()) {
      for (const json& part : *content) {
        const json* type =
            part.is_object() && part.contains("type") ? &part["type"] : nullptr;
        if (type != nullptr && type->is_string() &&
            absl::StrContains(type->get<std::string>(), "image")) {
          return Bad(absl::StrCat(
              name, ".content has an image part (type ", DescribeJson(*type),
              "): images are not supported, only text (a multimodal base "
              "model such as gemma3 trains its text model)"));
        }
      }
    }
    if (content != message.end() && !content->is_string() &&
        !(templated && content->is_null())) {
      return Bad(absl::StrCat(name, ".content must be a string",
                              templated ? " or null" : "", ", got ",
                              DescribeJson(*content)));
    }
    if (calls && !message["tool_calls"].is_array()) {
      return Bad(absl::StrCat(name, ".tool_calls must be a list, got ",
                              DescribeJson(message["tool_calls"])));
    }
    bool trained = role_name == kChatRoleAssistant;
    if (auto weight = message.find("weight"); weight != message.end()) {
      if (role_name != kChatRoleAssistant) {
        return Bad(absl::StrCat(name,
                                ".weight: only assistant messages have "
                                "a weight"));
      }
      if (!weight->is_number_integer() || (*weight != 0 && *weight != 1)) {
        return Bad(absl::StrCat(name, ".weight must be 0 or 1, got ",
                                DescribeJson(*weight)));
      }
      trained = *weight == 1;
    }
    const bool has_text = (content != message.end() && content->is_string() &&
                           !content->get_ref<const std::string&>().empty()) ||
                          (calls && !message["tool_calls"].empty());
    checked.trained.push_back(trained);
    checked.any_trained = checked.any_trained || trained;
    checked.any_trained_text =
        checked.any_trained_text || (trained && has_text);
    checked.roles.push_back(role_name);
  }
  return checked;
}

// A line as `parsed`, but with its keys in the order the user wrote them:
// chat templates show that order (tojson, items()), as Python's dicts do.
absl::StatusOr<nlohmann::ordered_json> InWrittenOrder(absl::string_view text) {
  try {
    return nlohmann::ordered_json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return Bad(
        absl::StrCat("not valid JSON (", ShortParserReason(e.what()), ")"));
  }
}

// The built-in chat format (dataset.h).
absl::StatusOr<Example> BuiltinChatExample(const json& messages,
                                           const CheckedMessages& checked,
                                           const Tokenizer& tokenizer) {
  ExampleBuilder builder(tokenizer);
  builder.AddBos();
  for (size_t i = 0; i < messages.size(); ++i) {
    const bool target = checked.trained[i];
    absl::Status status =
        builder.AddText(ChatRoleHeader(checked.roles[i]), false);
    if (status.ok()) {
      status = builder.AddText(
          messages[i]["content"].get_ref<const std::string&>(), target);
    }
    if (!status.ok()) return status;
    builder.AddEos(target);
  }
  return builder.Take();
}

constexpr absl::string_view kNothingTrained =
    " has no assistant turn with content and weight 1, so nothing would be "
    "trained";

bool Templated(const DatasetParseOptions& options) {
  return options.chat_template != nullptr || !options.chat_template_error.ok();
}

// Whether a chat line can be made: the model's template must be usable,
// and tools need one.
absl::Status CheckChatSetup(const json& line,
                            const DatasetParseOptions& options) {
  if (!options.chat_template_error.ok()) {
    return Bad(options.chat_template_error.message());
  }
  auto tools = line.find(std::string(kToolsKey));
  if (tools == line.end()) return absl::OkStatus();
  if (options.chat_template == nullptr) {
    return Bad("tools need the base model's chat template, and it has none");
  }
  if (!tools->is_null() && !tools->is_array()) {
    return Bad(absl::StrCat("tools must be a list of tool definitions, got ",
                            DescribeJson(*tools)));
  }
  return absl::OkStatus();
}

// What the line gives the template besides its messages: tools (null when
// absent) and chat_template_kwargs, the line's merged over the upload's key
// by key.
absl::StatusOr<ChatRenderOptions> RenderExtrasOf(
    const nlohmann::ordered_json& ordered, const ChatLineDefaults& defaults) {
  ChatRenderOptions extras;
  extras.variables = defaults.chat_template_kwargs;
  if (auto tools = ordered.find(kToolsKey); tools != ordered.end()) {
    extras.tools = *tools;
  }
  auto kwargs = ordered.find(kChatTemplateKwargsKey);
  if (kwargs == ordered.end() || kwargs->is_null()) return extras;
  if (!kwargs->is_object()) {
    return Bad(absl::StrCat(kChatTemplateKwargsKey,
                            " must be an object of template variables, got ",
                            DescribeJson(json(*kwargs))));
  }
  for (const auto& [name, value] : kwargs->items()) {
    if (ReservedVariable(name)) {
      return Bad(absl::StrCat(kChatTemplateKwargsKey, ".", name,
                              ": set by the line itself, not a template "
                              "variable"));
    }
    extras.variables[name] = value;
  }
  return extras;
}

// A chat_template_kwargs key needs the model's template.
absl::Status CheckKwargsNeedTemplate(const json& line,
                                     const DatasetParseOptions& options) {
  if (options.chat_template != nullptr) return absl::OkStatus();
  if (line.contains(std::string(kChatTemplateKwargsKey))) {
    return Bad(absl::StrCat(kChatTemplateKwargsKey,
                            " needs the base model's chat template, and it "
                            "has none"));
  }
  if (!options.chat_defaults.chat_template_kwargs.empty()) {
    return Bad(absl::StrCat("the upload's ", kChatTemplateKwargsKey,
                            " needs the base model's chat template, and it "
                            "has none"));
  }
  return absl::OkStatus();
}

// "turns": "all" (default) or "last": with "last" only the final assistant
// message can train. A line without the key takes the upload's.
absl::Status ApplyTurns(const json& line, const ChatLineDefaults& defaults,
                        const CheckedMessages& checked,
                        std::vector<bool>& trained) {
  auto turns = line.find(std::string(kTurnsKey));
  const json value = turns == line.end() ? json(defaults.turns) : *turns;
  if (value == "all") return absl::OkStatus();
  if (value != "last") {
    return Bad(absl::StrCat(kTurnsKey, " must be \"all\" or \"last\", got ",
                            DescribeJson(value)));
  }
  bool last = true;
  for (size_t i = trained.size(); i-- > 0;) {
    if (checked.roles[i] != kChatRoleAssistant) continue;
    if (!last) trained[i] = false;
    last = false;
  }
  if (std::find(trained.begin(), trained.end(), true) == trained.end()) {
    return Bad(absl::StrCat(kTurnsKey,
                            " is \"last\" but the last assistant message has "
                            "weight 0, so nothing would be trained"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ParsedLine> ParseMessages(const json& line,
                                         absl::string_view text,
                                         const Tokenizer& tokenizer,
                                         const DatasetParseOptions& options) {
  const bool templated = Templated(options);
  LORAPLEX_ASSIGN_OR_RETURN(
      CheckedMessages checked,
      CheckMessages(line["messages"], "messages", templated));
  // An assistant message with empty content still trains its end of turn.
  if (!checked.any_trained) {
    return Bad(
        "messages has no assistant turn with weight 1, so nothing would be "
        "trained");
  }
  std::vector<bool> trained = checked.trained;
  LORAPLEX_RETURN_IF_ERROR(
      ApplyTurns(line, options.chat_defaults, checked, trained));
  LORAPLEX_RETURN_IF_ERROR(CheckChatSetup(line, options));
  LORAPLEX_RETURN_IF_ERROR(CheckKwargsNeedTemplate(line, options));
  if (options.chat_template == nullptr) {
    checked.trained = trained;
    LORAPLEX_ASSIGN_OR_RETURN(
        Example example,
        BuiltinChatExample(line["messages"], checked, tokenizer));
    return ParsedLine{{std::move(example)}, true};
  }
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::ordered_json ordered,
                            InWrittenOrder(text));
  LORAPLEX_ASSIGN_OR_RETURN(ChatRenderOptions extras,
                            RenderExtrasOf(ordered, options.chat_defaults));
  LORAPLEX_ASSIGN_OR_RETURN(
      std::vector<Example> examples,
      TemplateChatExamples(*options.chat_template, tokenizer,
                           ordered["messages"], extras, trained));
  return ParsedLine{std::move(examples), false};
}

// {"prompt": str, "completion": str} tokenized as one text, or TRL's
// conversational form with lists of messages.
absl::StatusOr<ParsedLine> ParsePromptCompletion(
    const json& line, absl::string_view text, const Tokenizer& tokenizer,
    const DatasetParseOptions& options) {
  const json& prompt = line["prompt"];
  const json& completion = line["completion"];
  if (prompt.is_string() && completion.is_string()) {
    if (completion.get_ref<const std::string&>().empty()) {
      return Bad("completion must not be empty");
    }
    if (line.contains(std::string(kToolsKey))) {
      return Bad(
          "tools go with conversational prompt/completion (lists of "
          "messages), not with text");
    }
    LORAPLEX_ASSIGN_OR_RETURN(
        Example example, JointPromptCompletionExample(
                             tokenizer, prompt.get_ref<const std::string&>(),
                             completion.get_ref<const std::string&>()));
    return ParsedLine{{std::move(example)}, false};
  }
  if (!prompt.is_array() || !completion.is_array()) {
    for (const auto& [field, value] :
         {std::pair{"prompt", &prompt}, std::pair{"completion", &completion}}) {
      if (!value->is_string() && !value->is_array()) {
        return Bad(absl::StrCat(field,
                                " must be a string or a list of messages, got ",
                                DescribeJson(*value)));
      }
    }
    return Bad(absl::StrCat(
        "prompt and completion must be both strings or both lists of "
        "messages, got ",
        prompt.is_string() ? "a string and a list" : "a list and a string"));
  }
  const bool templated = Templated(options);
  LORAPLEX_ASSIGN_OR_RETURN(CheckedMessages prompt_checked,
                            CheckMessages(prompt, "prompt", templated));
  LORAPLEX_ASSIGN_OR_RETURN(CheckedMessages completion_checked,
                            CheckMessages(completion, "completion", templated));
  if (!completion_checked.any_trained_text) {
    return Bad(absl::StrCat("completion", kNothingTrained));
  }
  LORAPLEX_RETURN_IF_ERROR(CheckChatSetup(line, options));
  LORAPLEX_RETURN_IF_ERROR(CheckKwargsNeedTemplate(line, options));
  if (options.chat_template == nullptr) {
    // The built-in format: the conversation, trained on the completion.
    json messages = prompt;
    CheckedMessages checked = completion_checked;
    checked.roles.insert(checked.roles.begin(), prompt_checked.roles.begin(),
                         prompt_checked.roles.end());
    checked.trained.insert(checked.trained.begin(), prompt.size(), false);
    for (const json& message : completion) messages.push_back(message);
    LORAPLEX_ASSIGN_OR_RETURN(Example example,
                              BuiltinChatExample(messages, checked, tokenizer));
    return ParsedLine{{std::move(example)}, true};
  }
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::ordered_json ordered,
                            InWrittenOrder(text));
  LORAPLEX_ASSIGN_OR_RETURN(ChatRenderOptions extras,
                            RenderExtrasOf(ordered, options.chat_defaults));
  LORAPLEX_ASSIGN_OR_RETURN(
      Example example, TemplatePromptCompletionExample(
                           *options.chat_template, tokenizer, ordered["prompt"],
                           ordered["completion"], extras));
  return ParsedLine{{std::move(example)}, false};
}

}  // namespace loraplex::data_internal

namespace loraplex {

using data_internal::kChatTemplateKwargsKey;
using data_internal::kTurnsKey;
using nlohmann::json;

absl::StatusOr<ChatLineDefaults> ParseChatLineDefaults(
    absl::string_view kwargs_json, absl::string_view turns,
    absl::string_view field_prefix) {
  ChatLineDefaults defaults;
  if (!turns.empty()) {
    if (turns != "all" && turns != "last") {
      return absl::InvalidArgumentError(absl::StrCat(
          field_prefix, kTurnsKey, " must be \"all\" or \"last\", got ",
          DescribeJson(json(std::string(turns)))));
    }
    defaults.turns = std::string(turns);
  }
  if (kwargs_json.empty()) return defaults;
  const std::string field = absl::StrCat(field_prefix, kChatTemplateKwargsKey);
  absl::StatusOr<json> parsed = ParseUntrustedJson(kwargs_json, field);
  if (!parsed.ok()) return parsed.status();
  if (!parsed->is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " must be a JSON object of template variables, got ",
        DescribeJson(*parsed)));
  }
  // Key order as written: templates may show it (tojson, items()).
  defaults.chat_template_kwargs =
      nlohmann::ordered_json::parse(kwargs_json.begin(), kwargs_json.end());
  for (const auto& [name, value] : defaults.chat_template_kwargs.items()) {
    if (data_internal::ReservedVariable(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".", name, ": set by each line, not a template variable"));
    }
  }
  return defaults;
}

std::string ChatLineDefaultsToJson(const ChatLineDefaults& defaults) {
  nlohmann::ordered_json stored = nlohmann::ordered_json::object();
  stored[std::string(kChatTemplateKwargsKey)] = defaults.chat_template_kwargs;
  stored[std::string(kTurnsKey)] = defaults.turns;
  return stored.dump();
}

absl::StatusOr<ChatLineDefaults> ChatLineDefaultsFromJson(
    absl::string_view text) {
  const nlohmann::ordered_json stored =
      nlohmann::ordered_json::parse(text.begin(), text.end(), nullptr, false);
  if (stored.is_discarded() || !stored.is_object()) {
    return absl::DataLossError("stored chat line defaults are unreadable");
  }
  auto kwargs = stored.find(std::string(kChatTemplateKwargsKey));
  auto turns = stored.find(std::string(kTurnsKey));
  if (kwargs == stored.end() || turns == stored.end() || !turns->is_string()) {
    return absl::DataLossError("stored chat line defaults are unreadable");
  }
  return ParseChatLineDefaults(kwargs->dump(), turns->get<std::string>());
}

}  // namespace loraplex
