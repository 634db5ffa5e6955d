// Tests (`x is defined`) and global functions, with Jinja 3.1's semantics
// and those transformers adds (jinja_builtins.h).
#include <algorithm>
#include <cmath>
#include <ctime>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_builtins.h"
#include "core/jinja/jinja_parser.h"

namespace loraplex::jinja {
namespace {

constexpr std::string_view kTests[] = {
    "boolean", "callable", "defined",  "divisibleby", "eq",
    "equalto", "==",       "even",     "false",       "float",
    "ge",      ">=",       "gt",       ">",           "greaterthan",
    "in",      "integer",  "iterable", "le",          "<=",
    "lower",   "lt",       "<",        "lessthan",    "mapping",
    "ne",      "!=",       "none",     "number",      "odd",
    "sameas",  "sequence", "string",   "true",        "undefined",
    "upper"};

}  // namespace

bool IsKnownTest(std::string_view name) {
  return std::find(std::begin(kTests), std::end(kTests), name) !=
         std::end(kTests);
}

absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& operand,
                               const CallArgs& args) {
  const Value* arg = args.Find(0, "value");
  auto need_arg = [&]() -> absl::Status {
    if (arg != nullptr) return absl::OkStatus();
    return absl::InvalidArgumentError(
        absl::StrCat("test ", name, " takes an argument"));
  };
  if (name == "defined") return !operand.is_undefined();
  if (name == "undefined") return operand.is_undefined();
  if (name == "none") return operand.is_none();
  if (name == "boolean") return operand.kind() == Value::Kind::kBool;
  if (name == "true") {
    return operand.kind() == Value::Kind::kBool && operand.bool_value();
  }
  if (name == "false") {
    return operand.kind() == Value::Kind::kBool && !operand.bool_value();
  }
  if (name == "integer") return operand.kind() == Value::Kind::kInt;
  if (name == "float") return operand.kind() == Value::Kind::kFloat;
  if (name == "number") return operand.is_number();
  if (name == "string") return operand.is_string();
  if (name == "mapping") return operand.is_dict();
  if (name == "iterable") {
    return operand.is_list() || operand.is_dict() || operand.is_string() ||
           operand.is_undefined();
  }
  if (name == "sequence") {
    return operand.is_list() || operand.is_dict() || operand.is_string();
  }
  if (name == "callable") return operand.is_function();
  if (name == "lower") {
    return operand.is_string() &&
           PythonLower(operand.string_value()) == operand.string_value();
  }
  if (name == "upper") {
    return operand.is_string() &&
           PythonUpper(operand.string_value()) == operand.string_value();
  }
  if (name == "odd" || name == "even" || name == "divisibleby") {
    if (!operand.is_number()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "test ", name, " takes a number, got a ", operand.TypeName()));
    }
    int64_t by = 2;
    if (name == "divisibleby") {
      LORAPLEX_RETURN_IF_ERROR(need_arg());
      by = arg->int_value();
      if (by == 0) return absl::InvalidArgumentError("divisibleby 0");
    }
    const int64_t rem = operand.int_value() % by;
    return name == "odd" ? rem != 0 : rem == 0;
  }
  if (name == "sameas") {
    LORAPLEX_RETURN_IF_ERROR(need_arg());
    // Identity for the scalars templates compare this way (none, booleans).
    return operand.kind() == arg->kind() && operand.Equals(*arg);
  }
  if (name == "in") {
    LORAPLEX_RETURN_IF_ERROR(need_arg());
    if (arg->is_string() && operand.is_string()) {
      return arg->string_value().find(operand.string_value()) !=
             std::string::npos;
    }
    if (arg->is_dict()) {
      const std::optional<std::string> key = EncodeDictKey(operand);
      return key.has_value() && arg->dict().Find(*key) != nullptr;
    }
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, arg->Iterate());
    return std::any_of(items.begin(), items.end(),
                       [&](const Value& v) { return v.Equals(operand); });
  }
  LORAPLEX_RETURN_IF_ERROR(need_arg());
  if (name == "eq" || name == "equalto" || name == "==") {
    return operand.Equals(*arg);
  }
  if (name == "ne" || name == "!=") return !operand.Equals(*arg);
  LORAPLEX_ASSIGN_OR_RETURN(int c, Compare(operand, *arg));
  if (name == "lt" || name == "<" || name == "lessthan") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == ">" || name == "greaterthan") return c > 0;
  if (name == "ge" || name == ">=") return c >= 0;
  return absl::InvalidArgumentError(
      absl::StrCat("the test \"", name, "\" is not supported"));
}

std::vector<std::pair<std::string, Value>> GlobalFunctions() {
  std::vector<std::pair<std::string, Value>> globals;
  globals.emplace_back(
      "raise_exception",
      Value::MakeFunction(
          "raise_exception", [](const CallArgs& args) -> absl::StatusOr<Value> {
            const Value* message = args.Find(0, "message");
            return absl::InvalidArgumentError(
                absl::StrCat("the chat template raised an error: ",
                             message != nullptr ? message->Str() : ""));
          }));
  globals.emplace_back(
      "strftime_now",
      Value::MakeFunction(
          "strftime_now", [](const CallArgs& args) -> absl::StatusOr<Value> {
            const Value* format = args.Find(0, "format");
            if (format == nullptr || !format->is_string()) {
              return absl::InvalidArgumentError(
                  "strftime_now() takes a format string");
            }
            const std::time_t now = std::time(nullptr);
            std::tm local{};
            localtime_r(&now, &local);
            char buffer[256];
            const size_t n = std::strftime(
                buffer, sizeof(buffer), format->string_value().c_str(), &local);
            return Value::String(std::string(buffer, n));
          }));
  globals.emplace_back(
      "namespace", Value::MakeFunction("namespace", [](const CallArgs& args) {
        auto dict = std::make_shared<Dict>();
        dict->is_namespace = true;
        for (const Value& initial : args.positional) {
          if (initial.is_dict()) {
            for (const auto& [k, v] : initial.dict().items) dict->Set(k, v);
          }
        }
        for (const auto& [k, v] : args.keyword) dict->Set(k, v);
        return absl::StatusOr<Value>(Value::MakeDict(std::move(dict)));
      }));
  globals.emplace_back(
      "dict", Value::MakeFunction("dict", [](const CallArgs& args) {
        auto dict = std::make_shared<Dict>();
        for (const auto& [k, v] : args.keyword) dict->Set(k, v);
        return absl::StatusOr<Value>(Value::MakeDict(std::move(dict)));
      }));
  globals.emplace_back(
      "range",
      Value::MakeFunction(
          "range", [](const CallArgs& args) -> absl::StatusOr<Value> {
            std::vector<int64_t> n;
            for (const Value& v : args.positional) {
              if (!v.is_number()) {
                return absl::InvalidArgumentError("range() takes integers");
              }
              n.push_back(v.int_value());
            }
            if (n.empty() || n.size() > 3) {
              return absl::InvalidArgumentError(
                  "range() takes 1 to 3 integers");
            }
            const int64_t start = n.size() > 1 ? n[0] : 0;
            const int64_t stop = n.size() > 1 ? n[1] : n[0];
            const int64_t step = n.size() > 2 ? n[2] : 1;
            if (step == 0) {
              return absl::InvalidArgumentError(
                  "range() step must not be zero");
            }
            std::vector<Value> out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
              if (out.size() >= 1000000) {
                return absl::InvalidArgumentError(
                    "range() is limited to 1000000 items");
              }
              out.push_back(Value::Int(i));
            }
            return Value::List(std::move(out));
          }));
  return globals;
}

}  // namespace loraplex::jinja
