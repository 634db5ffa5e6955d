// A parsed Jinja template of the chat-template subset, rendered as
// transformers renders chat templates (jinja2 with trim_blocks,
// lstrip_blocks and loop controls; `{% generation %}` spans recorded).
//
//   LORAPLEX_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::Parse(src));
//   LORAPLEX_ASSIGN_OR_RETURN(jinja::Rendering r, t.Render(variables));
//   // r.text, r.generation_spans
//
// Errors are INVALID_ARGUMENT with the template line:
//   "line 12: 'foo' is undefined", "line 3: the chat template raised an
//   error: Conversation roles must alternate user/assistant/...".
#ifndef LORAPLEX_CORE_JINJA_JINJA_TEMPLATE_H_
#define LORAPLEX_CORE_JINJA_JINJA_TEMPLATE_H_

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "core/jinja/jinja_ast.h"
#include "core/jinja/jinja_value.h"

namespace loraplex::jinja {

struct Rendering {
  std::string text;
  // Byte spans [first, second) of `text` that {% generation %} blocks wrote.
  std::vector<std::pair<size_t, size_t>> generation_spans;
};

class Template {
 public:
  static absl::StatusOr<Template> Parse(std::string_view source);

  // `variables` are the template's globals, next to the built-in functions.
  absl::StatusOr<Rendering> Render(
      const std::vector<std::pair<std::string, Value>>& variables) const;

  bool has_generation_blocks() const { return has_generation_; }

 private:
  std::shared_ptr<const Body> body_;
  bool has_generation_ = false;
};

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_TEMPLATE_H_
