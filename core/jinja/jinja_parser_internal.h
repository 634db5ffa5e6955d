// The template parser's class (jinja_parser.h), shared by its two halves:
// statements (jinja_parser.cc) and expressions (jinja_expressions.cc).
// Internal to core/chat.
#ifndef LORAPLEX_CORE_JINJA_JINJA_PARSER_INTERNAL_H_
#define LORAPLEX_CORE_JINJA_JINJA_PARSER_INTERNAL_H_

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_ast.h"
#include "core/jinja/jinja_lexer.h"

namespace loraplex::jinja::parser_internal {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  absl::StatusOr<Body> ParseAll() {
    std::string end;
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({}, &end));
    return body;
  }

 private:
  const Token& Peek(size_t ahead = 0) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  Token Next() {
    Token t = Peek();
    if (index_ < tokens_.size() - 1) ++index_;
    return t;
  }
  bool IsOp(std::string_view op, size_t ahead = 0) const {
    return Peek(ahead).type == TokenType::kOp && Peek(ahead).text == op;
  }
  bool IsName(std::string_view name, size_t ahead = 0) const {
    return Peek(ahead).type == TokenType::kName && Peek(ahead).text == name;
  }
  bool AcceptOp(std::string_view op) {
    if (!IsOp(op)) return false;
    Next();
    return true;
  }
  bool AcceptName(std::string_view name) {
    if (!IsName(name)) return false;
    Next();
    return true;
  }
  std::string Describe(const Token& t) const {
    switch (t.type) {
      case TokenType::kEnd:
        return "the end of the template";
      case TokenType::kBlockEnd:
        return "%}";
      case TokenType::kVarEnd:
        return "}}";
      case TokenType::kText:
        return "text";
      case TokenType::kString:
        return "a string";
      default:
        return absl::StrCat("\"", t.text, "\"");
    }
  }
  absl::Status Expect(std::string_view op) {
    if (AcceptOp(op)) return absl::OkStatus();
    return ErrorAt(Peek().line, absl::StrCat("expected \"", std::string(op),
                                             "\", got ", Describe(Peek())));
  }
  absl::Status ExpectBlockEnd() {
    if (Peek().type == TokenType::kBlockEnd) {
      Next();
      return absl::OkStatus();
    }
    return ErrorAt(Peek().line,
                   absl::StrCat("expected %}, got ", Describe(Peek())));
  }
  absl::StatusOr<std::string> ExpectName() {
    if (Peek().type != TokenType::kName) {
      return ErrorAt(Peek().line,
                     absl::StrCat("expected a name, got ", Describe(Peek())));
    }
    return Next().text;
  }

  // `name, name=default, ...)` after a macro's or call block's "(": the
  // names into stmt.targets and their defaults (null: none) into
  // stmt.defaults.
  absl::Status ParseParameters(Stmt& stmt) {
    while (!AcceptOp(")")) {
      LORAPLEX_ASSIGN_OR_RETURN(std::string param, ExpectName());
      stmt.targets.push_back(param);
      ExprPtr fallback;
      if (AcceptOp("=")) {
        LORAPLEX_ASSIGN_OR_RETURN(fallback, ParseExpression());
      }
      stmt.defaults.push_back(std::move(fallback));
      if (!IsOp(")")) LORAPLEX_RETURN_IF_ERROR(Expect(","));
    }
    return absl::OkStatus();
  }

  // Statements up to one of `ends` (a block tag name, consumed with its
  // tag's opening; the caller reads the rest of the tag). No ends: to EOF.
  absl::StatusOr<Body> ParseBody(std::initializer_list<std::string_view> ends,
                                 std::string* end) {
    Body body;
    while (true) {
      const Token& t = Peek();
      if (t.type == TokenType::kEnd) {
        if (ends.size() == 0) return body;
        return ErrorAt(
            t.line, absl::StrCat("missing {% ", std::string(*(ends.end() - 1)),
                                 " %} before the end"));
      }
      if (t.type == TokenType::kText) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kText;
        stmt->line = t.line;
        stmt->text = Next().text;
        body.push_back(std::move(stmt));
        continue;
      }
      if (t.type == TokenType::kVarBegin) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::kOutput;
        stmt->line = Next().line;
        LORAPLEX_ASSIGN_OR_RETURN(stmt->expr, ParseExpression());
        if (Peek().type != TokenType::kVarEnd) {
          return ErrorAt(Peek().line,
                         absl::StrCat("expected }}, got ", Describe(Peek())));
        }
        Next();
        body.push_back(std::move(stmt));
        continue;
      }
      if (t.type != TokenType::kBlockBegin) {
        return ErrorAt(t.line, absl::StrCat("unexpected ", Describe(t)));
      }
      const Token& name = Peek(1);
      if (name.type != TokenType::kName) {
        return ErrorAt(name.line, "a tag must start with its name");
      }
      for (std::string_view e : ends) {
        if (name.text == e) {
          Next();
          *end = Next().text;
          return body;
        }
      }
      Next();
      LORAPLEX_ASSIGN_OR_RETURN(auto stmt, ParseStatement());
      body.push_back(std::move(stmt));
    }
  }

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement();
  // `a` or `a, b` (for and set targets; a parenthesised tuple too).
  absl::StatusOr<std::vector<std::string>> ParseTargets();
  ExprPtr Make(Expr::Kind kind, int line);
  // `a, b` without brackets makes a tuple (the right side of a set).
  absl::StatusOr<ExprPtr> ParseTupleExpression();
  absl::StatusOr<ExprPtr> ParseExpression();
  absl::StatusOr<ExprPtr> Binary(std::string op, ExprPtr lhs, ExprPtr rhs);
  absl::StatusOr<ExprPtr> ParseOr();
  absl::StatusOr<ExprPtr> ParseAnd();
  absl::StatusOr<ExprPtr> ParseNot();
  absl::StatusOr<ExprPtr> ParseCompare();
  absl::StatusOr<ExprPtr> ParseMath1();
  absl::StatusOr<ExprPtr> ParseConcat();
  absl::StatusOr<ExprPtr> ParseMath2();
  absl::StatusOr<ExprPtr> ParsePow();
  // As Jinja: `-x|f` is f(-x), and filters and tests bind tighter than any
  // binary operator.
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filters);
  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr operand);
  absl::StatusOr<ExprPtr> ParseTest(ExprPtr operand);
  // After "(": arguments up to ")"; items after the callee / operand.
  absl::Status ParseArguments(Expr* call);
  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e);
  absl::StatusOr<ExprPtr> ParsePrimary();

  std::vector<Token> tokens_;
  size_t index_ = 0;
};

}  // namespace loraplex::jinja::parser_internal

#endif  // LORAPLEX_CORE_JINJA_JINJA_PARSER_INTERNAL_H_
