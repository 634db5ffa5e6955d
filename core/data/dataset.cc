#include "core/data/dataset.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "core/common/json_parse.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"
#include "core/data/chat_example.h"

namespace loraplex {
namespace {

using nlohmann::json;

// A line of a well-formed dataset is at most an object holding a list of
// objects; anything much deeper is garbage and must not be built.
constexpr int kMaxLineDepth = 8;
// Keeps one bad line from flooding the error (e.g. a huge unterminated
// string echoed back by the parser).
constexpr size_t kMaxParserReasonChars = 160;

// An optional key of "messages" and of conversational prompt/completion
// lines: the tool definitions the chat template renders.
constexpr absl::string_view kToolsKey = "tools";

constexpr absl::string_view kExpectedKinds =
    "\"text\", \"prompt\" and \"completion\", \"messages\", or \"input_ids\" "
    "and \"loss_mask\"";

enum class LineKind { kText, kPromptCompletion, kMessages, kTokens };

// The keys of one kind of line; `second` is empty for one-key kinds.
struct KindKeys {
  LineKind kind;
  absl::string_view first;
  absl::string_view second;
};

constexpr KindKeys kKinds[] = {
    {LineKind::kText, "text", ""},
    {LineKind::kPromptCompletion, "prompt", "completion"},
    {LineKind::kMessages, "messages", ""},
    {LineKind::kTokens, "input_ids", "loss_mask"},
};

std::vector<absl::string_view> KeysOf(LineKind kind) {
  for (const KindKeys& entry : kKinds) {
    if (entry.kind != kind) continue;
    if (entry.second.empty()) return {entry.first};
    return {entry.first, entry.second};
  }
  return {};
}

std::optional<LineKind> KindOfKey(absl::string_view key) {
  for (const KindKeys& entry : kKinds) {
    if (key == entry.first || (!entry.second.empty() && key == entry.second)) {
      return entry.kind;
    }
  }
  return std::nullopt;
}

// "\"prompt\" and \"completion\"".
std::string QuotedKeys(const std::vector<absl::string_view>& keys) {
  return absl::StrJoin(keys, " and ",
                       [](std::string* out, absl::string_view key) {
                         absl::StrAppend(out, "\"", key, "\"");
                       });
}

// Keys come from the user and may hold newlines, which would break the
// one-problem-per-line error format; DescribeJson escapes and shortens them.
std::string QuoteKey(const std::string& key) { return DescribeJson(json(key)); }

absl::Status Bad(absl::string_view reason) {
  return absl::InvalidArgumentError(reason);
}

// The label ParseUntrustedJson puts before its messages.
constexpr absl::string_view kParseLabel = "line";

// A ParseUntrustedJson error without its label and the parser's exception
// tag, in printable ASCII and bounded length, so it fits on one line of the
// dataset error.
std::string ShortParserReason(absl::string_view message) {
  absl::ConsumePrefix(&message, kParseLabel);
  absl::ConsumePrefix(&message, ": ");
  absl::ConsumePrefix(&message, "not valid JSON: ");
  if (absl::StartsWith(message, "[")) {
    size_t close = message.find("] ");
    if (close != absl::string_view::npos) message.remove_prefix(close + 2);
  }
  std::string reason;
  // Every line is parsed on its own, so the parser's line is always 1.
  if (absl::ConsumePrefix(&message, "parse error at line 1, ")) {
    reason = "parse error at ";
  }
  for (char c : message) {
    if (reason.size() >= kMaxParserReasonChars) {
      reason += "...";
      break;
    }
    reason.push_back(c >= 0x20 && c < 0x7f ? c : '?');
  }
  return reason;
}

// Appends tokens to an example, marking them as targets or context.
class ExampleBuilder {
 public:
  explicit ExampleBuilder(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {}

  // BOS, where the model starts sequences with one.
  void AddBos() {
    if (std::optional<int64_t> bos = tokenizer_.bos_id()) Add(*bos, false);
  }
  void AddEos(bool target) { Add(tokenizer_.eos_id(), target); }
  absl::Status AddText(std::string_view text, bool target) {
    absl::StatusOr<std::vector<int64_t>> ids = tokenizer_.Encode(text);
    if (!ids.ok()) return Bad(ids.status().message());
    for (int64_t id : *ids) Add(id, target);
    return absl::OkStatus();
  }
  // The first token is never a target: nothing before it predicts it.
  Example Take() {
    if (!example_.loss_mask.empty()) example_.loss_mask[0] = 0;
    return std::move(example_);
  }

 private:
  void Add(int64_t id, bool target) {
    example_.input_ids.push_back(id);
    example_.loss_mask.push_back(target ? 1 : 0);
  }

  const Tokenizer& tokenizer_;
  Example example_;
};

absl::Status RequireString(const json& value, absl::string_view name) {
  if (value.is_string()) return absl::OkStatus();
  return Bad(
      absl::StrCat(name, " must be a string, got ", DescribeJson(value)));
}

absl::StatusOr<Example> ParseText(const json& line,
                                  const Tokenizer& tokenizer) {
  const json& text = line["text"];
  absl::Status status = RequireString(text, "text");
  if (!status.ok()) return status;
  if (text.get_ref<const std::string&>().empty()) {
    return Bad("text must not be empty");
  }
  ExampleBuilder builder(tokenizer);
  builder.AddBos();
  status = builder.AddText(text.get_ref<const std::string&>(), true);
  if (!status.ok()) return status;
  builder.AddEos(true);
  return builder.Take();
}

// What a chat line's messages say once checked: the role of each and
// whether it is a trained assistant turn (an empty one still learns to end
// its turn), and whether any trained turn has text.
struct CheckedMessages {
  std::vector<std::string> roles;
  std::vector<bool> trained;
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

struct ParsedLine {
  Example example;
  // A chat line in the built-in format (the base model has no template).
  bool builtin_chat = false;
};

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

// The line's tools as written (null when absent).
nlohmann::ordered_json ToolsOf(const nlohmann::ordered_json& ordered) {
  auto tools = ordered.find(kToolsKey);
  return tools == ordered.end() ? nlohmann::ordered_json() : *tools;
}

absl::StatusOr<ParsedLine> ParseMessages(const json& line,
                                         absl::string_view text,
                                         const Tokenizer& tokenizer,
                                         const DatasetParseOptions& options) {
  const bool templated = Templated(options);
  LORAPLEX_ASSIGN_OR_RETURN(
      CheckedMessages checked,
      CheckMessages(line["messages"], "messages", templated));
  if (!checked.any_trained_text) {
    return Bad(absl::StrCat("messages", kNothingTrained));
  }
  LORAPLEX_RETURN_IF_ERROR(CheckChatSetup(line, options));
  if (options.chat_template == nullptr) {
    LORAPLEX_ASSIGN_OR_RETURN(
        Example example,
        BuiltinChatExample(line["messages"], checked, tokenizer));
    return ParsedLine{std::move(example), true};
  }
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::ordered_json ordered,
                            InWrittenOrder(text));
  LORAPLEX_ASSIGN_OR_RETURN(
      Example example, TemplateChatExample(*options.chat_template, tokenizer,
                                           ordered["messages"],
                                           ToolsOf(ordered), checked.trained));
  return ParsedLine{std::move(example), false};
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
    return ParsedLine{std::move(example), false};
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
    return ParsedLine{std::move(example), true};
  }
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::ordered_json ordered,
                            InWrittenOrder(text));
  LORAPLEX_ASSIGN_OR_RETURN(
      Example example, TemplatePromptCompletionExample(
                           *options.chat_template, tokenizer, ordered["prompt"],
                           ordered["completion"], ToolsOf(ordered)));
  return ParsedLine{std::move(example), false};
}

// An integer in int64 range, else nullopt.
std::optional<int64_t> AsInt64(const json& value) {
  if (!value.is_number_integer()) return std::nullopt;
  if (value.is_number_unsigned()) {
    uint64_t wide = value.get<uint64_t>();
    if (wide > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return std::nullopt;
    }
    return static_cast<int64_t>(wide);
  }
  return value.get<int64_t>();
}

absl::StatusOr<Example> ParseTokens(const json& line, int64_t vocab_size) {
  const json& ids = line["input_ids"];
  const json& mask = line["loss_mask"];
  if (!ids.is_array() || ids.empty()) {
    return Bad(absl::StrCat("input_ids must be a non-empty list of integers, ",
                            "got ", ids.is_array() ? "[]" : DescribeJson(ids)));
  }
  if (!mask.is_array()) {
    return Bad(absl::StrCat("loss_mask must be a list of 0 and 1, got ",
                            DescribeJson(mask)));
  }
  if (mask.size() != ids.size()) {
    return Bad(absl::StrCat("loss_mask has ", mask.size(),
                            " values but input_ids has ", ids.size()));
  }
  Example example;
  example.input_ids.reserve(ids.size());
  example.loss_mask.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    std::optional<int64_t> id = AsInt64(ids[i]);
    if (!id.has_value() || *id < 0 || *id >= vocab_size) {
      return Bad(absl::StrCat("input_ids[", i, "] must be an integer in [0, ",
                              vocab_size, "), got ", DescribeJson(ids[i])));
    }
    example.input_ids.push_back(*id);
  }
  int64_t targets = 0;
  for (size_t i = 0; i < mask.size(); ++i) {
    std::optional<int64_t> value = AsInt64(mask[i]);
    if (!value.has_value() || (*value != 0 && *value != 1)) {
      return Bad(absl::StrCat("loss_mask[", i, "] must be 0 or 1, got ",
                              DescribeJson(mask[i])));
    }
    example.loss_mask.push_back(static_cast<uint8_t>(*value));
    targets += *value;
  }
  if (example.loss_mask[0] != 0) {
    return Bad(
        "loss_mask[0] must be 0: the first token has nothing before it to be "
        "predicted from");
  }
  if (targets == 0) {
    return Bad("loss_mask has no 1, so the line has no target tokens");
  }
  return example;
}

// Which kind of line `object` is, from its keys; the error names the stray,
// mixed or missing keys.
absl::StatusOr<LineKind> ClassifyLine(const json& object) {
  std::optional<LineKind> kind;
  std::string first_key;
  std::vector<std::string> unknown;
  bool has_tools = false;
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it.key() == kToolsKey) {
      has_tools = true;
      continue;
    }
    std::optional<LineKind> key_kind = KindOfKey(it.key());
    if (!key_kind.has_value()) {
      unknown.push_back(QuoteKey(it.key()));
    } else if (!kind.has_value()) {
      kind = key_kind;
      first_key = it.key();
    } else if (*kind != *key_kind) {
      return Bad(absl::StrCat(
          "mixes keys of two kinds: \"", first_key, "\" and \"", it.key(),
          "\"; a line has exactly one of ", kExpectedKinds));
    }
  }
  if (!kind.has_value()) {
    return Bad(absl::StrCat(
        "has no recognised keys (expected ", kExpectedKinds, "), got ",
        unknown.empty() ? "an empty object" : absl::StrJoin(unknown, ", ")));
  }
  const std::vector<absl::string_view> keys = KeysOf(*kind);
  if (has_tools && *kind != LineKind::kMessages &&
      *kind != LineKind::kPromptCompletion) {
    unknown.push_back(QuoteKey(std::string(kToolsKey)));
  }
  if (!unknown.empty()) {
    return Bad(absl::StrCat("has unknown key", unknown.size() > 1 ? "s " : " ",
                            absl::StrJoin(unknown, ", "), " (a line with \"",
                            first_key, "\" has only ", QuotedKeys(keys), ")"));
  }
  for (absl::string_view key : keys) {
    if (!object.contains(std::string(key))) {
      return Bad(absl::StrCat("has no \"", key, "\" (a line with \"", first_key,
                              "\" needs ", QuotedKeys(keys), ")"));
    }
  }
  return *kind;
}

absl::StatusOr<ParsedLine> ParseLine(absl::string_view text,
                                     const Tokenizer& tokenizer,
                                     const DatasetParseOptions& options) {
  const int64_t vocab_size =
      options.vocab_size > 0 ? options.vocab_size : tokenizer.vocab_size();
  JsonParseOptions parse_options;
  parse_options.max_depth = kMaxLineDepth;
  parse_options.reject_duplicate_top_level_keys = true;
  absl::StatusOr<json> parsed =
      ParseUntrustedJson(text, std::string(kParseLabel), parse_options);
  if (!parsed.ok()) {
    const absl::string_view message = parsed.status().message();
    // Syntax errors get a prefix; too deep and duplicate keys explain
    // themselves.
    if (absl::StrContains(message, "not valid JSON: ")) {
      return Bad(
          absl::StrCat("not valid JSON (", ShortParserReason(message), ")"));
    }
    return Bad(ShortParserReason(message));
  }
  const json& line = *parsed;
  if (!line.is_object()) {
    return Bad(absl::StrCat("must be a JSON object, got ", DescribeJson(line)));
  }
  absl::StatusOr<LineKind> kind = ClassifyLine(line);
  if (!kind.ok()) return kind.status();
  absl::StatusOr<Example> example;
  switch (*kind) {
    case LineKind::kText:
      example = ParseText(line, tokenizer);
      break;
    case LineKind::kPromptCompletion:
      return ParsePromptCompletion(line, text, tokenizer, options);
    case LineKind::kMessages:
      return ParseMessages(line, text, tokenizer, options);
    case LineKind::kTokens:
      example = ParseTokens(line, vocab_size);
      break;
  }
  if (!example.ok()) return example.status();
  return ParsedLine{*std::move(example), false};
  return Bad("has no recognised kind");
}

bool IsBlank(absl::string_view line) {
  for (char c : line) {
    if (c != ' ' && c != '\t' && c != '\r') return false;
  }
  return true;
}

}  // namespace

std::string ChatRoleHeader(absl::string_view role) {
  return absl::StrCat(kChatRoleOpen, role, kChatRoleClose);
}

absl::StatusOr<Example> ParseJsonlLine(absl::string_view line,
                                       const Tokenizer& tokenizer,
                                       const DatasetParseOptions& options) {
  absl::ConsumeSuffix(&line, "\r");
  LORAPLEX_ASSIGN_OR_RETURN(ParsedLine parsed,
                            ParseLine(line, tokenizer, options));
  return std::move(parsed.example);
}

absl::StatusOr<Dataset> ParseJsonlDataset(absl::string_view contents,
                                          const Tokenizer& tokenizer,
                                          const DatasetParseOptions& options) {
  // Editors on Windows often start UTF-8 files with a byte order mark.
  absl::ConsumePrefix(&contents, "\xEF\xBB\xBF");
  const int64_t max_reported =
      std::max<int64_t>(0, options.max_reported_problems);
  Dataset dataset;
  std::vector<std::string> problems;
  int64_t num_bad = 0;
  int64_t line_number = 0;
  size_t begin = 0;
  while (begin < contents.size()) {
    size_t end = contents.find('\n', begin);
    if (end == absl::string_view::npos) end = contents.size();
    absl::string_view line = contents.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (IsBlank(line)) continue;
    absl::ConsumeSuffix(&line, "\r");
    absl::StatusOr<ParsedLine> parsed = ParseLine(line, tokenizer, options);
    if (!parsed.ok()) {
      if (num_bad++ < max_reported) {
        problems.push_back(absl::StrCat("line ", line_number, ": ",
                                        parsed.status().message()));
      }
      continue;
    }
    // Once a line is bad nothing is returned, so stop keeping examples.
    if (num_bad > 0) continue;
    if (parsed->builtin_chat) ++dataset.num_builtin_chat_lines;
    Example* example = &parsed->example;
    dataset.num_tokens += static_cast<int64_t>(example->input_ids.size());
    for (uint8_t target : example->loss_mask) {
      dataset.num_target_tokens += target;
    }
    dataset.examples.push_back(*std::move(example));
  }
  if (num_bad > 0) {
    std::string message =
        absl::StrCat("dataset has ", num_bad, " bad line",
                     num_bad == 1 ? "" : "s", " (nothing was loaded):");
    for (const std::string& problem : problems) {
      absl::StrAppend(&message, "\n", problem);
    }
    if (num_bad > max_reported) {
      const int64_t more = num_bad - max_reported;
      absl::StrAppend(&message, "\n... and ", more, " more bad line",
                      more == 1 ? "" : "s");
    }
    return absl::InvalidArgumentError(message);
  }
  if (dataset.examples.empty()) {
    return absl::InvalidArgumentError(
        line_number == 0 ? std::string("dataset is empty")
                         : absl::StrCat("dataset has no examples: all ",
                                        line_number, " lines are blank"));
  }
  return dataset;
}

absl::StatusOr<Dataset> LoadJsonlDataset(const std::string& path,
                                         const Tokenizer& tokenizer,
                                         const DatasetParseOptions& options) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": is a directory, not a JSONL file"));
  }
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  }
  absl::StatusOr<Dataset> dataset =
      ParseJsonlDataset(*text, tokenizer, options);
  if (!dataset.ok()) {
    return absl::Status(dataset.status().code(),
                        absl::StrCat(path, ": ", dataset.status().message()));
  }
  return dataset;
}

}  // namespace loraplex
