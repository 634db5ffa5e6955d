// The syntax tree of a parsed Jinja template (jinja_parser.h builds it,
// jinja_template.h runs it). Plain structs: one node kind per Jinja
// construct the subset has.
#ifndef LORAPLEX_CORE_JINJA_JINJA_AST_H_
#define LORAPLEX_CORE_JINJA_JINJA_AST_H_

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/jinja/jinja_value.h"

namespace loraplex::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items; a tuple when `tuple`
    kDict,       // items: key, value, key, value, ...
    kAttribute,  // items[0].name
    kItem,       // items[0][items[1]]
    kSlice,      // items[0][items[1]:items[2]:items[3]] (null = omitted)
    kCall,       // items[0](items[1..], keywords)
    kFilter,     // items[0] | name(items[1..], keywords)
    kTest,       // items[0] is [not] name(items[1..])
    kNot,        // not items[0]
    kNegate,     // -items[0]
    kBinary,     // items[0] op items[1]
    kCompare,    // items[0] ops[0] items[1] ops[1] items[2] ... (chained)
    kCondition,  // items[1] if items[0] else items[2] (null = undefined)
  };
  Kind kind = Kind::kLiteral;
  int line = 0;
  Value value;
  std::string name;      // kName, kAttribute, kFilter, kTest; op for kBinary.
  bool negated = false;  // kTest
  bool tuple = false;    // kList
  // kFilter, kTest: a name the subset lacks, allowed where jinja2 only
  // fails if it runs (inside {% if %} and inline ifs).
  bool unknown = false;
  std::vector<std::string> ops;  // kCompare
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct Stmt {
  enum class Kind {
    kText,      // text
    kOutput,    // {{ expr }}
    kIf,        // conditions[i] -> bodies[i]; a last extra body = else
    kFor,       // for targets in expr [if filter] [recursive]: bodies[0];
                // else bodies[1]
    kSet,       // set targets (or target.attribute) = expr
    kSetBlock,  // set targets[0] %} bodies[0] {% endset
    kMacro,     // macro name(targets = defaults) %} bodies[0]
    kBreak,
    kContinue,
    kGeneration,  // generation %} bodies[0] {% endgeneration
    // call(targets = defaults) expr %} bodies[0] {% endcall: expr (a call)
    // gets caller=, a macro rendering bodies[0].
    kCallBlock,
    // filter expr %} bodies[0] {% endfilter: expr's innermost operand is
    // the name kFilterBlockBody, bound to bodies[0]'s output.
    kFilterBlock,
  };
  Kind kind = Kind::kText;
  int line = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr filter;
  std::vector<ExprPtr> conditions;
  std::vector<Body> bodies;
  std::vector<std::string> targets;
  std::string attribute;          // kSet on a namespace: ns.attribute = ...
  std::vector<ExprPtr> defaults;  // kMacro, kCallBlock: per target, or null
  bool recursive = false;         // kFor
};

// The variable a {% filter %} block's output is bound to; no template can
// name it (it is not an identifier).
inline constexpr char kFilterBlockBody[] = "(filter block)";

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_AST_H_
