// Training examples whose loss mask follows character positions of one
// tokenized text: a chat rendered with the model's own template, and a
// prompt/completion pair tokenized as the single text prompt + completion
// (so the completion's first token is what the model sees at inference;
// tokenizing the pieces apart would, e.g., give SentencePiece's dummy
// space to the completion).
//
// A token is a target when its span overlaps a target span of the text:
// transformers' rule for `return_assistant_tokens_mask`.
//
//   LORAPLEX_ASSIGN_OR_RETURN(Example e,
//       TemplateChatExample(chat, tokenizer, messages, tools, trained));
#ifndef LORAPLEX_CORE_DATA_CHAT_EXAMPLE_H_
#define LORAPLEX_CORE_DATA_CHAT_EXAMPLE_H_

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/chat/chat_template.h"
#include "core/data/dataset.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {

using TextSpans = std::vector<std::pair<size_t, size_t>>;

// Per token of `encoding`, 1 when it overlaps one of the non-empty byte
// spans [first, second).
std::vector<uint8_t> OverlapMask(const TokenizerEncoding& encoding,
                                 const TextSpans& spans);

// [BOS] + tokens of prompt + completion + [EOS]; the tokens holding any
// completion byte, and EOS, are targets.
absl::StatusOr<Example> JointPromptCompletionExample(
    const Tokenizer& tokenizer, std::string_view prompt,
    std::string_view completion);

// `messages` rendered with `chat` (as apply_chat_template(tokenize=True):
// no special tokens besides the template's own), `extras` giving the tools
// and further template variables (its add_generation_prompt is ignored).
// Targets: the assistant messages i with trained[i]. Their text is found by the
// template's
// {% generation %} blocks (the k-th block is the k-th assistant message)
// or, without them, by rendering prefixes: message i spans from the end of
// the conversation before it plus the generation prompt to the last token
// that rendering messages[0..i] has in common with the whole conversation.
// Errors name the message ("messages[3]: ...") when its text cannot be
// located, e.g. for templates that render past turns differently.
absl::StatusOr<Example> TemplateChatExample(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const nlohmann::ordered_json& messages, const ChatRenderOptions& extras,
    const std::vector<bool>& trained);

// One example per trained assistant turn i, rendered as the model sees it
// at inference: ids = the tokens of messages[:i+1] rendered; targets = the
// tokens after their longest common prefix (same ids and offsets) with
// messages[:i] rendered with the generation prompt, to the end. For
// templates that render a turn differently once later turns follow (past
// reasoning dropped) or whose generation prompt opens a block a finished
// turn lacks (`<think>`). Errors name the message.
absl::StatusOr<std::vector<Example>> PerTurnChatExamples(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const nlohmann::ordered_json& messages, const ChatRenderOptions& extras,
    const std::vector<bool>& trained);

// The examples a conversation trains: TemplateChatExample's one where the
// template marks assistant text with {% generation %} blocks or renders
// every earlier turn the same whatever follows (the prefix rule places
// every trained turn); otherwise PerTurnChatExamples'.
absl::StatusOr<std::vector<Example>> TemplateChatExamples(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const nlohmann::ordered_json& messages, const ChatRenderOptions& extras,
    const std::vector<bool>& trained);

// TRL's conversational prompt/completion: the text prompt + completion
// renders to, trained from where the prompt with its generation prompt
// ends. Error when the whole rendering does not start with the prompt's.
absl::StatusOr<Example> TemplatePromptCompletionExample(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const nlohmann::ordered_json& prompt,
    const nlohmann::ordered_json& completion, const ChatRenderOptions& extras);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_DATA_CHAT_EXAMPLE_H_
