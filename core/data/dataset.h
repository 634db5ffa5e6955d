// Training datasets in JSONL: one JSON object per line, turned into token
// ids and a per-token loss mask with the base model's tokenizer.
//
// Every line is checked before anything is returned, so a user sees all of
// the problems of a file at once ("line 3: text must be a string, got 3")
// instead of fixing them one upload at a time.
//
//   LORAPLEX_ASSIGN_OR_RETURN(Dataset dataset,
//                             LoadJsonlDataset(path, tokenizer));
//
// Line kinds (each line has the keys of exactly one kind, nothing else):
//   {"text": "..."}
//       [BOS] + Encode(text) + [EOS]; every token after the first is a
//       target. ([BOS] only where the tokenizer has one: Qwen2's has none.)
//   {"prompt": "...", "completion": "..."}
//       [BOS] + Encode(prompt + completion) + [EOS], tokenized as one text;
//       the tokens holding completion characters, and EOS, are targets.
//       The completion must not be empty.
//   {"messages": [{"role": ..., "content": ..., "weight": 0|1}, ...],
//    "tools": [...]}
//       With the model's chat template (chat_example.h): the text it
//       renders, trained on the assistant messages; weight 0 (OpenAI's
//       fine-tuning format) keeps a turn as context. Messages may then carry
//       tool_calls, tool_call_id, name and reasoning_content, and any role.
//       Without a template: the built-in format below (roles system, user,
//       assistant; no tools).
//   {"prompt": [messages], "completion": [messages], "tools": [...]}
//       TRL's conversational prompt/completion: rendered with the template,
//       trained on what the completion adds (built-in format without one).
//   {"input_ids": [...], "loss_mask": [...]}
//       Used as is: ids in [0, vocab_size) (the model's embedding rows when
//       DatasetParseOptions::vocab_size says), mask values 0 or 1, same length,
//       loss_mask[0] == 0 and at least one 1.
#ifndef LORAPLEX_CORE_DATA_DATASET_H_
#define LORAPLEX_CORE_DATA_DATASET_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/chat/chat_template.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {

// The built-in chat format, for base models without a chat template. A
// "messages" line becomes
//   [BOS]
//   + for each message: Encode(ChatRoleHeader(role)) + Encode(content) + [EOS]
// e.g. user "Hi", assistant "Yo" is BOS "<|user|>\nHi" EOS "<|assistant|>\nYo"
// EOS. Role headers are never targets, so the model learns to answer, not
// to write the markup; a prompt for generation ends with the assistant
// header.
inline constexpr absl::string_view kChatRoleOpen = "<|";
inline constexpr absl::string_view kChatRoleClose = "|>\n";
inline constexpr absl::string_view kChatRoleSystem = "system";
inline constexpr absl::string_view kChatRoleUser = "user";
inline constexpr absl::string_view kChatRoleAssistant = "assistant";

// "<|" + role + "|>\n".
std::string ChatRoleHeader(absl::string_view role);

// One training example: token ids and, per token, whether it is a training
// target (loss_mask[i] == 1: the model is trained to predict token i from
// tokens < i; position 0 can never be a target).
struct Example {
  std::vector<int64_t> input_ids;
  std::vector<uint8_t> loss_mask;
};

struct Dataset {
  std::vector<Example> examples;
  int64_t num_tokens = 0;         // Sum of input_ids sizes.
  int64_t num_target_tokens = 0;  // Sum of loss_mask.
  // Chat lines in the built-in format (the base model has no template).
  int64_t num_builtin_chat_lines = 0;
  // Non-blank lines, and those of them that became one example per trained
  // assistant turn.
  int64_t num_lines = 0;
  int64_t num_per_turn_lines = 0;
};

// What a dataset's upload sets for all of its chat lines
// (UploadDatasetHeader): a line's own keys override it.
struct ChatLineDefaults {
  // Template variables; a line's own chat_template_kwargs merge over them
  // key by key, the line's value winning.
  nlohmann::ordered_json chat_template_kwargs =
      nlohmann::ordered_json::object();
  // "all" or "last": which assistant turns of a "messages" line without a
  // "turns" key train.
  std::string turns = "all";
};

// The upload's values: `kwargs_json` empty or a JSON object of template
// variables, `turns` empty (all), "all" or "last". INVALID_ARGUMENT naming
// `field_prefix` + the field ("header.turns must be ...").
absl::StatusOr<ChatLineDefaults> ParseChatLineDefaults(
    absl::string_view kwargs_json, absl::string_view turns,
    absl::string_view field_prefix = "");
// As stored beside a dataset: {"chat_template_kwargs": {...}, "turns": ...},
// read back by ChatLineDefaultsFromJson.
std::string ChatLineDefaultsToJson(const ChatLineDefaults& defaults);
absl::StatusOr<ChatLineDefaults> ChatLineDefaultsFromJson(
    absl::string_view text);

struct DatasetParseOptions {
  // Bad lines listed in the error; further ones are only counted
  // ("... and 7 more bad lines"). Negative counts as 0.
  int max_reported_problems = 20;
  // input_ids lines may use ids below this: the model's embedding rows,
  // which can exceed the tokenizer's vocabulary. 0: the tokenizer's.
  int64_t vocab_size = 0;
  // The base model's chat template; null: chat lines use the built-in
  // format. Must outlive the parse.
  const ChatTemplate* chat_template = nullptr;
  // Why the model's template cannot be used (e.g. a Jinja construct the
  // subset lacks): chat lines fail with it, other lines are unaffected.
  absl::Status chat_template_error;
  // The upload's defaults for chat lines.
  ChatLineDefaults chat_defaults;
};

// One line of a JSONL dataset (a trailing '\r' is ignored), as training
// sees it: one example, or one per trained assistant turn for a chat
// template that is not prefix-stable (chat_example.h); INVALID_ARGUMENT
// with the reason, without a line number, when it is bad. Not for blank
// lines, which datasets skip.
absl::StatusOr<std::vector<Example>> ParseJsonlLine(
    absl::string_view line, const Tokenizer& tokenizer,
    const DatasetParseOptions& options = {});

// Parses JSONL text. A dataset with any bad line is rejected with
// INVALID_ARGUMENT whose message has a summary line and then "line N: reason"
// for each bad line (up to the cap), one per line. Blank or whitespace-only
// lines are skipped but still counted for line numbers; CRLF line ends and a
// leading UTF-8 byte order mark are accepted. No examples is an error.
absl::StatusOr<Dataset> ParseJsonlDataset(
    absl::string_view contents, const Tokenizer& tokenizer,
    const DatasetParseOptions& options = {});

// Reads the file at `path`, then parses it; every error starts with the
// path. NOT_FOUND when the file cannot be read.
absl::StatusOr<Dataset> LoadJsonlDataset(
    const std::string& path, const Tokenizer& tokenizer,
    const DatasetParseOptions& options = {});

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DATA_DATASET_H_
