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
#include "core/data/dataset_lines.h"

namespace loraplex {
namespace data_internal {

using nlohmann::json;

// Keeps one bad line from flooding the error (e.g. a huge unterminated
// string echoed back by the parser).
constexpr size_t kMaxParserReasonChars = 160;

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

}  // namespace data_internal

namespace {

using data_internal::Bad;
using data_internal::ExampleBuilder;
using data_internal::kChatTemplateKwargsKey;
using data_internal::kParseLabel;
using data_internal::kToolsKey;
using data_internal::kTurnsKey;
using data_internal::ParsedLine;
using data_internal::ParseMessages;
using data_internal::ParsePromptCompletion;
using data_internal::QuoteKey;
using data_internal::ShortParserReason;
using nlohmann::json;

// A line of a well-formed dataset is at most an object holding a list of
// objects; anything much deeper is garbage and must not be built.
constexpr int kMaxLineDepth = 8;

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
  std::vector<std::string> chat_options;  // Keys of chat lines only.
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (it.key() == kToolsKey || it.key() == kChatTemplateKwargsKey ||
        it.key() == kTurnsKey) {
      chat_options.push_back(it.key());
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
  for (const std::string& key : chat_options) {
    const bool fits =
        *kind == LineKind::kMessages ||
        (*kind == LineKind::kPromptCompletion && key != kTurnsKey);
    if (!fits) unknown.push_back(QuoteKey(key));
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
  return ParsedLine{{*std::move(example)}, false};
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

absl::StatusOr<std::vector<Example>> ParseJsonlLine(
    absl::string_view line, const Tokenizer& tokenizer,
    const DatasetParseOptions& options) {
  absl::ConsumeSuffix(&line, "\r");
  LORAPLEX_ASSIGN_OR_RETURN(ParsedLine parsed,
                            ParseLine(line, tokenizer, options));
  return std::move(parsed.examples);
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
    ++dataset.num_lines;
    if (parsed->examples.size() > 1) ++dataset.num_per_turn_lines;
    for (Example& example : parsed->examples) {
      dataset.num_tokens += static_cast<int64_t>(example.input_ids.size());
      for (uint8_t target : example.loss_mask) {
        dataset.num_target_tokens += target;
      }
      dataset.examples.push_back(std::move(example));
    }
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
