// The parts of dataset.cc shared by its line parsers: how a line's error
// is worded, the example builder, and the chat lines' parsers
// (dataset_chat_lines.cc). Internal to core/data.
#ifndef LORAPLEX_CORE_DATA_DATASET_LINES_H_
#define LORAPLEX_CORE_DATA_DATASET_LINES_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/data/dataset.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex::data_internal {

// An optional key of "messages" and of conversational prompt/completion
// lines: the tool definitions the chat template renders.
inline constexpr absl::string_view kToolsKey = "tools";
// An optional key of the same lines: further template variables
// ({"enable_thinking": false}), as transformers passes **kwargs and vLLM's
// API names them.
inline constexpr absl::string_view kChatTemplateKwargsKey =
    "chat_template_kwargs";
// An optional key of "messages" lines: "all" (default) trains every
// assistant turn with weight 1, "last" only the final assistant turn.
inline constexpr absl::string_view kTurnsKey = "turns";

// Names a template variable may not have: each line sets them.
inline bool ReservedVariable(absl::string_view name) {
  return name == "messages" || name == "tools" ||
         name == "add_generation_prompt";
}

// A line's problem (INVALID_ARGUMENT; the caller adds the line number).
absl::Status Bad(absl::string_view reason);
// A user's key, escaped and shortened to fit on one line of an error.
std::string QuoteKey(const std::string& key);
// A ParseUntrustedJson error, short and printable.
std::string ShortParserReason(absl::string_view message);

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

struct ParsedLine {
  // One, or one per trained assistant turn (PerTurnChatExamples).
  std::vector<Example> examples;
  // A chat line in the built-in format (the base model has no template).
  bool builtin_chat = false;
};

// {"messages": [...]} (optionally "tools"); `text` is the line as written.
absl::StatusOr<ParsedLine> ParseMessages(const nlohmann::json& line,
                                         absl::string_view text,
                                         const Tokenizer& tokenizer,
                                         const DatasetParseOptions& options);
// {"prompt": str, "completion": str} tokenized as one text, or TRL's
// conversational form with lists of messages.
absl::StatusOr<ParsedLine> ParsePromptCompletion(
    const nlohmann::json& line, absl::string_view text,
    const Tokenizer& tokenizer, const DatasetParseOptions& options);

}  // namespace loraplex::data_internal

#endif  // LORAPLEX_CORE_DATA_DATASET_LINES_H_
