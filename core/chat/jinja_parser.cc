#include "core/chat/jinja_parser.h"

#include <cctype>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_lexer.h"
#include "core/chat/jinja_parser_internal.h"
#include "core/common/status_macros.h"

namespace loraplex::jinja {
namespace parser_internal {

absl::StatusOr<std::unique_ptr<Stmt>> Parser::ParseStatement() {
  const Token tag = Next();
  auto stmt = std::make_unique<Stmt>();
  stmt->line = tag.line;
  std::string end;
  if (tag.text == "if") {
    stmt->kind = Stmt::Kind::kIf;
    while (true) {
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr condition, ParseExpression());
      stmt->conditions.push_back(std::move(condition));
      LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
      LORAPLEX_ASSIGN_OR_RETURN(Body body,
                                ParseBody({"elif", "else", "endif"}, &end));
      stmt->bodies.push_back(std::move(body));
      if (end == "elif") continue;
      LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
      if (end == "else") {
        LORAPLEX_ASSIGN_OR_RETURN(Body otherwise, ParseBody({"endif"}, &end));
        stmt->bodies.push_back(std::move(otherwise));
        LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
      }
      return stmt;
    }
  }
  if (tag.text == "for") {
    stmt->kind = Stmt::Kind::kFor;
    LORAPLEX_ASSIGN_OR_RETURN(stmt->targets, ParseTargets());
    if (!AcceptName("in")) {
      return ErrorAt(Peek().line, "expected \"in\" in a for tag");
    }
    LORAPLEX_ASSIGN_OR_RETURN(stmt->expr, ParseOr());
    if (AcceptName("if")) {
      LORAPLEX_ASSIGN_OR_RETURN(stmt->filter, ParseOr());
    }
    if (IsName("recursive")) {
      return ErrorAt(Peek().line, "recursive for loops are not supported");
    }
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({"else", "endfor"}, &end));
    stmt->bodies.push_back(std::move(body));
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    if (end == "else") {
      LORAPLEX_ASSIGN_OR_RETURN(Body otherwise, ParseBody({"endfor"}, &end));
      stmt->bodies.push_back(std::move(otherwise));
      LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    }
    return stmt;
  }
  if (tag.text == "set") {
    LORAPLEX_ASSIGN_OR_RETURN(stmt->targets, ParseTargets());
    if (stmt->targets.size() == 1 && AcceptOp(".")) {
      LORAPLEX_ASSIGN_OR_RETURN(stmt->attribute, ExpectName());
    }
    if (AcceptOp("=")) {
      stmt->kind = Stmt::Kind::kSet;
      LORAPLEX_ASSIGN_OR_RETURN(stmt->expr, ParseTupleExpression());
      LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
      return stmt;
    }
    if (stmt->targets.size() != 1 || !stmt->attribute.empty()) {
      return ErrorAt(tag.line, "a block set takes one plain name");
    }
    stmt->kind = Stmt::Kind::kSetBlock;
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({"endset"}, &end));
    stmt->bodies.push_back(std::move(body));
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    return stmt;
  }
  if (tag.text == "macro") {
    stmt->kind = Stmt::Kind::kMacro;
    LORAPLEX_ASSIGN_OR_RETURN(stmt->text, ExpectName());
    LORAPLEX_RETURN_IF_ERROR(Expect("("));
    while (!AcceptOp(")")) {
      LORAPLEX_ASSIGN_OR_RETURN(std::string param, ExpectName());
      stmt->targets.push_back(param);
      ExprPtr fallback;
      if (AcceptOp("=")) {
        LORAPLEX_ASSIGN_OR_RETURN(fallback, ParseExpression());
      }
      stmt->defaults.push_back(std::move(fallback));
      if (!IsOp(")")) LORAPLEX_RETURN_IF_ERROR(Expect(","));
    }
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({"endmacro"}, &end));
    stmt->bodies.push_back(std::move(body));
    if (Peek().type == TokenType::kName) Next();  // {% endmacro name %}
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    return stmt;
  }
  if (tag.text == "break" || tag.text == "continue") {
    stmt->kind =
        tag.text == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue;
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    return stmt;
  }
  if (tag.text == "generation") {
    stmt->kind = Stmt::Kind::kGeneration;
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({"endgeneration"}, &end));
    stmt->bodies.push_back(std::move(body));
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    return stmt;
  }
  static constexpr std::string_view kClosers[] = {
      "elif", "else", "endif", "endfor", "endset", "endmacro", "endgeneration"};
  for (std::string_view closer : kClosers) {
    if (tag.text == closer) {
      return ErrorAt(tag.line, absl::StrCat("{% ", tag.text,
                                            " %} without its opening tag"));
    }
  }
  return ErrorAt(tag.line,
                 absl::StrCat("the tag \"", tag.text, "\" is not supported"));
}

// `a` or `a, b` (for and set targets; a parenthesised tuple too).
absl::StatusOr<std::vector<std::string>> Parser::ParseTargets() {
  std::vector<std::string> names;
  const bool paren = AcceptOp("(");
  do {
    LORAPLEX_ASSIGN_OR_RETURN(std::string name, ExpectName());
    names.push_back(std::move(name));
  } while (AcceptOp(","));
  if (paren) LORAPLEX_RETURN_IF_ERROR(Expect(")"));
  return names;
}

}  // namespace parser_internal

absl::StatusOr<Body> ParseTemplate(std::string_view source) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Token> tokens, LexTemplate(source));
  parser_internal::Parser parser(std::move(tokens));
  return parser.ParseAll();
}

}  // namespace loraplex::jinja
