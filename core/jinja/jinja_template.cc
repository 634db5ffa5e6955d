#include "core/jinja/jinja_template.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_builtins.h"
#include "core/jinja/jinja_operators.h"
#include "core/jinja/jinja_parser.h"

namespace loraplex::jinja {
namespace {

// A rendering larger than this is a runaway template, not a chat.
constexpr size_t kMaxOutputBytes = size_t{64} << 20;
constexpr int kMaxCallDepth = 64;

absl::Status AtLine(const absl::Status& status, int line) {
  if (status.ok() || absl::StartsWith(status.message(), "line ")) {
    return status;
  }
  return absl::Status(status.code(),
                      absl::StrCat("line ", line, ": ", status.message()));
}

bool HasGeneration(const Body& body) {
  for (const auto& stmt : body) {
    if (stmt->kind == Stmt::Kind::kGeneration) return true;
    for (const Body& inner : stmt->bodies) {
      if (HasGeneration(inner)) return true;
    }
  }
  return false;
}

bool UsesName(const Body& body, const std::string& name);

bool UsesName(const Expr* e, const std::string& name) {
  if (e == nullptr) return false;
  if (e->kind == Expr::Kind::kName && e->name == name) return true;
  for (const ExprPtr& item : e->items) {
    if (UsesName(item.get(), name)) return true;
  }
  for (const auto& [key, value] : e->keywords) {
    if (UsesName(value.get(), name)) return true;
  }
  return false;
}

// Whether `body` reads `name` anywhere (jinja2 gives a macro its `caller`
// parameter only when its body mentions it).
bool UsesName(const Body& body, const std::string& name) {
  for (const auto& stmt : body) {
    if (UsesName(stmt->expr.get(), name) || UsesName(stmt->filter.get(), name))
      return true;
    for (const ExprPtr& e : stmt->conditions) {
      if (UsesName(e.get(), name)) return true;
    }
    for (const ExprPtr& e : stmt->defaults) {
      if (UsesName(e.get(), name)) return true;
    }
    for (const Body& inner : stmt->bodies) {
      if (UsesName(inner, name)) return true;
    }
  }
  return false;
}

using Scope = absl::flat_hash_map<std::string, Value>;

class Renderer {
 public:
  explicit Renderer(const std::vector<std::pair<std::string, Value>>& vars) {
    scopes_.emplace_back();
    for (auto& [name, value] : GlobalFunctions()) scopes_[0][name] = value;
    for (const auto& [name, value] : vars) scopes_[0][name] = value;
  }

  absl::StatusOr<Rendering> Run(const Body& body) {
    Rendering rendering;
    main_ = &rendering.text;
    LORAPLEX_ASSIGN_OR_RETURN(Flow flow, Exec(body, &rendering.text));
    (void)flow;
    rendering.generation_spans = std::move(spans_);
    return rendering;
  }

 private:
  enum class Flow { kNormal, kBreak, kContinue };

  Value Lookup(const std::string& name) const {
    for (auto scope = scopes_.rbegin(); scope != scopes_.rend(); ++scope) {
      auto it = scope->find(name);
      if (it != scope->end()) return it->second;
    }
    return Value::Undefined(absl::StrCat("'", name, "' is undefined"));
  }

  absl::Status Write(std::string* out, std::string_view text) {
    if (out->size() + text.size() > kMaxOutputBytes) {
      return absl::InvalidArgumentError(
          "the chat template's output exceeds 64 MiB");
    }
    out->append(text);
    return absl::OkStatus();
  }

  absl::Status Assign(const Stmt& stmt, const Value& value) {
    if (!stmt.attribute.empty()) {
      Value target = Lookup(stmt.targets[0]);
      Dict* ns = target.mutable_namespace();
      if (ns == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "cannot assign attribute ", stmt.attribute, " on ",
            target.is_undefined() ? target.name() : "a " + target.TypeName(),
            " (only namespace() objects take attributes)"));
      }
      ns->Set(stmt.attribute, value);
      return absl::OkStatus();
    }
    return Bind(stmt.targets, value);
  }

  absl::Status Bind(const std::vector<std::string>& names, const Value& value) {
    if (names.size() == 1) {
      scopes_.back()[names[0]] = value;
      return absl::OkStatus();
    }
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, value.Iterate());
    if (items.size() != names.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot unpack ", items.size(), " values into ",
                       names.size(), " names"));
    }
    for (size_t i = 0; i < names.size(); ++i) {
      scopes_.back()[names[i]] = items[i];
    }
    return absl::OkStatus();
  }

  absl::StatusOr<Flow> Exec(const Body& body, std::string* out) {
    for (const auto& stmt : body) {
      absl::StatusOr<Flow> flow = ExecOne(*stmt, out);
      if (!flow.ok()) return AtLine(flow.status(), stmt->line);
      if (*flow != Flow::kNormal) return *flow;
    }
    return Flow::kNormal;
  }

  absl::StatusOr<Flow> ExecOne(const Stmt& stmt, std::string* out) {
    switch (stmt.kind) {
      case Stmt::Kind::kText:
        LORAPLEX_RETURN_IF_ERROR(Write(out, stmt.text));
        return Flow::kNormal;
      case Stmt::Kind::kOutput: {
        LORAPLEX_ASSIGN_OR_RETURN(Value v, Eval(*stmt.expr));
        LORAPLEX_RETURN_IF_ERROR(Write(out, v.Str()));
        return Flow::kNormal;
      }
      case Stmt::Kind::kIf:
        for (size_t i = 0; i < stmt.conditions.size(); ++i) {
          LORAPLEX_ASSIGN_OR_RETURN(Value c, Eval(*stmt.conditions[i]));
          if (c.Truthy()) return Exec(stmt.bodies[i], out);
        }
        if (stmt.bodies.size() > stmt.conditions.size()) {
          return Exec(stmt.bodies.back(), out);
        }
        return Flow::kNormal;
      case Stmt::Kind::kFor:
        LORAPLEX_RETURN_IF_ERROR(ExecFor(stmt, out));
        return Flow::kNormal;
      case Stmt::Kind::kSet: {
        LORAPLEX_ASSIGN_OR_RETURN(Value v, Eval(*stmt.expr));
        LORAPLEX_RETURN_IF_ERROR(Assign(stmt, v));
        return Flow::kNormal;
      }
      case Stmt::Kind::kSetBlock: {
        std::string captured;
        LORAPLEX_ASSIGN_OR_RETURN(Flow flow, Exec(stmt.bodies[0], &captured));
        (void)flow;
        LORAPLEX_RETURN_IF_ERROR(
            Bind(stmt.targets, Value::String(std::move(captured))));
        return Flow::kNormal;
      }
      case Stmt::Kind::kMacro:
        scopes_.back()[stmt.text] = MakeMacro(stmt, stmt.text, nullptr);
        return Flow::kNormal;
      case Stmt::Kind::kCallBlock:
        LORAPLEX_RETURN_IF_ERROR(ExecCallBlock(stmt, out));
        return Flow::kNormal;
      case Stmt::Kind::kFilterBlock:
        LORAPLEX_RETURN_IF_ERROR(ExecFilterBlock(stmt, out));
        return Flow::kNormal;
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kGeneration: {
        if (out != main_) {
          return absl::InvalidArgumentError(
              "a {% generation %} block inside a macro or a block set is not "
              "supported");
        }
        const size_t start = out->size();
        LORAPLEX_ASSIGN_OR_RETURN(Flow flow, Exec(stmt.bodies[0], out));
        spans_.emplace_back(start, out->size());
        return flow;
      }
    }
    return Flow::kNormal;
  }

  absl::Status ExecFor(const Stmt& stmt, std::string* out) {
    LORAPLEX_ASSIGN_OR_RETURN(Value iterable, Eval(*stmt.expr));
    return Loop(stmt, iterable, 1, out);
  }

  // One level of a for loop; a recursive loop's `loop(items)` runs the next
  // level with the scopes the loop started in.
  absl::Status Loop(const Stmt& stmt, const Value& iterable, int64_t depth,
                    std::string* out) {
    absl::StatusOr<std::vector<Value>> all = iterable.Iterate();
    if (!all.ok()) return all.status();
    std::vector<Value> items;
    if (stmt.filter != nullptr) {
      for (const Value& item : *all) {
        scopes_.emplace_back();
        absl::Status bound = Bind(stmt.targets, item);
        absl::StatusOr<Value> keep =
            bound.ok() ? Eval(*stmt.filter) : absl::StatusOr<Value>(bound);
        scopes_.pop_back();
        if (!keep.ok()) return keep.status();
        if (keep->Truthy()) items.push_back(item);
      }
    } else {
      items = *std::move(all);
    }
    const size_t base = scopes_.size();
    auto recurse = std::make_shared<const Function>(
        [this, &stmt, depth,
         base](const CallArgs& args) -> absl::StatusOr<Value> {
          if (!stmt.recursive) {
            return absl::InvalidArgumentError(
                "The loop must have the 'recursive' marker to be called "
                "recursively.");
          }
          if (args.positional.size() != 1 || depth >= kMaxCallDepth) {
            return absl::InvalidArgumentError(
                args.positional.size() != 1
                    ? "loop() takes the items of the next level"
                    : "a recursive loop recurses too deeply");
          }
          std::vector<Scope> inner;
          if (scopes_.size() >= base) {
            inner.assign(std::make_move_iterator(scopes_.begin() + base),
                         std::make_move_iterator(scopes_.end()));
            scopes_.resize(base);
          }
          std::string captured;
          absl::Status status =
              Loop(stmt, args.positional[0], depth + 1, &captured);
          scopes_.insert(scopes_.end(), std::make_move_iterator(inner.begin()),
                         std::make_move_iterator(inner.end()));
          if (!status.ok()) return status;
          return Value::String(std::move(captured));
        });
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.emplace_back();
      auto loop = std::make_shared<Dict>();
      loop->call = recurse;
      loop->Set("index", Value::Int(i + 1));
      loop->Set("index0", Value::Int(i));
      loop->Set("revindex", Value::Int(n - i));
      loop->Set("revindex0", Value::Int(n - i - 1));
      loop->Set("first", Value::Bool(i == 0));
      loop->Set("last", Value::Bool(i == n - 1));
      loop->Set("length", Value::Int(n));
      loop->Set("depth", Value::Int(depth));
      loop->Set("depth0", Value::Int(depth - 1));
      loop->Set("previtem",
                i > 0 ? items[i - 1]
                      : Value::Undefined("'loop.previtem' is undefined"));
      loop->Set("nextitem",
                i + 1 < n ? items[i + 1]
                          : Value::Undefined("'loop.nextitem' is undefined"));
      loop->Set(
          "cycle",
          Value::MakeFunction(
              "loop.cycle", [i](const CallArgs& args) -> absl::StatusOr<Value> {
                if (args.positional.empty()) {
                  return absl::InvalidArgumentError(
                      "loop.cycle() takes at least one value");
                }
                return args.positional[static_cast<size_t>(i) %
                                       args.positional.size()];
              }));
      scopes_.back()["loop"] = Value::MakeDict(std::move(loop));
      absl::Status bound = Bind(stmt.targets, items[i]);
      absl::StatusOr<Flow> flow =
          bound.ok() ? Exec(stmt.bodies[0], out) : absl::StatusOr<Flow>(bound);
      scopes_.pop_back();
      if (!flow.ok()) return flow.status();
      if (*flow == Flow::kBreak) break;
    }
    if (n == 0 && stmt.bodies.size() > 1) {
      LORAPLEX_ASSIGN_OR_RETURN(Flow flow, Exec(stmt.bodies[1], out));
      (void)flow;
    }
    return absl::OkStatus();
  }

  // A macro, or a call block's caller: renders def.bodies[0] with its
  // parameters (def.targets = def.defaults) over `closure`, or for a macro
  // (no closure) over the globals when it is called.
  Value MakeMacro(const Stmt& def, std::string name,
                  std::shared_ptr<const std::vector<Scope>> closure) {
    const Stmt* macro = &def;
    const bool takes_caller =
        def.kind == Stmt::Kind::kMacro && UsesName(def.bodies[0], "caller");
    return Value::MakeFunction(
        name,
        [this, macro, name, closure,
         takes_caller](const CallArgs& args) -> absl::StatusOr<Value> {
          if (depth_ >= kMaxCallDepth) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro ", name, " recurses too deeply"));
          }
          Scope params;
          for (size_t i = 0; i < macro->targets.size(); ++i) {
            const Value* given = args.Find(i, macro->targets[i]);
            if (given != nullptr) {
              params[macro->targets[i]] = *given;
            } else if (macro->defaults[i] != nullptr) {
              LORAPLEX_ASSIGN_OR_RETURN(params[macro->targets[i]],
                                        Eval(*macro->defaults[i]));
            } else {
              params[macro->targets[i]] = Value::Undefined(
                  absl::StrCat("'", macro->targets[i], "' is undefined"));
            }
          }
          const Value* caller = args.Find(SIZE_MAX, "caller");
          if (caller != nullptr && !takes_caller) {
            return absl::InvalidArgumentError(absl::StrCat(
                "macro '", name,
                "' was invoked with two values for the special caller "
                "argument. This is most likely a bug."));
          }
          if (takes_caller) {
            params["caller"] = caller != nullptr
                                   ? *caller
                                   : Value::Undefined("No caller defined");
          }
          std::vector<Scope> saved = std::move(scopes_);
          if (closure != nullptr) {
            scopes_ = *closure;
          } else {
            scopes_ = {saved[0]};
          }
          scopes_.push_back(std::move(params));
          ++depth_;
          std::string captured;
          absl::StatusOr<Flow> flow = Exec(macro->bodies[0], &captured);
          --depth_;
          scopes_ = std::move(saved);
          if (!flow.ok()) return flow.status();
          return Value::String(std::move(captured));
        });
  }

  // {% call(params) callee(args) %}body{% endcall %}: callee(args,
  // caller=<a macro rendering body>).
  absl::Status ExecCallBlock(const Stmt& stmt, std::string* out) {
    const Expr& call = *stmt.expr;
    LORAPLEX_ASSIGN_OR_RETURN(Value callee, Eval(*call.items[0]));
    LORAPLEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(call, 1));
    args.keyword.emplace_back(
        "caller",
        MakeMacro(stmt, "caller",
                  std::make_shared<const std::vector<Scope>>(scopes_)));
    LORAPLEX_ASSIGN_OR_RETURN(Value result, CallValue(callee, args));
    return Write(out, result.Str());
  }

  // {% filter f(args) | g %}body{% endfilter %}: g(f(body, args)).
  absl::Status ExecFilterBlock(const Stmt& stmt, std::string* out) {
    std::string captured;
    scopes_.emplace_back();
    absl::StatusOr<Flow> flow = Exec(stmt.bodies[0], &captured);
    absl::StatusOr<Value> filtered = absl::InternalError("not run");
    if (flow.ok()) {
      scopes_.back()[kFilterBlockBody] = Value::String(std::move(captured));
      filtered = Eval(*stmt.expr);
    }
    scopes_.pop_back();
    if (!flow.ok()) return flow.status();
    if (!filtered.ok()) return filtered.status();
    return Write(out, filtered->Str());
  }

  absl::StatusOr<Value> CallValue(const Value& callee, const CallArgs& args) {
    if (callee.is_dict() && callee.dict().call != nullptr) {
      return (*callee.dict().call)(args);  // A loop object: loop(items).
    }
    if (!callee.is_function()) {
      if (callee.is_undefined()) {
        return absl::InvalidArgumentError(absl::StrCat(
            callee.name(), " (not a function the chat template subset has)"));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("'", callee.TypeName(), "' object is not callable"));
    }
    return callee.function()(args);
  }

  absl::StatusOr<CallArgs> EvalArgs(const Expr& e, size_t first) {
    CallArgs args;
    for (size_t i = first; i < e.items.size(); ++i) {
      LORAPLEX_ASSIGN_OR_RETURN(Value v, Eval(*e.items[i]));
      args.positional.push_back(std::move(v));
    }
    for (const auto& [key, expr] : e.keywords) {
      LORAPLEX_ASSIGN_OR_RETURN(Value v, Eval(*expr));
      args.keyword.emplace_back(key, std::move(v));
    }
    return args;
  }

  absl::StatusOr<Value> Eval(const Expr& e) {
    absl::StatusOr<Value> v = EvalInner(e);
    if (!v.ok()) return AtLine(v.status(), e.line);
    return v;
  }

  absl::StatusOr<Value> EvalInner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.value;
      case Expr::Kind::kName:
        return Lookup(e.name);
      case Expr::Kind::kList: {
        std::vector<Value> items;
        for (const auto& item : e.items) {
          LORAPLEX_ASSIGN_OR_RETURN(Value v, Eval(*item));
          items.push_back(std::move(v));
        }
        return e.tuple ? Value::Tuple(std::move(items))
                       : Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        auto dict = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          LORAPLEX_ASSIGN_OR_RETURN(Value key, Eval(*e.items[i]));
          const std::optional<std::string> stored = EncodeDictKey(key);
          if (!stored.has_value()) {
            return absl::InvalidArgumentError(absl::StrCat(
                key.is_list() || key.is_dict() ? "unhashable type: '"
                                               : "dict literal keys of type '",
                key.TypeName(),
                key.is_list() || key.is_dict() ? "'" : "' are not supported"));
          }
          LORAPLEX_ASSIGN_OR_RETURN(Value value, Eval(*e.items[i + 1]));
          dict->Set(*stored, std::move(value));
        }
        return Value::MakeDict(std::move(dict));
      }
      case Expr::Kind::kAttribute: {
        LORAPLEX_ASSIGN_OR_RETURN(Value object, Eval(*e.items[0]));
        return GetAttribute(object, e.name);
      }
      case Expr::Kind::kItem: {
        LORAPLEX_ASSIGN_OR_RETURN(Value object, Eval(*e.items[0]));
        LORAPLEX_ASSIGN_OR_RETURN(Value key, Eval(*e.items[1]));
        return GetItem(object, key);
      }
      case Expr::Kind::kSlice: {
        LORAPLEX_ASSIGN_OR_RETURN(Value object, Eval(*e.items[0]));
        Value parts[3];
        for (int i = 0; i < 3; ++i) {
          if (e.items[i + 1] != nullptr) {
            LORAPLEX_ASSIGN_OR_RETURN(parts[i], Eval(*e.items[i + 1]));
          }
        }
        return GetSlice(object, e.items[1] ? &parts[0] : nullptr,
                        e.items[2] ? &parts[1] : nullptr,
                        e.items[3] ? &parts[2] : nullptr);
      }
      case Expr::Kind::kCall: {
        LORAPLEX_ASSIGN_OR_RETURN(Value callee, Eval(*e.items[0]));
        LORAPLEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return CallValue(callee, args);
      }
      case Expr::Kind::kFilter: {
        if (e.unknown) {
          return absl::InvalidArgumentError(
              UnknownNameMessage("filter", e.name, true));
        }
        LORAPLEX_ASSIGN_OR_RETURN(Value operand, Eval(*e.items[0]));
        LORAPLEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return ApplyFilter(e.name, operand, args);
      }
      case Expr::Kind::kTest: {
        if (e.unknown) {
          return absl::InvalidArgumentError(
              UnknownNameMessage("test", e.name, true));
        }
        LORAPLEX_ASSIGN_OR_RETURN(Value operand, Eval(*e.items[0]));
        LORAPLEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        LORAPLEX_ASSIGN_OR_RETURN(bool passed,
                                  ApplyTest(e.name, operand, args));
        return Value::Bool(passed != e.negated);
      }
      case Expr::Kind::kNot: {
        LORAPLEX_ASSIGN_OR_RETURN(Value v, Eval(*e.items[0]));
        return Value::Bool(!v.Truthy());
      }
      case Expr::Kind::kNegate: {
        LORAPLEX_ASSIGN_OR_RETURN(Value v, Eval(*e.items[0]));
        if (v.kind() == Value::Kind::kFloat)
          return Value::Float(-v.float_value());
        if (v.is_number()) return Value::Int(-v.int_value());
        return absl::InvalidArgumentError(
            absl::StrCat("bad operand type for unary -: '", v.TypeName(), "'"));
      }
      case Expr::Kind::kCondition: {
        LORAPLEX_ASSIGN_OR_RETURN(Value c, Eval(*e.items[0]));
        if (c.Truthy()) return Eval(*e.items[1]);
        if (e.items[2] != nullptr) return Eval(*e.items[2]);
        return Value::Undefined(
            "an inline if without else is undefined when false");
      }
      case Expr::Kind::kBinary:
        return EvalBinary(e);
      case Expr::Kind::kCompare: {
        // Python's chain: each operand evaluated once, stop at the first
        // false comparison.
        LORAPLEX_ASSIGN_OR_RETURN(Value left, Eval(*e.items[0]));
        for (size_t i = 0; i < e.ops.size(); ++i) {
          LORAPLEX_ASSIGN_OR_RETURN(Value right, Eval(*e.items[i + 1]));
          LORAPLEX_ASSIGN_OR_RETURN(bool holds,
                                    Comparison(e.ops[i], left, right));
          if (!holds) return Value::Bool(false);
          left = std::move(right);
        }
        return Value::Bool(true);
      }
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    LORAPLEX_ASSIGN_OR_RETURN(Value a, Eval(*e.items[0]));
    const std::string& op = e.name;
    if (op == "and") return a.Truthy() ? Eval(*e.items[1]) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.items[1]);
    LORAPLEX_ASSIGN_OR_RETURN(Value b, Eval(*e.items[1]));
    if (op == "==" || op == "!=" || op == "in" || op == "not in" || op == "<" ||
        op == ">" || op == "<=" || op == ">=") {
      LORAPLEX_ASSIGN_OR_RETURN(bool holds, Comparison(op, a, b));
      return Value::Bool(holds);
    }
    return Arithmetic(op, a, b);
  }

  std::vector<Scope> scopes_;
  std::string* main_ = nullptr;
  std::vector<std::pair<size_t, size_t>> spans_;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  LORAPLEX_ASSIGN_OR_RETURN(Body body, ParseTemplate(source));
  Template t;
  t.has_generation_ = HasGeneration(body);
  t.body_ = std::make_shared<const Body>(std::move(body));
  return t;
}

absl::StatusOr<Rendering> Template::Render(
    const std::vector<std::pair<std::string, Value>>& variables) const {
  Renderer renderer(variables);
  return renderer.Run(*body_);
}

}  // namespace loraplex::jinja
