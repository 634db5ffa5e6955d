// Filters, with Jinja 3.1's semantics (tests and global functions:
// jinja_tests.cc).
#include "core/jinja/jinja_builtins.h"

#include <algorithm>
#include <cmath>
#include <ctime>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_format.h"
#include "core/jinja/jinja_parser.h"

namespace loraplex::jinja {
namespace {

constexpr std::string_view kFilters[] = {
    "abs",     "capitalize", "count", "d",     "default", "dictsort",
    "e",       "escape",     "first", "float", "format",  "indent",
    "int",     "items",      "join",  "last",  "length",  "list",
    "lower",   "map",        "max",   "min",   "reject",  "rejectattr",
    "replace", "reverse",    "round", "safe",  "select",  "selectattr",
    "sort",    "string",     "sum",   "title", "tojson",  "trim",
    "unique",  "upper"};

absl::Status FilterError(const std::string& filter, const std::string& what) {
  return absl::InvalidArgumentError(
      absl::StrCat("filter ", filter, ": ", what));
}

bool BoolArg(const CallArgs& args, size_t index, const std::string& name,
             bool fallback) {
  const Value* v = args.Find(index, name);
  return v == nullptr ? fallback : v->Truthy();
}

absl::StatusOr<std::vector<Value>> Items(const std::string& filter,
                                         const Value& operand) {
  absl::StatusOr<std::vector<Value>> items = operand.Iterate();
  if (!items.ok())
    return FilterError(filter, std::string(items.status().message()));
  return items;
}

// `attribute` may be dotted ("function.name"), as Jinja's make_attrgetter.
absl::StatusOr<Value> Attribute(const Value& item, const std::string& path) {
  Value current = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot - start);
    if (current.is_undefined()) return current;
    LORAPLEX_ASSIGN_OR_RETURN(current, GetItem(current, Value::String(part)));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// select/reject/selectattr/rejectattr: keep items whose test (or
// truthiness) is `keep`.
absl::StatusOr<Value> SelectItems(const std::string& filter,
                                  const Value& operand, const CallArgs& args,
                                  bool by_attribute, bool keep) {
  // jinja2 loops only `if value:`, so none, undefined, "" and 0 select
  // nothing.
  if (!operand.Truthy()) return Value::Generator({});
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items(filter, operand));
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return FilterError(filter, "takes an attribute name");
    }
    attribute = args.positional[0].string_value();
    next = 1;
  }
  std::string test;
  CallArgs test_args;
  if (next < args.positional.size()) {
    if (!args.positional[next].is_string()) {
      return FilterError(filter, "the test must be named by a string");
    }
    test = args.positional[next].string_value();
    if (!IsKnownTest(test)) {
      return FilterError(
          filter, absl::StrCat("the test \"", test, "\" is not supported"));
    }
    test_args.positional.assign(args.positional.begin() + next + 1,
                                args.positional.end());
  }
  std::vector<Value> out;
  for (const Value& item : items) {
    Value subject = item;
    if (by_attribute) {
      LORAPLEX_ASSIGN_OR_RETURN(subject, Attribute(item, attribute));
    }
    bool passed = subject.Truthy();
    if (!test.empty()) {
      LORAPLEX_ASSIGN_OR_RETURN(passed, ApplyTest(test, subject, test_args));
    }
    if (passed == keep) out.push_back(item);
  }
  return Value::Generator(std::move(out));
}

absl::StatusOr<Value> Indent(const Value& operand, const CallArgs& args) {
  const Value* width = args.Find(0, "width");
  std::string indention(4, ' ');
  if (width != nullptr && width->is_string()) {
    indention = width->string_value();
  } else if (width != nullptr && width->is_number()) {
    indention = std::string(
        static_cast<size_t>(std::max<int64_t>(0, width->int_value())), ' ');
  }
  const bool first = BoolArg(args, 1, "first", false);
  const bool blank = BoolArg(args, 2, "blank", false);
  std::vector<std::string> lines;
  const std::string text = operand.Str() + "\n";
  size_t start = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '\n') {
      lines.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  std::string out = lines.empty() ? "" : lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += indention;
    out += lines[i];
  }
  if (first) out = indention + out;
  return Value::String(std::move(out));
}

absl::StatusOr<Value> ToJson(const Value& operand, const CallArgs& args) {
  JsonDumpOptions options;
  if (const Value* indent = args.Find(0, "indent");
      indent != nullptr && !indent->is_none()) {
    if (!indent->is_number())
      return FilterError("tojson", "indent must be an integer");
    options.indent = static_cast<int>(indent->int_value());
  }
  if (const Value* seps = args.Find(99, "separators");
      seps != nullptr && !seps->is_none()) {
    if (!seps->is_list() || seps->list().size() != 2 ||
        !seps->list()[0].is_string() || !seps->list()[1].is_string()) {
      return FilterError("tojson", "separators must be two strings");
    }
    options.item_separator = seps->list()[0].string_value();
    options.key_separator = seps->list()[1].string_value();
  }
  options.sort_keys = BoolArg(args, 99, "sort_keys", false);
  options.ensure_ascii = BoolArg(args, 99, "ensure_ascii", false);
  absl::StatusOr<std::string> text = DumpJson(operand, options);
  if (!text.ok())
    return FilterError("tojson", std::string(text.status().message()));
  return Value::String(*std::move(text));
}

// The key sort and unique compare `item` by: its `attribute` (dotted path,
// or none), lowercased unless case_sensitive.
absl::StatusOr<Value> ComparisonKey(const Value& item, const Value* attribute,
                                    bool case_sensitive) {
  Value key = item;
  if (attribute != nullptr && attribute->is_string()) {
    LORAPLEX_ASSIGN_OR_RETURN(key, Attribute(item, attribute->string_value()));
  }
  if (key.is_string() && !case_sensitive) {
    key = Value::String(PythonLower(key.string_value()));
  }
  return key;
}

// The values of (sort key, value) pairs in a stable sort by key, as a list;
// keys Python cannot order are the filter's error.
absl::StatusOr<Value> SortedByKey(const std::string& filter,
                                  std::vector<std::pair<Value, Value>> keyed,
                                  bool reverse) {
  absl::Status status;
  std::stable_sort(keyed.begin(), keyed.end(),
                   [&](const auto& a, const auto& b) {
                     absl::StatusOr<int> c = Compare(a.first, b.first);
                     if (!c.ok()) {
                       status = c.status();
                       return false;
                     }
                     return reverse ? *c > 0 : *c < 0;
                   });
  if (!status.ok()) return FilterError(filter, std::string(status.message()));
  std::vector<Value> out;
  for (auto& [key, value] : keyed) out.push_back(std::move(value));
  return Value::List(std::move(out));
}

// sort(reverse=False, case_sensitive=False, attribute=None), stable.
absl::StatusOr<Value> Sort(const Value& operand, const CallArgs& args) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items("sort", operand));
  const bool reverse = BoolArg(args, 0, "reverse", false);
  const bool case_sensitive = BoolArg(args, 1, "case_sensitive", false);
  const Value* attribute = args.Find(2, "attribute");
  std::vector<std::pair<Value, Value>> keyed;
  for (const Value& item : items) {
    LORAPLEX_ASSIGN_OR_RETURN(Value key,
                              ComparisonKey(item, attribute, case_sensitive));
    keyed.emplace_back(std::move(key), item);
  }
  return SortedByKey("sort", std::move(keyed), reverse);
}

// dictsort(case_sensitive=False, by='key', reverse=False): the dict's
// (key, value) tuples, stably sorted by key or value.
absl::StatusOr<Value> DictSort(const Value& operand, const CallArgs& args) {
  if (!operand.is_dict() || operand.dict().is_namespace) {
    return FilterError("dictsort",
                       absl::StrCat("'", operand.TypeName(),
                                    "' object has no attribute 'items'"));
  }
  const bool case_sensitive = BoolArg(args, 0, "case_sensitive", false);
  const Value* by = args.Find(1, "by");
  const std::string by_name = by != nullptr ? by->Str() : "key";
  if (by_name != "key" && by_name != "value") {
    return FilterError("dictsort",
                       "You can only sort by either \"key\" or \"value\"");
  }
  const bool reverse = BoolArg(args, 2, "reverse", false);
  std::vector<std::pair<Value, Value>> keyed;
  for (const auto& [key, value] : operand.dict().items) {
    LORAPLEX_ASSIGN_OR_RETURN(
        Value sort_key,
        ComparisonKey(by_name == "key" ? DictKeyValue(key) : value, nullptr,
                      case_sensitive));
    keyed.emplace_back(std::move(sort_key),
                       Value::Tuple({DictKeyValue(key), value}));
  }
  return SortedByKey("dictsort", std::move(keyed), reverse);
}

// unique(case_sensitive=False, attribute=None): first occurrences, in order.
absl::StatusOr<Value> Unique(const Value& operand, const CallArgs& args) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items("unique", operand));
  const bool case_sensitive = BoolArg(args, 0, "case_sensitive", false);
  const Value* attribute = args.Find(1, "attribute");
  std::vector<Value> seen;
  std::vector<Value> out;
  for (const Value& item : items) {
    LORAPLEX_ASSIGN_OR_RETURN(Value key,
                              ComparisonKey(item, attribute, case_sensitive));
    if (std::none_of(seen.begin(), seen.end(),
                     [&](const Value& s) { return s.Equals(key); })) {
      seen.push_back(std::move(key));
      out.push_back(item);
    }
  }
  return Value::List(std::move(out));
}

absl::StatusOr<Value> Number(const std::string& filter, const Value& operand,
                             const CallArgs& args) {
  const Value* fallback = args.Find(0, "default");
  const bool to_int = filter == "int";
  const Value otherwise = fallback != nullptr
                              ? *fallback
                              : (to_int ? Value::Int(0) : Value::Float(0.0));
  if (operand.is_number()) {
    return to_int ? Value::Int(static_cast<int64_t>(operand.float_value()))
                  : Value::Float(operand.float_value());
  }
  if (operand.is_string()) {
    const std::string text =
        PythonStrip(operand.string_value(), nullptr, true, true);
    char* end = nullptr;
    const double parsed = std::strtod(text.c_str(), &end);
    if (!text.empty() && end == text.c_str() + text.size()) {
      return to_int ? Value::Int(static_cast<int64_t>(parsed))
                    : Value::Float(parsed);
    }
  }
  return otherwise;
}

absl::StatusOr<Value> Aggregate(const std::string& filter, const Value& operand,
                                const CallArgs& args) {
  LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items(filter, operand));
  const Value* attribute = args.Find(filter == "sum" ? 0 : 1, "attribute");
  std::vector<Value> values;
  for (const Value& item : items) {
    Value v = item;
    if (attribute != nullptr && attribute->is_string()) {
      LORAPLEX_ASSIGN_OR_RETURN(v, Attribute(item, attribute->string_value()));
    }
    values.push_back(std::move(v));
  }
  if (filter == "sum") {
    const Value* start = args.Find(1, "start");
    bool is_float = start != nullptr && start->kind() == Value::Kind::kFloat;
    double f = start != nullptr ? start->float_value() : 0.0;
    int64_t i = start != nullptr ? start->int_value() : 0;
    for (const Value& v : values) {
      if (!v.is_number()) return FilterError(filter, "items must be numbers");
      is_float = is_float || v.kind() == Value::Kind::kFloat;
      f += v.float_value();
      i += v.int_value();
    }
    return is_float ? Value::Float(f) : Value::Int(i);
  }
  if (values.empty())
    return Value::Undefined(
        absl::StrCat("the ", filter, " of no items is undefined"));
  size_t best = 0;
  for (size_t k = 1; k < values.size(); ++k) {
    Value a = values[k], b = values[best];
    if (a.is_string() && b.is_string()) {
      a = Value::String(PythonLower(a.string_value()));
      b = Value::String(PythonLower(b.string_value()));
    }
    absl::StatusOr<int> c = Compare(a, b);
    if (!c.ok()) return FilterError(filter, std::string(c.status().message()));
    if ((filter == "min" && *c < 0) || (filter == "max" && *c > 0)) best = k;
  }
  return items[best];
}

}  // namespace

bool IsKnownFilter(std::string_view name) {
  return std::find(std::begin(kFilters), std::end(kFilters), name) !=
         std::end(kFilters);
}

absl::StatusOr<Value> ApplyFilter(const std::string& name, const Value& operand,
                                  const CallArgs& args) {
  if (name == "default" || name == "d") {
    const Value* fallback = args.Find(0, "default_value");
    const bool boolean = BoolArg(args, 1, "boolean", false);
    if (operand.is_undefined() || (boolean && !operand.Truthy())) {
      return fallback != nullptr ? *fallback : Value::String("");
    }
    return operand;
  }
  if (name == "safe") {
    return operand.is_markup() ? operand : Value::Markup(operand.Str());
  }
  if (operand.is_undefined() && name != "length" && name != "count" &&
      name != "list" && name != "items" && name != "join" && name != "string" &&
      name != "trim" && name != "lower" && name != "upper" &&
      name != "select" && name != "reject" && name != "selectattr" &&
      name != "rejectattr" && name != "map" && name != "format") {
    return absl::InvalidArgumentError(
        absl::StrCat("filter ", name, ": ", operand.name()));
  }
  if (name == "length" || name == "count") {
    std::optional<int64_t> n = operand.Length();
    if (!n.has_value()) {
      return FilterError(
          name, absl::StrCat("a ", operand.TypeName(), " has no length"));
    }
    return Value::Int(*n);
  }
  if (name == "trim") {
    return Value::String(
        PythonStrip(operand.Str(), args.Find(0, "chars"), true, true));
  }
  if (name == "tojson") return ToJson(operand, args);
  if (name == "string") return Value::String(operand.Str());
  if (name == "upper") return Value::String(PythonUpper(operand.Str()));
  if (name == "lower") return Value::String(PythonLower(operand.Str()));
  if (name == "title") return Value::String(PythonTitle(operand.Str()));
  if (name == "capitalize") {
    return Value::String(PythonCapitalize(operand.Str()));
  }
  if (name == "replace") {
    const Value* from = args.Find(0, "old");
    const Value* to = args.Find(1, "new");
    const Value* count = args.Find(2, "count");
    if (from == nullptr || to == nullptr) {
      return FilterError(name, "takes the old and the new string");
    }
    return Value::String(PythonReplace(
        operand.Str(), from->Str(), to->Str(),
        count != nullptr && count->is_number() ? count->int_value() : -1));
  }
  if (name == "e" || name == "escape") {
    if (operand.is_markup()) return operand;
    return Value::Markup(HtmlEscape(operand.Str()));
  }
  if (name == "list") {
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items(name, operand));
    return Value::List(std::move(items));
  }
  if (name == "first" || name == "last") {
    if (name == "last" && operand.is_generator()) {
      // jinja2's last takes reversed(value).
      return FilterError(name, "'generator' object is not reversible");
    }
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items(name, operand));
    if (items.empty())
      return Value::Undefined(
          absl::StrCat("the ", name, " of no items is undefined"));
    return name == "first" ? items.front() : items.back();
  }
  if (name == "reverse") {
    if (operand.is_string()) {
      const Value step = Value::Int(-1);
      return GetSlice(operand, nullptr, nullptr, &step);
    }
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items(name, operand));
    std::reverse(items.begin(), items.end());
    return Value::List(std::move(items));
  }
  if (name == "items") {
    if (operand.is_undefined()) return Value::List({});
    if (!operand.is_dict()) return FilterError(name, "takes a dict");
    std::vector<Value> out;
    for (const auto& [key, value] : operand.dict().items) {
      out.push_back(Value::Tuple({DictKeyValue(key), value}));
    }
    return Value::List(std::move(out));
  }
  if (name == "join") {
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items(name, operand));
    const Value* sep = args.Find(0, "d");
    const Value* attribute = args.Find(1, "attribute");
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0 && sep != nullptr) out += sep->Str();
      Value item = items[i];
      if (attribute != nullptr && attribute->is_string()) {
        LORAPLEX_ASSIGN_OR_RETURN(item,
                                  Attribute(item, attribute->string_value()));
      }
      out += item.Str();
    }
    return Value::String(std::move(out));
  }
  if (name == "map") {
    if (!operand.Truthy()) return Value::Generator({});  // As select.
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> items, Items(name, operand));
    std::vector<Value> out;
    const Value* attribute = args.Find(99, "attribute");
    if (attribute != nullptr) {
      const Value* fallback = args.Find(99, "default");
      for (const Value& item : items) {
        LORAPLEX_ASSIGN_OR_RETURN(Value v, Attribute(item, attribute->Str()));
        out.push_back(v.is_undefined() && fallback != nullptr ? *fallback : v);
      }
      return Value::Generator(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string() ||
        !IsKnownFilter(args.positional[0].string_value())) {
      return FilterError(name, "takes attribute= or the name of a filter");
    }
    CallArgs rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& item : items) {
      LORAPLEX_ASSIGN_OR_RETURN(
          Value v, ApplyFilter(args.positional[0].string_value(), item, rest));
      out.push_back(std::move(v));
    }
    return Value::Generator(std::move(out));
  }
  if (name == "select" || name == "reject") {
    return SelectItems(name, operand, args, false, name == "select");
  }
  if (name == "selectattr" || name == "rejectattr") {
    return SelectItems(name, operand, args, true, name == "selectattr");
  }
  if (name == "dictsort") return DictSort(operand, args);
  if (name == "format") {
    // soft_str(value) % (kwargs or args), as jinja2's do_format.
    if (!args.positional.empty() && !args.keyword.empty()) {
      return FilterError(name,
                         "can't handle positional and keyword arguments at "
                         "the same time");
    }
    Value values = Value::Tuple(args.positional);
    if (!args.keyword.empty()) {
      auto dict = std::make_shared<Dict>();
      for (const auto& [key, value] : args.keyword) dict->Set(key, value);
      values = Value::MakeDict(std::move(dict));
    }
    return PythonPercentFormat(operand.Str(), values);
  }
  if (name == "sort") return Sort(operand, args);
  if (name == "unique") return Unique(operand, args);
  if (name == "int" || name == "float") return Number(name, operand, args);
  if (name == "abs") {
    if (operand.kind() == Value::Kind::kFloat) {
      return Value::Float(std::fabs(operand.float_value()));
    }
    if (!operand.is_number()) return FilterError(name, "takes a number");
    return Value::Int(std::llabs(operand.int_value()));
  }
  if (name == "round") {
    if (!operand.is_number()) return FilterError(name, "takes a number");
    const Value* precision = args.Find(0, "precision");
    const Value* method = args.Find(1, "method");
    const double scale =
        std::pow(10.0, precision != nullptr ? precision->float_value() : 0.0);
    const double x = operand.float_value() * scale;
    const std::string how = method != nullptr ? method->Str() : "common";
    double r = how == "ceil"    ? std::ceil(x)
               : how == "floor" ? std::floor(x)
                                : std::nearbyint(x);
    return Value::Float(r / scale);
  }
  if (name == "indent") return Indent(operand, args);
  if (name == "sum" || name == "min" || name == "max") {
    return Aggregate(name, operand, args);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the filter \"", name, "\" is not supported"));
}

}  // namespace loraplex::jinja
