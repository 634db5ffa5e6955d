// What Jinja and Python give templates besides syntax: attribute and item
// lookup (with str/dict methods such as `.strip()` and `.items()`), the
// filters and tests the chat-template subset has, and the global
// functions transformers defines (raise_exception, strftime_now) with
// Jinja's own (namespace, range, dict).
#ifndef LORAPLEX_CORE_JINJA_JINJA_BUILTINS_H_
#define LORAPLEX_CORE_JINJA_JINJA_BUILTINS_H_

#include <string>

#include "absl/status/statusor.h"
#include "core/jinja/jinja_value.h"

namespace loraplex::jinja {

// Jinja's `object.name`: a method of str/dict values, else the dict's
// item, else Undefined. Error only when `object` itself is undefined.
absl::StatusOr<Value> GetAttribute(const Value& object,
                                   const std::string& name);
// Jinja's `object[key]`: the item (negative indexes count from the end),
// else a method, else Undefined.
absl::StatusOr<Value> GetItem(const Value& object, const Value& key);
// object[start:stop:step] on lists and strings; null parts are omitted.
absl::StatusOr<Value> GetSlice(const Value& object, const Value* start,
                               const Value* stop, const Value* step);

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& operand,
                                  const CallArgs& args);
absl::StatusOr<bool> ApplyTest(const std::string& name, const Value& operand,
                               const CallArgs& args);

// The global functions every template sees, as name/value pairs.
std::vector<std::pair<std::string, Value>> GlobalFunctions();

// Python's str.isspace() for one code point.
bool IsPythonSpace(char32_t c);

// Python's str methods of the same names. PythonStrip strips `chars` (a
// string value; null or not a string: whitespace) from the chosen ends.
std::string PythonStrip(const std::string& text, const Value* chars, bool left,
                        bool right);
std::string PythonLower(const std::string& text);
std::string PythonUpper(const std::string& text);
std::string PythonTitle(const std::string& text);
std::string PythonCapitalize(const std::string& text);
// count < 0: every occurrence.
std::string PythonReplace(const std::string& text, const std::string& from,
                          const std::string& to, int64_t count);

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_BUILTINS_H_
