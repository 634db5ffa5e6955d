// Python's binary operators on template values, as jinja2 evaluates them:
// arithmetic, `~` concatenation, `in`, and `%` on strings (printf-style
// formatting, jinja_format.h).
//
//   LORAPLEX_ASSIGN_OR_RETURN(Value sum, BinaryOperation("+", a, b));
#ifndef LORAPLEX_CORE_JINJA_JINJA_OPERATORS_H_
#define LORAPLEX_CORE_JINJA_JINJA_OPERATORS_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/jinja/jinja_value.h"

namespace loraplex::jinja {

// `op` is one of + - * / // % ** ~ (errors name the operand types).
absl::StatusOr<Value> Arithmetic(const std::string& op, const Value& a,
                                 const Value& b);

// Python's `item in container`.
absl::StatusOr<bool> Contains(const Value& container, const Value& item);

// Python's `a op b` for == != < > <= >= in and `not in`.
absl::StatusOr<bool> Comparison(const std::string& op, const Value& a,
                                const Value& b);

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_OPERATORS_H_
