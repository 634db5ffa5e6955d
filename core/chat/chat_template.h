// A model's own chat template (the Jinja `chat_template` Hugging Face
// checkpoints ship), rendered exactly as transformers'
// `apply_chat_template(..., tokenize=False)` renders it, so adapters train
// on the text vLLM, SGLang and transformers will prompt them with.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::optional<ChatTemplate> chat,
//                             LoadChatTemplate(model_dir));
//   if (chat) {
//     LORAPLEX_ASSIGN_OR_RETURN(jinja::Rendering r,
//                               chat->Render(messages, {}));
//   }
//
// As transformers does before rendering: message keys whose value is null
// are dropped, and a message's reasoning (`reasoning_content`, `thinking`
// or `reasoning`) is given under both `thinking` and `reasoning_content`.
// The template sees `messages`, `tools`, `documents` (null when not
// given), `add_generation_prompt`, the special tokens' strings
// (`bos_token`, `eos_token`, ... for those the tokenizer config names) and
// any extra variables, which override them.
#ifndef LORAPLEX_CORE_CHAT_CHAT_TEMPLATE_H_
#define LORAPLEX_CORE_CHAT_CHAT_TEMPLATE_H_

#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/jinja/jinja_template.h"

namespace loraplex {

inline constexpr std::string_view kChatTemplateFile = "chat_template.jinja";

struct ChatRenderOptions {
  bool add_generation_prompt = false;
  // The `tools` list (null: none; the template then sees tools = None).
  nlohmann::ordered_json tools;
  // More template variables, e.g. {"enable_thinking": false}.
  nlohmann::ordered_json variables = nlohmann::ordered_json::object();
};

class ChatTemplate {
 public:
  // `templates` maps names to sources ("default", and "tool_use" for a
  // template used when tools are given); `label` says where they came from
  // in errors; `special_tokens` are the bos_token, eos_token, ... strings.
  static absl::StatusOr<ChatTemplate> Parse(
      const std::map<std::string, std::string>& templates,
      const std::string& label,
      std::vector<std::pair<std::string, std::string>> special_tokens);

  // `messages` is a JSON list of message objects, in the key order the
  // user wrote them. INVALID_ARGUMENT when the template fails (e.g.
  // raise_exception), with its line and message.
  absl::StatusOr<jinja::Rendering> Render(
      const nlohmann::ordered_json& messages,
      const ChatRenderOptions& options) const;

  // Whether the template marks assistant text with {% generation %}.
  bool has_generation_blocks(bool with_tools) const;
  const std::string& label() const { return label_; }

 private:
  const jinja::Template* Pick(bool with_tools) const;

  std::map<std::string, jinja::Template> templates_;
  std::string label_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

// The chat template of a model directory, found as transformers finds it:
// `chat_template.jinja` (plus `additional_chat_templates/*.jinja`) when
// present, else tokenizer_config.json's `chat_template` (a string, or a
// list of {"name", "template"}). nullopt when the model has none;
// INVALID_ARGUMENT naming the file and the construct when it uses Jinja
// the subset lacks.
absl::StatusOr<std::optional<ChatTemplate>> LoadChatTemplate(
    const std::string& model_dir);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_CHAT_CHAT_TEMPLATE_H_
