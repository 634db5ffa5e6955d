#include "core/jinja/jinja_parser.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_lexer.h"
#include "core/jinja/jinja_parser_internal.h"

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
    stmt->recursive = AcceptName("recursive");
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
    LORAPLEX_RETURN_IF_ERROR(ParseParameters(*stmt));
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({"endmacro"}, &end));
    stmt->bodies.push_back(std::move(body));
    if (Peek().type == TokenType::kName) Next();  // {% endmacro name %}
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    return stmt;
  }
  if (tag.text == "call") {
    stmt->kind = Stmt::Kind::kCallBlock;
    if (AcceptOp("(")) {  // The caller's own parameters.
      LORAPLEX_RETURN_IF_ERROR(ParseParameters(*stmt));
    }
    LORAPLEX_ASSIGN_OR_RETURN(stmt->expr, ParseExpression());
    if (stmt->expr->kind != Expr::Kind::kCall) {
      return ErrorAt(tag.line, "expected call");
    }
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({"endcall"}, &end));
    stmt->bodies.push_back(std::move(body));
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    return stmt;
  }
  if (tag.text == "filter") {
    stmt->kind = Stmt::Kind::kFilterBlock;
    ExprPtr body_text = Make(Expr::Kind::kName, tag.line);
    body_text->name = kFilterBlockBody;
    LORAPLEX_ASSIGN_OR_RETURN(stmt->expr, ParseFilter(std::move(body_text)));
    while (AcceptOp("|")) {
      LORAPLEX_ASSIGN_OR_RETURN(stmt->expr, ParseFilter(std::move(stmt->expr)));
    }
    LORAPLEX_RETURN_IF_ERROR(ExpectBlockEnd());
    LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseBody({"endfilter"}, &end));
    stmt->bodies.push_back(std::move(body));
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
      "elif",     "else",          "endif",   "endfor",   "endset",
      "endmacro", "endgeneration", "endcall", "endfilter"};
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

namespace {

// jinja2 3.1's own filters and tests: a name the subset lacks but jinja2
// has is "not supported"; one jinja2 lacks too gets jinja2's error.
constexpr std::string_view kJinja2Filters[] = {
    "abs",      "attr",       "batch",       "capitalize",
    "center",   "count",      "d",           "default",
    "dictsort", "e",          "escape",      "filesizeformat",
    "first",    "float",      "forceescape", "format",
    "groupby",  "indent",     "int",         "items",
    "join",     "last",       "length",      "list",
    "lower",    "map",        "max",         "min",
    "pprint",   "random",     "reject",      "rejectattr",
    "replace",  "reverse",    "round",       "safe",
    "select",   "selectattr", "slice",       "sort",
    "string",   "striptags",  "sum",         "title",
    "tojson",   "trim",       "truncate",    "unique",
    "upper",    "urlencode",  "urlize",      "wordcount",
    "wordwrap", "xmlattr"};
constexpr std::string_view kJinja2Tests[] = {
    "!=",          "<",         "<=",      "==",          ">",        ">=",
    "boolean",     "callable",  "defined", "divisibleby", "eq",       "equalto",
    "escaped",     "even",      "false",   "filter",      "float",    "ge",
    "greaterthan", "gt",        "in",      "integer",     "iterable", "le",
    "lessthan",    "lower",     "lt",      "mapping",     "ne",       "none",
    "number",      "odd",       "sameas",  "sequence",    "string",   "test",
    "true",        "undefined", "upper"};

absl::Status CheckNames(const Expr& e, bool soft);

absl::Status CheckNames(const ExprPtr& e, bool soft) {
  return e == nullptr ? absl::OkStatus() : CheckNames(*e, soft);
}

// jinja2 refuses an unknown filter or test when it compiles the template,
// except in a "soft" frame (an {% if %}'s tests and bodies, an inline if),
// where only running it fails; published templates rely on that.
absl::Status CheckNames(const Expr& e, bool soft) {
  if (e.unknown && !soft) {
    return ErrorAt(
        e.line,
        UnknownNameMessage(e.kind == Expr::Kind::kFilter ? "filter" : "test",
                           e.name, false));
  }
  soft = soft || e.kind == Expr::Kind::kCondition;
  for (const ExprPtr& item : e.items) {
    LORAPLEX_RETURN_IF_ERROR(CheckNames(item, soft));
  }
  for (const auto& [key, value] : e.keywords) {
    LORAPLEX_RETURN_IF_ERROR(CheckNames(value, soft));
  }
  return absl::OkStatus();
}

// `soft` as jinja2's frames: if-blocks share their frame; loops, macros,
// call, filter and set blocks open a new one.
absl::Status CheckNames(const Body& body, bool soft) {
  for (const auto& stmt : body) {
    const bool is_if = stmt->kind == Stmt::Kind::kIf;
    const bool outer = soft || is_if;
    LORAPLEX_RETURN_IF_ERROR(CheckNames(
        stmt->expr, outer && stmt->kind != Stmt::Kind::kFilterBlock));
    LORAPLEX_RETURN_IF_ERROR(CheckNames(stmt->filter, false));
    for (const ExprPtr& condition : stmt->conditions) {
      LORAPLEX_RETURN_IF_ERROR(CheckNames(condition, outer));
    }
    for (const ExprPtr& fallback : stmt->defaults) {
      LORAPLEX_RETURN_IF_ERROR(CheckNames(fallback, false));
    }
    for (const Body& inner : stmt->bodies) {
      LORAPLEX_RETURN_IF_ERROR(CheckNames(inner, is_if && outer));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string UnknownNameMessage(std::string_view kind, std::string_view name,
                               bool running) {
  const bool jinja2_has =
      kind == "filter"
          ? std::find(std::begin(kJinja2Filters), std::end(kJinja2Filters),
                      name) != std::end(kJinja2Filters)
          : std::find(std::begin(kJinja2Tests), std::end(kJinja2Tests), name) !=
                std::end(kJinja2Tests);
  if (jinja2_has) {
    return absl::StrCat("the ", std::string(kind), " \"", std::string(name),
                        "\" is not supported");
  }
  return absl::StrCat("No ", std::string(kind), " named '", std::string(name),
                      "'", running ? " found." : ".");
}

absl::StatusOr<Body> ParseTemplate(std::string_view source) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Token> tokens, LexTemplate(source));
  parser_internal::Parser parser(std::move(tokens));
  LORAPLEX_ASSIGN_OR_RETURN(Body body, parser.ParseAll());
  LORAPLEX_RETURN_IF_ERROR(CheckNames(body, false));
  return body;
}

}  // namespace loraplex::jinja
