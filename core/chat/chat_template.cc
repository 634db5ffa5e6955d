#include "core/chat/chat_template.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/read_file.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/hf_tokenizer.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kReasoningFields[] = {"reasoning_content", "thinking",
                                            "reasoning"};
// A template file larger than this is not a chat template.
constexpr std::uintmax_t kMaxTemplateBytes = 1 << 20;

// transformers' message preparation: null-valued keys dropped, reasoning
// aliased under "thinking" (first) and "reasoning_content".
jinja::Value PrepareMessage(const nlohmann::ordered_json& message) {
  if (!message.is_object()) return jinja::Value::FromJson(message);
  auto dict = std::make_shared<jinja::Dict>();
  std::optional<nlohmann::ordered_json> reasoning;
  for (const char* field : kReasoningFields) {
    auto it = message.find(field);
    if (it != message.end() && !it->is_null()) {
      reasoning = *it;
      break;
    }
  }
  if (reasoning) dict->Set("thinking", jinja::Value::FromJson(*reasoning));
  for (auto it = message.begin(); it != message.end(); ++it) {
    if (!it->is_null()) dict->Set(it.key(), jinja::Value::FromJson(*it));
  }
  if (reasoning) {
    dict->Set("reasoning_content", jinja::Value::FromJson(*reasoning));
  }
  return jinja::Value::MakeDict(std::move(dict));
}

absl::StatusOr<std::string> ReadTemplateFile(const fs::path& path) {
  std::error_code error;
  const std::uintmax_t size = fs::file_size(path, error);
  if (error) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path.string(), ": ", error.message()));
  }
  if (size > kMaxTemplateBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        path.string(), ": ", size, " bytes is too large for a chat template"));
  }
  return ReadFile(path.string());
}

}  // namespace

absl::StatusOr<ChatTemplate> ChatTemplate::Parse(
    const std::map<std::string, std::string>& templates,
    const std::string& label,
    std::vector<std::pair<std::string, std::string>> special_tokens) {
  ChatTemplate chat;
  chat.label_ = label;
  chat.special_tokens_ = std::move(special_tokens);
  for (const auto& [name, source] : templates) {
    absl::StatusOr<jinja::Template> parsed = jinja::Template::Parse(source);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label,
          name == "default" ? "" : absl::StrCat(" (template \"", name, "\")"),
          ": ", parsed.status().message()));
    }
    chat.templates_.emplace(name, *std::move(parsed));
  }
  if (chat.templates_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(label, ": no template"));
  }
  return chat;
}

const jinja::Template* ChatTemplate::Pick(bool with_tools) const {
  // As transformers' get_chat_template: "tool_use" when tools are given,
  // else "default"; a lone template is used for everything.
  if (templates_.size() == 1) return &templates_.begin()->second;
  if (with_tools) {
    if (auto it = templates_.find("tool_use"); it != templates_.end()) {
      return &it->second;
    }
  }
  if (auto it = templates_.find("default"); it != templates_.end()) {
    return &it->second;
  }
  return nullptr;
}

bool ChatTemplate::has_generation_blocks(bool with_tools) const {
  const jinja::Template* t = Pick(with_tools);
  return t != nullptr && t->has_generation_blocks();
}

absl::StatusOr<jinja::Rendering> ChatTemplate::Render(
    const nlohmann::ordered_json& messages,
    const ChatRenderOptions& options) const {
  const bool with_tools = !options.tools.is_null();
  const jinja::Template* chosen = Pick(with_tools);
  if (chosen == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(label_, ": none of its named templates is \"default\"",
                     with_tools ? " or \"tool_use\"" : ""));
  }
  if (!messages.is_array()) {
    return absl::InvalidArgumentError("messages must be a list");
  }
  std::vector<jinja::Value> prepared;
  for (const auto& message : messages) {
    prepared.push_back(PrepareMessage(message));
  }
  std::vector<std::pair<std::string, jinja::Value>> variables;
  variables.emplace_back("messages", jinja::Value::List(std::move(prepared)));
  variables.emplace_back("tools", jinja::Value::FromJson(options.tools));
  variables.emplace_back("documents", jinja::Value::None());
  variables.emplace_back("add_generation_prompt",
                         jinja::Value::Bool(options.add_generation_prompt));
  for (const auto& [name, token] : special_tokens_) {
    variables.emplace_back(name, jinja::Value::String(token));
  }
  if (options.variables.is_object()) {
    for (auto it = options.variables.begin(); it != options.variables.end();
         ++it) {
      variables.emplace_back(it.key(), jinja::Value::FromJson(*it));
    }
  }
  absl::StatusOr<jinja::Rendering> rendering = chosen->Render(variables);
  if (!rendering.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the model's chat template (", label_,
                     ") failed: ", rendering.status().message()));
  }
  return rendering;
}

absl::StatusOr<std::optional<ChatTemplate>> LoadChatTemplate(
    const std::string& model_dir) {
  std::map<std::string, std::string> templates;
  std::string label;
  const fs::path dir(model_dir);
  const fs::path file = dir / kChatTemplateFile;
  const fs::path additional = dir / "additional_chat_templates";
  std::error_code error;
  // Template files win outright over tokenizer_config.json, as in
  // transformers.
  if (fs::exists(file)) {
    LORAPLEX_ASSIGN_OR_RETURN(templates["default"], ReadTemplateFile(file));
    label = file.string();
  }
  if (fs::is_directory(additional, error)) {
    std::vector<fs::path> extra;
    for (const auto& entry : fs::directory_iterator(additional, error)) {
      if (entry.path().extension() == ".jinja") extra.push_back(entry.path());
    }
    std::sort(extra.begin(), extra.end());
    for (const fs::path& path : extra) {
      LORAPLEX_ASSIGN_OR_RETURN(templates[path.stem().string()],
                                ReadTemplateFile(path));
    }
    if (label.empty() && !extra.empty()) label = additional.string();
  }
  const fs::path config_path = dir / "tokenizer_config.json";
  if (templates.empty() && fs::exists(config_path)) {
    LORAPLEX_ASSIGN_OR_RETURN(json config,
                              ReadUntrustedJsonFile(config_path.string()));
    label = config_path.string() + " chat_template";
    const json* chat = config.is_object() && config.contains("chat_template")
                           ? &config["chat_template"]
                           : nullptr;
    if (chat != nullptr && chat->is_string()) {
      templates["default"] = chat->get<std::string>();
    } else if (chat != nullptr && chat->is_array()) {
      for (size_t i = 0; i < chat->size(); ++i) {
        const json& entry = (*chat)[i];
        if (!entry.is_object() || !entry.contains("name") ||
            !entry.contains("template") || !entry["name"].is_string() ||
            !entry["template"].is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(
              label, "[", i, "] must be {\"name\": ..., \"template\": ...}"));
        }
        templates[entry["name"].get<std::string>()] =
            entry["template"].get<std::string>();
      }
    } else if (chat != nullptr && !chat->is_null()) {
      return absl::InvalidArgumentError(absl::StrCat(
          label, " must be a string or a list of named templates, got ",
          DescribeJson(*chat)));
    }
  }
  if (templates.empty()) return std::nullopt;
  LORAPLEX_ASSIGN_OR_RETURN(auto strings, ReadSpecialTokenStrings(model_dir));
  std::vector<std::pair<std::string, std::string>> special(strings.begin(),
                                                           strings.end());
  LORAPLEX_ASSIGN_OR_RETURN(ChatTemplate parsed,
                            ChatTemplate::Parse(templates, label, special));
  return std::optional<ChatTemplate>(std::move(parsed));
}

}  // namespace loraplex
