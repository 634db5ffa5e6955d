#include "core/data/chat_example.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_builtins.h"

namespace loraplex {
namespace {

using nlohmann::ordered_json;

absl::Status Bad(absl::string_view reason) {
  return absl::InvalidArgumentError(reason);
}

ordered_json Slice(const ordered_json& messages, size_t count) {
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < count && i < messages.size(); ++i) {
    out.push_back(messages[i]);
  }
  return out;
}

absl::StatusOr<jinja::Rendering> Render(const ChatTemplate& chat,
                                        const ordered_json& messages,
                                        const ChatRenderOptions& extras,
                                        bool add_generation_prompt) {
  ChatRenderOptions options = extras;
  options.add_generation_prompt = add_generation_prompt;
  return chat.Render(messages, options);
}

// Position 0 is never a target (nothing before it predicts it); a line
// that trains nothing is an error.
absl::StatusOr<Example> Finish(TokenizerEncoding encoding,
                               std::vector<uint8_t> mask,
                               absl::string_view nothing_trained) {
  if (!mask.empty()) mask[0] = 0;
  if (std::find(mask.begin(), mask.end(), 1) == mask.end()) {
    return Bad(nothing_trained);
  }
  Example example;
  example.input_ids = std::move(encoding.ids);
  example.loss_mask = std::move(mask);
  return example;
}

// The span of assistant message i in `full` by rendering prefixes (see
// TemplateChatExample).
absl::StatusOr<std::pair<size_t, size_t>> PrefixSpan(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const ordered_json& messages, const ChatRenderOptions& extras, size_t i,
    const std::string& full, const TokenizerEncoding& full_encoding) {
  const std::string name = absl::StrCat("messages[", i, "]");
  absl::StatusOr<jinja::Rendering> before =
      Render(chat, Slice(messages, i), extras, /*add_generation_prompt=*/true);
  if (!before.ok()) {
    return Bad(absl::StrCat(
        name, ": rendering the conversation before it ",
        "(to find where it starts) failed: ", before.status().message()));
  }
  const std::string& prefix = before->text;
  if (!absl::StartsWith(full, prefix)) {
    return Bad(absl::StrCat(
        name,
        ": the chat template renders the conversation before this "
        "message differently from how it renders the whole "
        "conversation, so the message's tokens cannot be found by "
        "rendering prefixes (mark assistant text with {% generation %} "
        "blocks in the template)"));
  }
  absl::StatusOr<jinja::Rendering> through =
      Render(chat, Slice(messages, i + 1), extras, false);
  if (!through.ok()) {
    return Bad(absl::StrCat(name, ": rendering the conversation up to it ",
                            "failed: ", through.status().message()));
  }
  LORAPLEX_ASSIGN_OR_RETURN(TokenizerEncoding encoding,
                            tokenizer.EncodeWithOffsets(through->text));
  size_t common = 0;
  while (common < encoding.ids.size() && common < full_encoding.ids.size() &&
         encoding.ids[common] == full_encoding.ids[common] &&
         encoding.offsets[common] == full_encoding.offsets[common]) {
    ++common;
  }
  const size_t start = prefix.size();
  const size_t end = std::max<size_t>(
      start, common == 0 ? 0 : full_encoding.offsets[common - 1].end);
  const ordered_json& message = messages[i];
  auto content = message.find("content");
  if (content != message.end() && content->is_string()) {
    const std::string text =
        jinja::PythonStrip(content->get<std::string>(), nullptr, true, true);
    if (!text.empty() &&
        full.substr(start, end - start).find(text) == std::string::npos) {
      return Bad(absl::StrCat(
          name,
          ": its content is not where rendering prefixes puts it (the "
          "template renders this turn differently once later turns "
          "follow, as templates that drop past reasoning do); mark "
          "assistant text with {% generation %} blocks in the template, "
          "or train such turns as prompt/completion lines"));
    }
  }
  auto calls = message.find("tool_calls");
  if (calls != message.end() && calls->is_array() && !calls->empty() &&
      end == start) {
    return Bad(absl::StrCat(
        name,
        ": its tool calls are not where rendering prefixes puts them "
        "(the template renders this turn differently once later turns "
        "follow); mark assistant text with {% generation %} blocks"));
  }
  return std::make_pair(start, end);
}

}  // namespace

std::vector<uint8_t> OverlapMask(const TokenizerEncoding& encoding,
                                 const TextSpans& spans) {
  std::vector<uint8_t> mask(encoding.ids.size(), 0);
  for (size_t t = 0; t < encoding.offsets.size(); ++t) {
    const TextSpan& token = encoding.offsets[t];
    for (const auto& [a, b] : spans) {
      if (b > a && token.end > a && token.start < b) {
        mask[t] = 1;
        break;
      }
    }
  }
  return mask;
}

absl::StatusOr<Example> JointPromptCompletionExample(
    const Tokenizer& tokenizer, std::string_view prompt,
    std::string_view completion) {
  const std::string text = std::string(prompt) + std::string(completion);
  absl::StatusOr<TokenizerEncoding> encoding =
      tokenizer.EncodeWithOffsets(text);
  if (!encoding.ok()) return Bad(encoding.status().message());
  TokenizerEncoding out;
  std::vector<uint8_t> mask;
  if (std::optional<int64_t> bos = tokenizer.bos_id()) {
    out.ids.push_back(*bos);
    out.offsets.push_back({});
    mask.push_back(0);
  }
  for (size_t t = 0; t < encoding->ids.size(); ++t) {
    out.ids.push_back(encoding->ids[t]);
    out.offsets.push_back(encoding->offsets[t]);
    mask.push_back(encoding->offsets[t].end > prompt.size() ? 1 : 0);
  }
  out.ids.push_back(tokenizer.eos_id());
  out.offsets.push_back({});
  mask.push_back(1);
  return Finish(std::move(out), std::move(mask), "completion has no token");
}

namespace {

// TemplateChatExample for `full`, the whole conversation's rendering.
absl::StatusOr<Example> ExampleOfRendering(const ChatTemplate& chat,
                                           const Tokenizer& tokenizer,
                                           const ordered_json& messages,
                                           const ChatRenderOptions& extras,
                                           const std::vector<bool>& trained,
                                           const jinja::Rendering& full) {
  absl::StatusOr<TokenizerEncoding> encoding =
      tokenizer.EncodeWithOffsets(full.text);
  if (!encoding.ok()) return Bad(encoding.status().message());
  std::vector<size_t> assistants;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].value("role", "") == "assistant") assistants.push_back(i);
  }
  const bool all_trained =
      std::all_of(assistants.begin(), assistants.end(),
                  [&](size_t i) { return i < trained.size() && trained[i]; });
  TextSpans spans;
  if (chat.has_generation_blocks(!extras.tools.is_null())) {
    if (all_trained) {
      spans = full.generation_spans;
    } else if (full.generation_spans.size() != assistants.size()) {
      return Bad(absl::StrCat(
          "the chat template's {% generation %} blocks (",
          full.generation_spans.size(),
          ") do not pair one to one with the assistant messages (",
          assistants.size(), "), so per-message weights cannot be applied"));
    } else {
      for (size_t k = 0; k < assistants.size(); ++k) {
        if (trained[assistants[k]]) spans.push_back(full.generation_spans[k]);
      }
    }
  } else {
    for (size_t i : assistants) {
      if (i >= trained.size() || !trained[i]) continue;
      LORAPLEX_ASSIGN_OR_RETURN(
          auto span, PrefixSpan(chat, tokenizer, messages, extras, i, full.text,
                                *encoding));
      spans.push_back(span);
    }
  }
  std::vector<uint8_t> mask = OverlapMask(*encoding, spans);
  return Finish(*std::move(encoding), std::move(mask),
                "no token of a trained assistant message to learn from (the "
                "chat template renders them empty)");
}

}  // namespace

absl::StatusOr<Example> TemplateChatExample(const ChatTemplate& chat,
                                            const Tokenizer& tokenizer,
                                            const ordered_json& messages,
                                            const ChatRenderOptions& extras,
                                            const std::vector<bool>& trained) {
  LORAPLEX_ASSIGN_OR_RETURN(jinja::Rendering full,
                            Render(chat, messages, extras, false));
  return ExampleOfRendering(chat, tokenizer, messages, extras, trained, full);
}

absl::StatusOr<std::vector<Example>> PerTurnChatExamples(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const ordered_json& messages, const ChatRenderOptions& extras,
    const std::vector<bool>& trained) {
  std::vector<Example> examples;
  for (size_t i = 0; i < messages.size(); ++i) {
    if (messages[i].value("role", "") != "assistant" || i >= trained.size() ||
        !trained[i]) {
      continue;
    }
    const std::string name = absl::StrCat("messages[", i, "]");
    absl::StatusOr<jinja::Rendering> before = Render(
        chat, Slice(messages, i), extras, /*add_generation_prompt=*/true);
    if (!before.ok()) {
      return Bad(absl::StrCat(
          name, ": rendering the conversation before it ",
          "with the generation prompt failed: ", before.status().message()));
    }
    absl::StatusOr<jinja::Rendering> through =
        Render(chat, Slice(messages, i + 1), extras, false);
    if (!through.ok()) {
      return Bad(absl::StrCat(name, ": rendering the conversation up to it ",
                              "failed: ", through.status().message()));
    }
    absl::StatusOr<TokenizerEncoding> prompt =
        tokenizer.EncodeWithOffsets(before->text);
    if (!prompt.ok()) return Bad(prompt.status().message());
    absl::StatusOr<TokenizerEncoding> turn =
        tokenizer.EncodeWithOffsets(through->text);
    if (!turn.ok()) return Bad(turn.status().message());
    size_t common = 0;
    while (common < turn->ids.size() && common < prompt->ids.size() &&
           turn->ids[common] == prompt->ids[common] &&
           turn->offsets[common] == prompt->offsets[common]) {
      ++common;
    }
    std::vector<uint8_t> mask(turn->ids.size(), 0);
    std::fill(mask.begin() + common, mask.end(), 1);
    LORAPLEX_ASSIGN_OR_RETURN(
        Example example,
        Finish(*std::move(turn), std::move(mask),
               absl::StrCat(name,
                            ": the chat template renders no token for it "
                            "after the conversation before it")));
    examples.push_back(std::move(example));
  }
  if (examples.empty()) {
    return Bad("no assistant message is trained (all have weight 0)");
  }
  return examples;
}

absl::StatusOr<std::vector<Example>> TemplateChatExamples(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const ordered_json& messages, const ChatRenderOptions& extras,
    const std::vector<bool>& trained) {
  // A conversation the template cannot render fails the same either way.
  LORAPLEX_ASSIGN_OR_RETURN(jinja::Rendering full,
                            Render(chat, messages, extras, false));
  absl::StatusOr<Example> whole =
      ExampleOfRendering(chat, tokenizer, messages, extras, trained, full);
  if (whole.ok()) return std::vector<Example>{*std::move(whole)};
  // Generation blocks decide where a template has them.
  if (chat.has_generation_blocks(!extras.tools.is_null())) {
    return whole.status();
  }
  return PerTurnChatExamples(chat, tokenizer, messages, extras, trained);
}

absl::StatusOr<Example> TemplatePromptCompletionExample(
    const ChatTemplate& chat, const Tokenizer& tokenizer,
    const ordered_json& prompt, const ordered_json& completion,
    const ChatRenderOptions& extras) {
  absl::StatusOr<jinja::Rendering> head = Render(chat, prompt, extras, true);
  if (!head.ok()) {
    return Bad(absl::StrCat("prompt: ", head.status().message()));
  }
  ordered_json all = prompt;
  for (const auto& message : completion) all.push_back(message);
  LORAPLEX_ASSIGN_OR_RETURN(jinja::Rendering full,
                            Render(chat, all, extras, false));
  if (!absl::StartsWith(full.text, head->text)) {
    return Bad(
        "the chat template renders prompt + completion so that it does not "
        "start with the prompt's own rendering (with its generation prompt), "
        "so the completion cannot be located");
  }
  absl::StatusOr<TokenizerEncoding> encoding =
      tokenizer.EncodeWithOffsets(full.text);
  if (!encoding.ok()) return Bad(encoding.status().message());
  std::vector<uint8_t> mask(encoding->ids.size(), 0);
  for (size_t t = 0; t < mask.size(); ++t) {
    mask[t] = encoding->offsets[t].end > head->text.size() ? 1 : 0;
  }
  return Finish(*std::move(encoding), std::move(mask),
                "the completion renders to no token");
}

}  // namespace loraplex
