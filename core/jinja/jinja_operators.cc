// Python's binary operators on template values (jinja_operators.h).
#include "core/jinja/jinja_operators.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_format.h"

namespace loraplex::jinja {
namespace {

absl::Status OperandError(const std::string& op, const Value& a,
                          const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    return absl::InvalidArgumentError((a.is_undefined() ? a : b).name());
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unsupported operand types for ", op, ": '", a.TypeName(),
                   "' and '", b.TypeName(), "'"));
}

}  // namespace

absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a,
                                 const Value& b) {
  if (op == "~") return Value::String(a.Str() + b.Str());
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.kind() == Value::Kind::kFloat ||
                                  b.kind() == Value::Kind::kFloat);
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      // Markup + str escapes the str (Markup.__add__ / __radd__).
      if (a.is_markup() || b.is_markup()) {
        return Value::Markup(
            (a.is_markup() ? a.string_value() : HtmlEscape(a.string_value())) +
            (b.is_markup() ? b.string_value() : HtmlEscape(b.string_value())));
      }
      return Value::String(a.string_value() + b.string_value());
    }
    if (a.is_list() && b.is_list() && !a.is_generator() && !b.is_generator()) {
      if (a.is_tuple() != b.is_tuple()) {
        return absl::InvalidArgumentError(
            absl::StrCat("can only concatenate ", a.TypeName(), " (not \"",
                         b.TypeName(), "\") to ", a.TypeName()));
      }
      std::vector<Value> items = a.list();
      items.insert(items.end(), b.list().begin(), b.list().end());
      return a.is_tuple() ? Value::Tuple(std::move(items))
                          : Value::List(std::move(items));
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
      return seq->is_tuple() ? Value::Tuple(std::move(items))
                             : Value::List(std::move(items));
    }
  }
  if (op == "%" && a.is_string())
    return PythonPercentFormat(a.string_value(), b);
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
    const std::optional<std::string> key = EncodeDictKey(item);
    return key.has_value() && container.dict().Find(*key) != nullptr;
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, container.Iterate());
  for (const Value& v : items) {
    if (v.Equals(item)) return true;
  }
  return false;
}

absl::StatusOr<bool> Comparison(const std::string& op, const Value& a,
                                const Value& b) {
  if (op == "==") return a.Equals(b);
  if (op == "!=") return !a.Equals(b);
  if (op == "in" || op == "not in") {
    LORAPLEX_ASSIGN_OR_RETURN(bool in, Contains(b, a));
    return in == (op == "in");
  }
  LORAPLEX_ASSIGN_OR_RETURN(int c, Compare(a, b));
  return op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0;
}

}  // namespace loraplex::jinja
