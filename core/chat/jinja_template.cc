#include "core/chat/jinja_template.h"

#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "core/chat/jinja_builtins.h"
#include "core/chat/jinja_parser.h"
#include "core/common/status_macros.h"

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

absl::Status OperandError(const std::string& op, const Value& a,
                          const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError((a.is_undefined() ? a : b).name());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported operand types for ", op, ": '", a.TypeName(),
                   "' and '", b.TypeName(), "'"));
}

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a,
                                 const Value& b) {
  if (op == "~") return Value::String(a.Str() + b.Str());
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.kind() == Value::Kind::kFloat ||
                                  b.kind() == Value::Kind::kFloat);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      return Value::String(a.string_value() + b.string_value());
    }
    if (a.is_list() && b.is_list()) {
      std::vector<Value> items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return Value::List(std::move(items));
    }
    if (numbers) {
      return floats ? Value::Float(a.float_value() + b.float_value())
                    : Value::Int(a.int_value() + b.int_value());
    }
    return OperandError(op, a, b);
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list() ? &a : &b;
    const Value* count = seq == &a ? &b : &a;
    if ((seq->is_string() || seq->is_list()) &&
        count->kind() == Value::Kind::kInt) {
      const int64_t n = std::max<int64_t>(0, count->int_value());
      if (n * static_cast<int64_t>(seq->Length().value_or(0)) > (1 << 24)) {
        return absl::InvalidArgumentError("a repeated sequence is too long");
      }
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->string_value();
        return Value::String(std::move(out));
      }
      std::vector<Value> items;
      for (int64_t i = 0; i < n; ++i) {
        items.insert(items.end(), seq->list().begin(), seq->list().end());
      }
      return Value::List(std::move(items));
    }
  }
  if (!numbers) return OperandError(op, a, b);
  if (op == "-") {
    return floats ? Value::Float(a.float_value() - b.float_value())
                  : Value::Int(a.int_value() - b.int_value());
  }
  if (op == "*") {
    return floats ? Value::Float(a.float_value() * b.float_value())
                  : Value::Int(a.int_value() * b.int_value());
  }
  if (op == "**") {
    if (!floats && b.int_value() >= 0) {
      return Value::Int(static_cast<int64_t>(
          std::llround(std::pow(a.float_value(), b.float_value()))));
    }
    return Value::Float(std::pow(a.float_value(), b.float_value()));
  }
  if ((op == "/" || op == "//" || op == "%") && b.float_value() == 0.0) {
    return absl::InvalidArgumentError("division by zero");
  }
  if (op == "/") return Value::Float(a.float_value() / b.float_value());
  if (op == "//") {
    if (floats)
      return Value::Float(std::floor(a.float_value() / b.float_value()));
    const int64_t x = a.int_value(), y = b.int_value();
    int64_t q = x / y;
    if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
    return Value::Int(q);
  }
  if (op == "%") {
    if (floats) {
      double r = std::fmod(a.float_value(), b.float_value());
      if (r != 0 && ((r < 0) != (b.float_value() < 0))) r += b.float_value();
      return Value::Float(r);
    }
    const int64_t x = a.int_value(), y = b.int_value();
    int64_t r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) r += y;
    return Value::Int(r);
  }
  return OperandError(op, a, b);
}

absl::StatusOr<bool> Contains(const Value& container, const Value& item) {
  if (container.is_string()) {
    if (!item.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'in <string>' requires a string, not '", item.TypeName(), "'"));
    }
    return container.string_value().find(item.string_value()) !=
           std::string::npos;
  }
  if (container.is_dict()) {
    return item.is_string() && container.dict().Find(item.string_value());
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, container.Iterate());
  for (const Value& v : items) {
    if (v.Equals(item)) return true;
  }
  return false;
}

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
        scopes_.back()[stmt.text] = MakeMacro(stmt);
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
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      scopes_.emplace_back();
      auto loop = std::make_shared<Dict>();
      loop->Set("index", Value::Int(i + 1));
      loop->Set("index0", Value::Int(i));
      loop->Set("revindex", Value::Int(n - i));
      loop->Set("revindex0", Value::Int(n - i - 1));
      loop->Set("first", Value::Bool(i == 0));
      loop->Set("last", Value::Bool(i == n - 1));
      loop->Set("length", Value::Int(n));
      loop->Set("depth", Value::Int(1));
      loop->Set("depth0", Value::Int(0));
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

  Value MakeMacro(const Stmt& stmt) {
    const Stmt* macro = &stmt;
    return Value::MakeFunction(
        stmt.text,
        [this, macro](const CallArgs& args) -> absl::StatusOr<Value> {
          if (depth_ >= kMaxCallDepth) {
            return absl::InvalidArgumentError(
                absl::StrCat("macro ", macro->text, " recurses too deeply"));
          }
          absl::flat_hash_map<std::string, Value> params;
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
          std::vector<absl::flat_hash_map<std::string, Value>> saved =
              std::move(scopes_);
          scopes_ = {saved[0], std::move(params)};
          ++depth_;
          std::string captured;
          absl::StatusOr<Flow> flow = Exec(macro->bodies[0], &captured);
          --depth_;
          scopes_ = std::move(saved);
          if (!flow.ok()) return flow.status();
          return Value::String(std::move(captured));
        });
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
        return Value::List(std::move(items));
      }
      case Expr::Kind::kDict: {
        auto dict = std::make_shared<Dict>();
        for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
          LORAPLEX_ASSIGN_OR_RETURN(Value key, Eval(*e.items[i]));
          if (!key.is_string()) {
            return absl::InvalidArgumentError(
                "dict literal keys must be strings here");
          }
          LORAPLEX_ASSIGN_OR_RETURN(Value value, Eval(*e.items[i + 1]));
          dict->Set(key.string_value(), std::move(value));
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
        if (!callee.is_function()) {
          if (callee.is_undefined()) {
            return absl::InvalidArgumentError(
                absl::StrCat(callee.name(),
                             " (not a function the chat template subset "
                             "has)"));
          }
          return absl::InvalidArgumentError(
              absl::StrCat("'", callee.TypeName(), "' object is not callable"));
        }
        LORAPLEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return callee.function()(args);
      }
      case Expr::Kind::kFilter: {
        LORAPLEX_ASSIGN_OR_RETURN(Value operand, Eval(*e.items[0]));
        LORAPLEX_ASSIGN_OR_RETURN(CallArgs args, EvalArgs(e, 1));
        return ApplyFilter(e.name, operand, args);
      }
      case Expr::Kind::kTest: {
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
    }
    return absl::InternalError("unknown expression");
  }

  absl::StatusOr<Value> EvalBinary(const Expr& e) {
    LORAPLEX_ASSIGN_OR_RETURN(Value a, Eval(*e.items[0]));
    const std::string& op = e.name;
    if (op == "and") return a.Truthy() ? Eval(*e.items[1]) : a;
    if (op == "or") return a.Truthy() ? a : Eval(*e.items[1]);
    LORAPLEX_ASSIGN_OR_RETURN(Value b, Eval(*e.items[1]));
    if (op == "==") return Value::Bool(a.Equals(b));
    if (op == "!=") return Value::Bool(!a.Equals(b));
    if (op == "in" || op == "not in") {
      LORAPLEX_ASSIGN_OR_RETURN(bool in, Contains(b, a));
      return Value::Bool(in == (op == "in"));
    }
    if (op == "<" || op == ">" || op == "<=" || op == ">=") {
      LORAPLEX_ASSIGN_OR_RETURN(int c, Compare(a, b));
      return Value::Bool(op == "<"    ? c < 0
                         : op == ">"  ? c > 0
                         : op == "<=" ? c <= 0
                                      : c >= 0);
    }
    return Arithmetic(op, a, b);
  }

  std::vector<absl::flat_hash_map<std::string, Value>> scopes_;
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
