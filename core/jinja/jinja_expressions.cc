// The template parser's expressions (jinja_parser_internal.h), from the
// lowest precedence (tuples, conditionals) to primaries.
#include <cctype>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_parser.h"
#include "core/jinja/jinja_parser_internal.h"

namespace loraplex::jinja::parser_internal {

ExprPtr Parser::Make(Expr::Kind kind, int line) {
  auto e = std::make_unique<Expr>();
  e->kind = kind;
  e->line = line;
  return e;
}

// `a, b` without brackets makes a tuple (the right side of a set).
absl::StatusOr<ExprPtr> Parser::ParseTupleExpression() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
  if (!IsOp(",")) return first;
  ExprPtr list = Make(Expr::Kind::kList, first->line);
  list->tuple = true;
  list->items.push_back(std::move(first));
  while (AcceptOp(",")) {
    if (Peek().type == TokenType::kBlockEnd) break;
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
    list->items.push_back(std::move(item));
  }
  return list;
}

absl::StatusOr<ExprPtr> Parser::ParseExpression() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr value, ParseOr());
  while (IsName("if")) {
    const int line = Next().line;
    ExprPtr cond = Make(Expr::Kind::kCondition, line);
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr test, ParseOr());
    ExprPtr otherwise;
    if (AcceptName("else")) {
      LORAPLEX_ASSIGN_OR_RETURN(otherwise, ParseExpression());
    }
    cond->items.push_back(std::move(test));
    cond->items.push_back(std::move(value));
    cond->items.push_back(std::move(otherwise));
    value = std::move(cond);
  }
  return value;
}

absl::StatusOr<ExprPtr> Parser::Binary(std::string op, ExprPtr lhs,
                                       ExprPtr rhs) {
  ExprPtr e = Make(Expr::Kind::kBinary, lhs->line);
  e->name = std::move(op);
  e->items.push_back(std::move(lhs));
  e->items.push_back(std::move(rhs));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseOr() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseAnd());
  while (AcceptName("or")) {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseAnd());
    LORAPLEX_ASSIGN_OR_RETURN(lhs,
                              Binary("or", std::move(lhs), std::move(rhs)));
  }
  return lhs;
}

absl::StatusOr<ExprPtr> Parser::ParseAnd() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseNot());
  while (AcceptName("and")) {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseNot());
    LORAPLEX_ASSIGN_OR_RETURN(lhs,
                              Binary("and", std::move(lhs), std::move(rhs)));
  }
  return lhs;
}

absl::StatusOr<ExprPtr> Parser::ParseNot() {
  if (IsName("not")) {
    const int line = Next().line;
    ExprPtr e = Make(Expr::Kind::kNot, line);
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
    e->items.push_back(std::move(operand));
    return e;
  }
  return ParseCompare();
}

absl::StatusOr<ExprPtr> Parser::ParseCompare() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseMath1());
  ExprPtr chain;  // a < b < c is (a < b) and (b < c), b evaluated once
  while (true) {
    std::string op;
    if (Peek().type == TokenType::kOp &&
        (Peek().text == "==" || Peek().text == "!=" || Peek().text == "<" ||
         Peek().text == ">" || Peek().text == "<=" || Peek().text == ">=")) {
      op = Next().text;
    } else if (IsName("in")) {
      Next();
      op = "in";
    } else if (IsName("not") && IsName("in", 1)) {
      Next();
      Next();
      op = "not in";
    } else {
      break;
    }
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath1());
    if (chain == nullptr) {
      chain = Make(Expr::Kind::kCompare, lhs->line);
      chain->items.push_back(std::move(lhs));
    }
    chain->ops.push_back(std::move(op));
    chain->items.push_back(std::move(rhs));
  }
  if (chain == nullptr) return lhs;
  if (chain->ops.size() > 1) return chain;
  // One comparison is a plain binary operation.
  return Binary(chain->ops[0], std::move(chain->items[0]),
                std::move(chain->items[1]));
}

absl::StatusOr<ExprPtr> Parser::ParseMath1() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseConcat());
  while (IsOp("+") || IsOp("-")) {
    const std::string op = Next().text;
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseConcat());
    LORAPLEX_ASSIGN_OR_RETURN(lhs, Binary(op, std::move(lhs), std::move(rhs)));
  }
  return lhs;
}

absl::StatusOr<ExprPtr> Parser::ParseConcat() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseMath2());
  while (AcceptOp("~")) {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath2());
    LORAPLEX_ASSIGN_OR_RETURN(lhs, Binary("~", std::move(lhs), std::move(rhs)));
  }
  return lhs;
}

absl::StatusOr<ExprPtr> Parser::ParseMath2() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParsePow());
  while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
    const std::string op = Next().text;
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParsePow());
    LORAPLEX_ASSIGN_OR_RETURN(lhs, Binary(op, std::move(lhs), std::move(rhs)));
  }
  return lhs;
}

absl::StatusOr<ExprPtr> Parser::ParsePow() {
  LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseUnary(true));
  while (AcceptOp("**")) {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseUnary(true));
    LORAPLEX_ASSIGN_OR_RETURN(lhs,
                              Binary("**", std::move(lhs), std::move(rhs)));
  }
  return lhs;
}

// As Jinja: `-x|f` is f(-x), and filters and tests bind tighter than any
// binary operator.
absl::StatusOr<ExprPtr> Parser::ParseUnary(bool with_filters) {
  ExprPtr e;
  if (IsOp("-") || IsOp("+")) {
    const Token sign = Next();
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr operand, ParseUnary(false));
    if (sign.text == "-") {
      e = Make(Expr::Kind::kNegate, sign.line);
      e->items.push_back(std::move(operand));
    } else {
      e = std::move(operand);
    }
  } else {
    LORAPLEX_ASSIGN_OR_RETURN(e, ParsePrimary());
  }
  LORAPLEX_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
  if (!with_filters) return e;
  while (true) {
    if (AcceptOp("|")) {
      LORAPLEX_ASSIGN_OR_RETURN(e, ParseFilter(std::move(e)));
      continue;
    }
    if (IsName("is")) {
      LORAPLEX_ASSIGN_OR_RETURN(e, ParseTest(std::move(e)));
      continue;
    }
    return e;
  }
}

absl::StatusOr<ExprPtr> Parser::ParseFilter(ExprPtr operand) {
  const int line = Peek().line;
  LORAPLEX_ASSIGN_OR_RETURN(std::string name, ExpectName());
  while (AcceptOp(".")) {
    LORAPLEX_ASSIGN_OR_RETURN(std::string part, ExpectName());
    name += "." + part;
  }
  ExprPtr e = Make(Expr::Kind::kFilter, line);
  e->unknown = !IsKnownFilter(name);  // An error unless soft (CheckNames).
  e->name = std::move(name);
  e->items.push_back(std::move(operand));
  if (AcceptOp("(")) LORAPLEX_RETURN_IF_ERROR(ParseArguments(e.get()));
  LORAPLEX_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
  return e;
}

absl::StatusOr<ExprPtr> Parser::ParseTest(ExprPtr operand) {
  const int line = Next().line;  // "is"
  const bool negated = AcceptName("not");
  std::string name;
  if (Peek().type == TokenType::kName) {
    name = Next().text;
  } else if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") || IsOp("<=") ||
             IsOp(">=")) {
    name = Next().text;
  } else {
    return ErrorAt(line, absl::StrCat("expected a test name after \"is\", got ",
                                      Describe(Peek())));
  }
  ExprPtr e = Make(Expr::Kind::kTest, line);
  e->unknown = !IsKnownTest(name);  // An error unless soft (CheckNames).
  e->name = std::move(name);
  e->negated = negated;
  e->items.push_back(std::move(operand));
  if (AcceptOp("(")) {
    LORAPLEX_RETURN_IF_ERROR(ParseArguments(e.get()));
  } else if (Peek().type == TokenType::kString ||
             Peek().type == TokenType::kInt ||
             Peek().type == TokenType::kFloat || IsOp("[") || IsOp("{") ||
             (Peek().type == TokenType::kName && !IsName("and") &&
              !IsName("or") && !IsName("else") && !IsName("if") &&
              !IsName("is") && !IsName("in") && !IsName("not"))) {
    // `x is divisibleby 3`, `x is sameas false`: one bare argument.
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr arg, ParsePrimary());
    LORAPLEX_ASSIGN_OR_RETURN(arg, ParsePostfix(std::move(arg)));
    e->items.push_back(std::move(arg));
  }
  return e;
}

// After "(": arguments up to ")"; items after the callee / operand.
absl::Status Parser::ParseArguments(Expr* call) {
  while (!AcceptOp(")")) {
    if (Peek().type == TokenType::kName && IsOp("=", 1)) {
      std::string key = Next().text;
      Next();
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->keywords.emplace_back(std::move(key), std::move(value));
    } else {
      if (!call->keywords.empty()) {
        return ErrorAt(Peek().line,
                       "a positional argument follows a keyword argument");
      }
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
      call->items.push_back(std::move(value));
    }
    if (!IsOp(")")) LORAPLEX_RETURN_IF_ERROR(Expect(","));
  }
  return absl::OkStatus();
}

absl::StatusOr<ExprPtr> Parser::ParsePostfix(ExprPtr e) {
  while (true) {
    if (IsOp(".")) {
      const int line = Next().line;
      ExprPtr attr = Make(Expr::Kind::kAttribute, line);
      if (Peek().type == TokenType::kInt) {  // foo.0 is foo[0]
        attr->kind = Expr::Kind::kItem;
        ExprPtr index = Make(Expr::Kind::kLiteral, line);
        index->value = Value::Int(std::stoll(Next().text));
        attr->items.push_back(std::move(e));
        attr->items.push_back(std::move(index));
      } else {
        LORAPLEX_ASSIGN_OR_RETURN(attr->name, ExpectName());
        attr->items.push_back(std::move(e));
      }
      e = std::move(attr);
      continue;
    }
    if (IsOp("[")) {
      const int line = Next().line;
      ExprPtr parts[3];
      int colons = 0;
      while (!IsOp("]")) {
        if (AcceptOp(":")) {
          if (++colons > 2)
            return ErrorAt(line, "a slice has at most 2 colons");
          continue;
        }
        if (parts[colons] != nullptr) LORAPLEX_RETURN_IF_ERROR(Expect("]"));
        LORAPLEX_ASSIGN_OR_RETURN(parts[colons], ParseExpression());
      }
      Next();
      ExprPtr index =
          Make(colons > 0 ? Expr::Kind::kSlice : Expr::Kind::kItem, line);
      index->items.push_back(std::move(e));
      if (colons == 0) {
        if (parts[0] == nullptr) return ErrorAt(line, "empty subscript []");
        index->items.push_back(std::move(parts[0]));
      } else {
        for (ExprPtr& part : parts) index->items.push_back(std::move(part));
      }
      e = std::move(index);
      continue;
    }
    if (IsOp("(")) {
      const int line = Next().line;
      ExprPtr call = Make(Expr::Kind::kCall, line);
      call->items.push_back(std::move(e));
      LORAPLEX_RETURN_IF_ERROR(ParseArguments(call.get()));
      e = std::move(call);
      continue;
    }
    return e;
  }
}

absl::StatusOr<ExprPtr> Parser::ParsePrimary() {
  const Token t = Next();
  ExprPtr e = Make(Expr::Kind::kLiteral, t.line);
  switch (t.type) {
    case TokenType::kString: {
      std::string text = t.text;
      while (Peek().type == TokenType::kString) text += Next().text;
      e->value = Value::String(std::move(text));
      return e;
    }
    case TokenType::kInt:
      try {
        e->value = Value::Int(std::stoll(t.text));
      } catch (const std::exception&) {
        return ErrorAt(t.line,
                       absl::StrCat("integer ", t.text, " is too large"));
      }
      return e;
    case TokenType::kFloat:
      e->value = Value::Float(std::stod(t.text));
      return e;
    case TokenType::kName:
      if (t.text == "true" || t.text == "True") {
        e->value = Value::Bool(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value::Bool(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::None();
      } else {
        e->kind = Expr::Kind::kName;
        e->name = t.text;
      }
      return e;
    case TokenType::kOp:
      if (t.text == "(") {
        if (AcceptOp(")")) {
          e->kind = Expr::Kind::kList;
          e->tuple = true;
          return e;
        }
        LORAPLEX_ASSIGN_OR_RETURN(ExprPtr inner, ParseExpression());
        if (!IsOp(",")) {
          LORAPLEX_RETURN_IF_ERROR(Expect(")"));
          return inner;
        }
        e->kind = Expr::Kind::kList;
        e->tuple = true;
        e->items.push_back(std::move(inner));
        while (AcceptOp(",") && !IsOp(")")) {
          LORAPLEX_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
          e->items.push_back(std::move(item));
        }
        LORAPLEX_RETURN_IF_ERROR(Expect(")"));
        return e;
      }
      if (t.text == "[") {
        e->kind = Expr::Kind::kList;
        while (!AcceptOp("]")) {
          LORAPLEX_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
          e->items.push_back(std::move(item));
          if (!IsOp("]")) LORAPLEX_RETURN_IF_ERROR(Expect(","));
        }
        return e;
      }
      if (t.text == "{") {
        e->kind = Expr::Kind::kDict;
        while (!AcceptOp("}")) {
          LORAPLEX_ASSIGN_OR_RETURN(ExprPtr key, ParseExpression());
          LORAPLEX_RETURN_IF_ERROR(Expect(":"));
          LORAPLEX_ASSIGN_OR_RETURN(ExprPtr value, ParseExpression());
          e->items.push_back(std::move(key));
          e->items.push_back(std::move(value));
          if (!IsOp("}")) LORAPLEX_RETURN_IF_ERROR(Expect(","));
        }
        return e;
      }
      break;
    default:
      break;
  }
  return ErrorAt(t.line, absl::StrCat("unexpected ", Describe(t)));
}
}  // namespace loraplex::jinja::parser_internal
