// Python's string formatting, as templates reach it through jinja2:
// `'%s: %.2f' % (name, x)` and the `format` filter (printf-style), and
// `'{} {name:>5}'.format(a, name=b)` (str.format with its format-spec
// mini-language: fill, align, sign, #, 0, width, grouping, precision and
// the types s d n b o x X c e E f F g G %).
//
//   LORAPLEX_ASSIGN_OR_RETURN(Value text, PythonPercentFormat("%d", n));
//
// Errors carry Python's message ("not enough arguments for format string",
// "Unknown format code 'd' for object of type 'str'").
#ifndef LORAPLEX_CORE_JINJA_JINJA_FORMAT_H_
#define LORAPLEX_CORE_JINJA_JINJA_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/jinja/jinja_value.h"

namespace loraplex::jinja {

// Python's `format % args`: a tuple gives the values in order, a dict (or
// another mapping) the %(name)s values, anything else is the one value.
absl::StatusOr<Value> PythonPercentFormat(const std::string& format,
                                          const Value& args);

// Python's format.format(*args.positional, **args.keyword).
absl::StatusOr<Value> PythonStrFormat(const std::string& format,
                                      const CallArgs& args);

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_FORMAT_H_
