// Splits Jinja template source into tokens as jinja2's lexer does with
// transformers' settings: text between tags with trim_blocks and
// lstrip_blocks applied, `-` whitespace control, newlines normalized and one
// trailing newline dropped; inside tags, names, literals (strings with
// Python's escapes) and operators. Comments are dropped.
#ifndef LORAPLEX_CORE_JINJA_JINJA_LEXER_H_
#define LORAPLEX_CORE_JINJA_JINJA_LEXER_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loraplex::jinja {

enum class TokenType {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEnd,
};

struct Token {
  TokenType type = TokenType::kEnd;
  std::string text;
  int line = 1;
};

// INVALID_ARGUMENT "line N: message", the form of every template error.
absl::Status ErrorAt(int line, std::string_view message);

// INVALID_ARGUMENT "line N: ..." for an unclosed tag, comment or string.
absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source);

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_LEXER_H_
