#include "core/chat/jinja_parser.h"

#include <cctype>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/chat/jinja_lexer.h"
#include "core/common/status_macros.h"

namespace loraplex::jinja {
namespace {

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

  absl::StatusOr<std::unique_ptr<Stmt>> ParseStatement() {
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
        "elif",   "else",     "endif",        "endfor",
        "endset", "endmacro", "endgeneration"};
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
  absl::StatusOr<std::vector<std::string>> ParseTargets() {
    std::vector<std::string> names;
    const bool paren = AcceptOp("(");
    do {
      LORAPLEX_ASSIGN_OR_RETURN(std::string name, ExpectName());
      names.push_back(std::move(name));
    } while (AcceptOp(","));
    if (paren) LORAPLEX_RETURN_IF_ERROR(Expect(")"));
    return names;
  }

  ExprPtr Make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  // `a, b` without brackets makes a tuple (the right side of a set).
  absl::StatusOr<ExprPtr> ParseTupleExpression() {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr first, ParseExpression());
    if (!IsOp(",")) return first;
    ExprPtr list = Make(Expr::Kind::kList, first->line);
    list->items.push_back(std::move(first));
    while (AcceptOp(",")) {
      if (Peek().type == TokenType::kBlockEnd) break;
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr item, ParseExpression());
      list->items.push_back(std::move(item));
    }
    return list;
  }

  absl::StatusOr<ExprPtr> ParseExpression() {
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

  absl::StatusOr<ExprPtr> Binary(std::string op, ExprPtr lhs, ExprPtr rhs) {
    ExprPtr e = Make(Expr::Kind::kBinary, lhs->line);
    e->name = std::move(op);
    e->items.push_back(std::move(lhs));
    e->items.push_back(std::move(rhs));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseOr() {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseAnd());
    while (AcceptName("or")) {
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseAnd());
      LORAPLEX_ASSIGN_OR_RETURN(lhs,
                                Binary("or", std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseAnd() {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseNot());
    while (AcceptName("and")) {
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseNot());
      LORAPLEX_ASSIGN_OR_RETURN(lhs,
                                Binary("and", std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseNot() {
    if (IsName("not")) {
      const int line = Next().line;
      ExprPtr e = Make(Expr::Kind::kNot, line);
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr operand, ParseNot());
      e->items.push_back(std::move(operand));
      return e;
    }
    return ParseCompare();
  }

  absl::StatusOr<ExprPtr> ParseCompare() {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseMath1());
    ExprPtr chain;  // a < b < c is (a < b) and (b < c)
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
      if (chain != nullptr) {
        return ErrorAt(rhs->line, "chained comparisons are not supported");
      }
      LORAPLEX_ASSIGN_OR_RETURN(chain,
                                Binary(op, std::move(lhs), std::move(rhs)));
    }
    return chain != nullptr ? std::move(chain) : std::move(lhs);
  }

  absl::StatusOr<ExprPtr> ParseMath1() {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseConcat());
    while (IsOp("+") || IsOp("-")) {
      const std::string op = Next().text;
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseConcat());
      LORAPLEX_ASSIGN_OR_RETURN(lhs,
                                Binary(op, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseConcat() {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParseMath2());
    while (AcceptOp("~")) {
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParseMath2());
      LORAPLEX_ASSIGN_OR_RETURN(lhs,
                                Binary("~", std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParseMath2() {
    LORAPLEX_ASSIGN_OR_RETURN(ExprPtr lhs, ParsePow());
    while (IsOp("*") || IsOp("/") || IsOp("//") || IsOp("%")) {
      const std::string op = Next().text;
      LORAPLEX_ASSIGN_OR_RETURN(ExprPtr rhs, ParsePow());
      LORAPLEX_ASSIGN_OR_RETURN(lhs,
                                Binary(op, std::move(lhs), std::move(rhs)));
    }
    return lhs;
  }

  absl::StatusOr<ExprPtr> ParsePow() {
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
  absl::StatusOr<ExprPtr> ParseUnary(bool with_filters) {
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

  absl::StatusOr<ExprPtr> ParseFilter(ExprPtr operand) {
    const int line = Peek().line;
    LORAPLEX_ASSIGN_OR_RETURN(std::string name, ExpectName());
    while (AcceptOp(".")) {
      LORAPLEX_ASSIGN_OR_RETURN(std::string part, ExpectName());
      name += "." + part;
    }
    if (!IsKnownFilter(name)) {
      return ErrorAt(
          line, absl::StrCat("the filter \"", name, "\" is not supported"));
    }
    ExprPtr e = Make(Expr::Kind::kFilter, line);
    e->name = std::move(name);
    e->items.push_back(std::move(operand));
    if (AcceptOp("(")) LORAPLEX_RETURN_IF_ERROR(ParseArguments(e.get()));
    LORAPLEX_ASSIGN_OR_RETURN(e, ParsePostfix(std::move(e)));
    return e;
  }

  absl::StatusOr<ExprPtr> ParseTest(ExprPtr operand) {
    const int line = Next().line;  // "is"
    const bool negated = AcceptName("not");
    std::string name;
    if (Peek().type == TokenType::kName) {
      name = Next().text;
    } else if (IsOp("==") || IsOp("!=") || IsOp("<") || IsOp(">") ||
               IsOp("<=") || IsOp(">=")) {
      name = Next().text;
    } else {
      return ErrorAt(line,
                     absl::StrCat("expected a test name after \"is\", got ",
                                  Describe(Peek())));
    }
    if (!IsKnownTest(name)) {
      return ErrorAt(line,
                     absl::StrCat("the test \"", name, "\" is not supported"));
    }
    ExprPtr e = Make(Expr::Kind::kTest, line);
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
  absl::Status ParseArguments(Expr* call) {
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

  absl::StatusOr<ExprPtr> ParsePostfix(ExprPtr e) {
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

  absl::StatusOr<ExprPtr> ParsePrimary() {
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
            return e;
          }
          LORAPLEX_ASSIGN_OR_RETURN(ExprPtr inner, ParseExpression());
          if (!IsOp(",")) {
            LORAPLEX_RETURN_IF_ERROR(Expect(")"));
            return inner;
          }
          e->kind = Expr::Kind::kList;
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

  std::vector<Token> tokens_;
  size_t index_ = 0;
};

}  // namespace

absl::StatusOr<Body> ParseTemplate(std::string_view source) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Token> tokens, LexTemplate(source));
  Parser parser(std::move(tokens));
  return parser.ParseAll();
}

}  // namespace loraplex::jinja
