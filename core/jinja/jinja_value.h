// Values of the Jinja subset that chat templates are written in, with the
// Python semantics Jinja gives them (transformers renders chat templates
// with Python's jinja2): truthiness, str() and repr(), ==, ordering, and
// json.dumps for the `tojson` filter.
//
//   jinja::Value messages = jinja::Value::FromJson(json["messages"]);
//   if (messages.Truthy()) out += messages.Str();
//
// Strings are UTF-8; lengths, indices and slices count code points, as
// Python's do. Lists and dicts share their contents when copied (templates
// cannot mutate them); namespace() objects are the one mutable kind.
#ifndef LORAPLEX_CORE_JINJA_JINJA_VALUE_H_
#define LORAPLEX_CORE_JINJA_JINJA_VALUE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace loraplex::jinja {

class Value;

// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, if given.
  const Value* Find(size_t index, const std::string& name) const;
};

using Function = std::function<absl::StatusOr<Value>(const CallArgs&)>;

// Insertion-ordered map (Python dicts keep insertion order). Keys are
// strings; a key of another hashable type (None, a bool, an int, a float) is
// stored as EncodeDictKey spells it, and DictKeyValue gives it back.
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  // Set on the `loop` object of a recursive for loop: `loop(children)`.
  std::shared_ptr<const Function> call;

  // `key` as stored (a string, or an encoded key): keys equal as Python
  // hashes them find one another (1, 1.0 and True), and Set on an existing
  // key keeps the key and replaces the value, as Python does.
  const Value* Find(const std::string& key) const;
  void Set(const std::string& key, Value value);
};

// The stored form of a dict key: the string itself, or for None, a bool, an
// int or a float an encoding that starts with two NUL bytes (which no
// template's string key does); nullopt for a key type this interpreter does
// not store (lists and dicts are unhashable in Python, tuples unsupported).
std::optional<std::string> EncodeDictKey(const Value& key);
// The key as the template sees it (keys(), items(), iteration, printing).
Value DictKeyValue(const std::string& stored);

class Value {
 public:
  enum class Kind {
    kUndefined,  // A missing variable, key or attribute.
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kFunction,
  };

  Value() = default;  // Undefined.
  // `message` says what was missing: "'foo' is undefined", "'dict object'
  // has no attribute 'content'" (the error when it is used).
  static Value Undefined(std::string message);
  static Value None();
  static Value Bool(bool value);
  static Value Int(int64_t value);
  static Value Float(double value);
  static Value String(std::string value);
  static Value List(std::vector<Value> items);
  // A Python tuple: a list that prints as (a, b) and is never == a list.
  static Value Tuple(std::vector<Value> items);
  // What jinja2's map, select, reject, selectattr and rejectattr return: a
  // generator, iterated like a list but always true, without a length, and
  // not JSON serializable (`| list` makes it a list).
  static Value Generator(std::vector<Value> items);
  // A jinja2 Markup string (the safe and escape filters): `+` with a plain
  // string HTML-escapes that string, as Markup.__add__ does.
  static Value Markup(std::string value);
  static Value MakeDict(std::shared_ptr<Dict> dict);
  static Value MakeFunction(std::string name, Function function);
  // JSON as Python's json.loads gives it (use nlohmann::ordered_json to
  // keep the key order a template's tojson and items() show).
  template <typename Json>
  static Value FromJson(const Json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_string() const { return kind_ == Kind::kString; }
  // Lists and tuples both.
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }
  bool is_generator() const { return kind_ == Kind::kList && generator_; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_function() const { return kind_ == Kind::kFunction; }

  bool bool_value() const { return bool_; }
  int64_t int_value() const { return kind_ == Kind::kBool ? bool_ : int_; }
  double float_value() const {
    return kind_ == Kind::kFloat ? float_ : static_cast<double>(int_value());
  }
  const std::string& string_value() const { return string_; }
  // An undefined value's message; a function's name.
  const std::string& name() const { return string_; }
  const std::vector<Value>& list() const { return *list_; }
  const Dict& dict() const { return *dict_; }
  Dict* mutable_namespace() const {
    return dict_ && dict_->is_namespace ? dict_.get() : nullptr;
  }
  const Function& function() const { return *function_; }

  // Python's bool(x) (Undefined is false).
  bool Truthy() const;
  // Python's str(x); Undefined is "".
  std::string Str() const;
  // Python's repr(x).
  std::string Repr() const;
  // Python's type name, for errors ("str", "list", "undefined").
  std::string TypeName() const;
  // Python's ==.
  bool Equals(const Value& other) const;
  // Python's len(x) for strings (code points), lists and dicts.
  std::optional<int64_t> Length() const;
  // The items a for-loop visits: list items, dict keys, string characters.
  absl::StatusOr<std::vector<Value>> Iterate() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  bool tuple_ = false;
  bool generator_ = false;
  bool markup_ = false;
  int64_t int_ = 0;
  double float_ = 0.0;
  std::string string_;
  std::shared_ptr<const std::vector<Value>> list_;
  std::shared_ptr<Dict> dict_;
  std::shared_ptr<const Function> function_;
};

template <typename Json>
Value Value::FromJson(const Json& json) {
  if (json.is_null()) return None();
  if (json.is_boolean()) return Bool(json.template get<bool>());
  if (json.is_number_unsigned()) {
    const uint64_t u = json.template get<uint64_t>();
    return u > static_cast<uint64_t>(INT64_MAX) ? Float(static_cast<double>(u))
                                                : Int(static_cast<int64_t>(u));
  }
  if (json.is_number_integer()) return Int(json.template get<int64_t>());
  if (json.is_number_float()) return Float(json.template get<double>());
  if (json.is_string()) return String(json.template get<std::string>());
  if (json.is_array()) {
    std::vector<Value> items;
    items.reserve(json.size());
    for (const auto& item : json) items.push_back(FromJson(item));
    return List(std::move(items));
  }
  auto dict = std::make_shared<Dict>();
  if (json.is_object()) {
    for (auto it = json.begin(); it != json.end(); ++it) {
      dict->items.emplace_back(it.key(), FromJson(it.value()));
    }
  }
  return MakeDict(std::move(dict));
}

// Python's ordering (<: -1, ==: 0, >: 1) for numbers and strings; error
// for other pairs ("'<' not supported between 'dict' and 'int'").
absl::StatusOr<int> Compare(const Value& a, const Value& b);

// Python's repr() of a float ("1.0", "0.1", "1e-05", "1e+16").
std::string PythonFloatRepr(double value);

struct JsonDumpOptions {
  std::optional<int> indent;  // None: one line.
  // Defaults as Python's: (", ", ": "), or ("," , ": ") with an indent.
  std::optional<std::string> item_separator;
  std::optional<std::string> key_separator;
  bool sort_keys = false;
  bool ensure_ascii = false;
};

// Python's json.dumps(value, ...). Undefined and functions are errors.
// `text` with & < > " ' replaced by HTML entities (jinja2's escape).
std::string HtmlEscape(const std::string& text);

absl::StatusOr<std::string> DumpJson(const Value& value,
                                     const JsonDumpOptions& options);

// UTF-8 helpers on code points, as Python strings index them.
std::vector<std::string> CodePoints(const std::string& text);

}  // namespace loraplex::jinja

#endif  // LORAPLEX_CORE_JINJA_JINJA_VALUE_H_
