// Parses Jinja template source, as transformers' chat-template environment
// reads it (trim_blocks and lstrip_blocks on, one trailing newline dropped,
// loop controls enabled, plus transformers' {% generation %} tag), into the
// tree of jinja_ast.h.
//
//   LORAPLEX_ASSIGN_OR_RETURN(jinja::Body body, jinja::ParseTemplate(text));
//
// Constructs outside the subset (template inheritance, includes, imports,
// raw blocks, filters or tests it does not define) are INVALID_ARGUMENT
// errors with the line and the construct's name (an unknown filter or test
// inside an {% if %} fails only if it runs, as in jinja2):
//   "line 3: the tag "extends" is not supported"
//   "line 7: the filter "wordwrap" is not supported"
#ifndef LORAPLEX_CORE_JINJA_JINJA_PARSER_H_
#define LORAPLEX_CORE_JINJA_JINJA_PARSER_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "core/jinja/jinja_ast.h"

namespace loraplex::jinja {

absl::StatusOr<Body> ParseTemplate(std::string_view source);

// Whether the filter / test name is one the interpreter defines.
bool IsKnownFilter(std::string_view name);
bool IsKnownTest(std::string_view name);

// The error for a filter or test (`kind`) the subset lacks: that it is not
// supported, or where jinja2 lacks it too, jinja2's message ("No filter
// named 'x'." when parsed, "No filter named 'x' found." when `running`).
std::string UnknownNameMessage(std::string_view kind, std::string_view name,
                               bool running);

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_PARSER_H_
