// Parses Jinja template source, as transformers' chat-template environment
// reads it (trim_blocks and lstrip_blocks on, one trailing newline dropped,
// loop controls enabled, plus transformers' {% generation %} tag), into the
// tree of jinja_ast.h.
//
//   LORAPLEX_ASSIGN_OR_RETURN(jinja::Body body, jinja::ParseTemplate(text));
//
// Constructs outside the subset (template inheritance, includes, imports,
// call blocks, raw blocks, filters or tests it does not define) are
// INVALID_ARGUMENT errors with the line and the construct's name:
//   "line 3: the tag "extends" is not supported"
//   "line 7: the filter "wordwrap" is not supported"
#ifndef LORAPLEX_CORE_CHAT_JINJA_PARSER_H_
#define LORAPLEX_CORE_CHAT_JINJA_PARSER_H_

#include <string_view>

#include "absl/status/statusor.h"
#include "core/chat/jinja_ast.h"

namespace loraplex::jinja {

absl::StatusOr<Body> ParseTemplate(std::string_view source);

// Whether the filter / test name is one the interpreter defines.
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_CHAT_JINJA_PARSER_H_
