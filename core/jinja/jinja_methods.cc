// Attribute and item lookup, slices, and the Python str/dict methods
// templates call (`content.split('</think>')[-1].lstrip('\n')`).
#include <utf8proc.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_builtins.h"
#include "core/jinja/jinja_format.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex::jinja {

bool IsPythonSpace(char32_t c) {
  return (c >= 0x1C && c <= 0x1F) || IsWhitespace(c);
}

namespace {

absl::Status ArgumentError(const std::string& method, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(method, "(): ", what));
}

absl::StatusOr<std::string> StringArg(const CallArgs& args, size_t index,
                                      const std::string& name,
                                      const std::string& method) {
  const Value* v = args.Find(index, name);
  if (v == nullptr || !v->is_string()) {
    return ArgumentError(method,
                         absl::StrCat("argument ", name, " must be a string"));
  }
  return v->string_value();
}

}  // namespace

std::string PythonStrip(const std::string& text, const Value* chars, bool left,
                        bool right) {
  std::vector<std::string> cps = CodePoints(text);
  std::vector<std::string> set;
  const bool whitespace = chars == nullptr || !chars->is_string();
  if (!whitespace) set = CodePoints(chars->string_value());
  auto strip = [&](const std::string& cp) {
    if (whitespace) {
      size_t pos = 0;
      return IsPythonSpace(NextCodePoint(cp, &pos));
    }
    return std::find(set.begin(), set.end(), cp) != set.end();
  };
  size_t begin = 0, end = cps.size();
  if (left) {
    while (begin < end && strip(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strip(cps[end - 1])) --end;
  }
  std::string out;
  for (size_t i = begin; i < end; ++i) out += cps[i];
  return out;
}

namespace {

std::vector<Value> SplitWhitespace(const std::string& text, int64_t maxsplit) {
  std::vector<Value> parts;
  size_t pos = 0;
  std::string current;
  bool in_word = false;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = NextCodePoint(text, &pos);
    if (IsPythonSpace(c) &&
        (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit)) {
      if (in_word) parts.push_back(Value::String(std::move(current)));
      current.clear();
      in_word = false;
    } else if (!IsPythonSpace(c) || in_word) {
      current.append(text, start, pos - start);
      in_word = true;
    }
  }
  if (in_word) {
    parts.push_back(Value::String(PythonStrip(current, nullptr, false, true)));
  }
  return parts;
}

absl::StatusOr<Value> Split(const std::string& text, const CallArgs& args,
                            bool from_right) {
  const std::string method = from_right ? "rsplit" : "split";
  const Value* sep = args.Find(0, "sep");
  const Value* max = args.Find(1, "maxsplit");
  const int64_t maxsplit =
      max != nullptr && max->is_number() ? max->int_value() : -1;
  if (sep == nullptr || sep->is_none()) {
    if (from_right && maxsplit >= 0) {
      return ArgumentError(method, "maxsplit without a separator");
    }
    return Value::List(SplitWhitespace(text, maxsplit));
  }
  if (!sep->is_string() || sep->string_value().empty()) {
    return ArgumentError(method, "the separator must be a non-empty string");
  }
  const std::string& s = sep->string_value();
  std::vector<std::string> parts;
  if (!from_right) {
    size_t start = 0;
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      const size_t at = text.find(s, start);
      if (at == std::string::npos) break;
      parts.push_back(text.substr(start, at - start));
      start = at + s.size();
    }
    parts.push_back(text.substr(start));
  } else {
    size_t end = text.size();
    std::vector<std::string> reversed;
    while (maxsplit < 0 || static_cast<int64_t>(reversed.size()) < maxsplit) {
      if (end < s.size()) break;
      const size_t at = text.rfind(s, end - s.size());
      if (at == std::string::npos) break;
      reversed.push_back(text.substr(at + s.size(), end - at - s.size()));
      end = at;
    }
    reversed.push_back(text.substr(0, end));
    parts.assign(reversed.rbegin(), reversed.rend());
  }
  std::vector<Value> out;
  for (std::string& part : parts) out.push_back(Value::String(std::move(part)));
  return Value::List(std::move(out));
}

std::string MapCase(const std::string& text, int mode) {  // 0 lower 1 upper
  std::string out;
  size_t pos = 0;
  while (pos < text.size()) {
    const char32_t c = NextCodePoint(text, &pos);
    const utf8proc_int32_t mapped =
        mode == 0 ? utf8proc_tolower(static_cast<utf8proc_int32_t>(c))
                  : utf8proc_toupper(static_cast<utf8proc_int32_t>(c));
    AppendUtf8(static_cast<char32_t>(mapped), &out);
  }
  return out;
}

bool IsCased(char32_t c) {
  const utf8proc_category_t cat =
      utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL ||
         cat == UTF8PROC_CATEGORY_LT;
}

}  // namespace

std::string PythonTitle(const std::string& text) {
  std::string out;
  size_t pos = 0;
  bool previous_cased = false;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = NextCodePoint(text, &pos);
    const std::string one = text.substr(start, pos - start);
    out += previous_cased ? MapCase(one, 0) : MapCase(one, 1);
    previous_cased = IsCased(c);
  }
  return out;
}

std::string PythonCapitalize(const std::string& text) {
  std::vector<std::string> cps = CodePoints(text);
  std::string out;
  for (size_t i = 0; i < cps.size(); ++i) {
    out += MapCase(cps[i], i == 0 ? 1 : 0);
  }
  return out;
}

std::string PythonLower(const std::string& text) { return MapCase(text, 0); }
std::string PythonUpper(const std::string& text) { return MapCase(text, 1); }

std::string PythonReplace(const std::string& text, const std::string& from,
                          const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character.
    std::vector<std::string> cps = CodePoints(text);
    int64_t done = 0;
    for (const std::string& cp : cps) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += cp;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = text.find(from, start);
    if (at == std::string::npos) break;
    out.append(text, start, at - start);
    out += to;
    start = at + from.size();
    ++done;
  }
  out.append(text, start, std::string::npos);
  return out;
}

namespace {

absl::StatusOr<Value> StringMethod(const std::string& text,
                                   const std::string& name,
                                   const CallArgs& args) {
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const Value* chars = args.Find(0, "chars");
    return Value::String(
        PythonStrip(text, chars, name != "rstrip", name != "lstrip"));
  }
  if (name == "startswith" || name == "endswith") {
    const Value* arg = args.Find(0, "prefix");
    if (arg == nullptr) return ArgumentError(name, "takes a string");
    std::vector<Value> options =
        arg->is_list() ? arg->list() : std::vector<Value>{*arg};
    for (const Value& option : options) {
      if (!option.is_string()) {
        return ArgumentError(name, "takes a string or a tuple of strings");
      }
      const std::string& s = option.string_value();
      const bool match =
          name == "startswith"
              ? text.compare(0, s.size(), s) == 0
              : text.size() >= s.size() &&
                    text.compare(text.size() - s.size(), s.size(), s) == 0;
      if (match) return Value::Bool(true);
    }
    return Value::Bool(false);
  }
  if (name == "split" || name == "rsplit") {
    return Split(text, args, name == "rsplit");
  }
  if (name == "upper") return Value::String(PythonUpper(text));
  if (name == "lower") return Value::String(PythonLower(text));
  if (name == "title") return Value::String(PythonTitle(text));
  if (name == "capitalize") return Value::String(PythonCapitalize(text));
  if (name == "replace") {
    LORAPLEX_ASSIGN_OR_RETURN(std::string from,
                              StringArg(args, 0, "old", name));
    LORAPLEX_ASSIGN_OR_RETURN(std::string to, StringArg(args, 1, "new", name));
    const Value* count = args.Find(2, "count");
    return Value::String(PythonReplace(
        text, from, to,
        count != nullptr && count->is_number() ? count->int_value() : -1));
  }
  if (name == "find" || name == "count") {
    LORAPLEX_ASSIGN_OR_RETURN(std::string needle,
                              StringArg(args, 0, "sub", name));
    if (name == "count") {
      if (needle.empty()) {
        return Value::Int(static_cast<int64_t>(CodePoints(text).size()) + 1);
      }
      int64_t n = 0;
      for (size_t at = text.find(needle); at != std::string::npos;
           at = text.find(needle, at + needle.size())) {
        ++n;
      }
      return Value::Int(n);
    }
    const size_t at = text.find(needle);
    if (at == std::string::npos) return Value::Int(-1);
    return Value::Int(
        static_cast<int64_t>(CodePoints(text.substr(0, at)).size()));
  }
  if (name == "join") {
    const Value* items = args.Find(0, "iterable");
    if (items == nullptr) return ArgumentError(name, "takes a list");
    LORAPLEX_ASSIGN_OR_RETURN(std::vector<Value> parts, items->Iterate());
    std::string out;
    for (size_t i = 0; i < parts.size(); ++i) {
      if (!parts[i].is_string()) {
        return ArgumentError(
            name, absl::StrCat("item ", i, " is a ", parts[i].TypeName(),
                               ", not a string"));
      }
      if (i > 0) out += text;
      out += parts[i].string_value();
    }
    return Value::String(std::move(out));
  }
  if (name == "splitlines") {
    std::vector<Value> lines;
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\n' || text[i] == '\r') {
        lines.push_back(Value::String(text.substr(start, i - start)));
        if (text[i] == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
        start = i + 1;
      }
    }
    if (start < text.size()) lines.push_back(Value::String(text.substr(start)));
    return Value::List(std::move(lines));
  }
  if (name == "format") return PythonStrFormat(text, args);
  if (name == "isdigit" || name == "isspace" || name == "isalpha") {
    if (text.empty()) return Value::Bool(false);
    size_t pos = 0;
    while (pos < text.size()) {
      const char32_t c = NextCodePoint(text, &pos);
      const utf8proc_category_t cat =
          utf8proc_category(static_cast<utf8proc_int32_t>(c));
      const bool ok = name == "isspace"   ? IsPythonSpace(c)
                      : name == "isdigit" ? cat == UTF8PROC_CATEGORY_ND
                                          : (cat >= UTF8PROC_CATEGORY_LU &&
                                             cat <= UTF8PROC_CATEGORY_LO);
      if (!ok) return Value::Bool(false);
    }
    return Value::Bool(true);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the string method \"", name, "\" is not supported"));
}

constexpr const char* kStringMethods[] = {
    "strip",      "lstrip",  "rstrip",  "startswith", "endswith",
    "split",      "rsplit",  "upper",   "lower",      "title",
    "capitalize", "replace", "find",    "count",      "join",
    "splitlines", "isdigit", "isspace", "isalpha",    "format"};

Value BoundMethod(const Value& object, const std::string& name) {
  if (object.is_string()) {
    for (const char* method : kStringMethods) {
      if (name == method) {
        const std::string text = object.string_value();
        return Value::MakeFunction("str." + name,
                                   [text, name](const CallArgs& args) {
                                     return StringMethod(text, name, args);
                                   });
      }
    }
    return Value::Undefined(
        absl::StrCat("'str object' has no attribute '", name, "'"));
  }
  if (object.is_dict() && !object.dict().is_namespace) {
    if (name == "items" || name == "keys" || name == "values") {
      return Value::MakeFunction(
          "dict." + name, [object, name](const CallArgs&) {
            std::vector<Value> out;
            for (const auto& [key, value] : object.dict().items) {
              if (name == "items") {
                out.push_back(Value::Tuple({DictKeyValue(key), value}));
              } else {
                out.push_back(name == "keys" ? DictKeyValue(key) : value);
              }
            }
            return absl::StatusOr<Value>(Value::List(std::move(out)));
          });
    }
    if (name == "get") {
      return Value::MakeFunction(
          "dict.get", [object](const CallArgs& args) -> absl::StatusOr<Value> {
            const Value* key = args.Find(0, "key");
            const std::optional<std::string> stored =
                key != nullptr ? EncodeDictKey(*key) : std::nullopt;
            const Value* found =
                stored.has_value() ? object.dict().Find(*stored) : nullptr;
            if (found != nullptr) return *found;
            const Value* fallback = args.Find(1, "default");
            return fallback != nullptr ? *fallback : Value::None();
          });
    }
  }
  return Value::Undefined(absl::StrCat(
      "'", object.TypeName(), " object' has no attribute '", name, "'"));
}

absl::Status UndefinedError(const Value& object) {
  return absl::InvalidArgumentError(object.name());
}

// Python's index normalisation: negative counts from the end.
std::optional<size_t> Index(int64_t index, size_t size) {
  if (index < 0) index += static_cast<int64_t>(size);
  if (index < 0 || index >= static_cast<int64_t>(size)) return std::nullopt;
  return static_cast<size_t>(index);
}

}  // namespace

absl::StatusOr<Value> GetAttribute(const Value& object,
                                   const std::string& name) {
  if (object.is_undefined()) return UndefinedError(object);
  if (object.is_dict()) {
    Value method = BoundMethod(object, name);
    if (!method.is_undefined()) return method;
    const Value* item = object.dict().Find(name);
    if (item != nullptr) return *item;
    return Value::Undefined(
        absl::StrCat("'dict object' has no attribute '", name, "'"));
  }
  return BoundMethod(object, name);
}

absl::StatusOr<Value> GetItem(const Value& object, const Value& key) {
  if (object.is_undefined()) return UndefinedError(object);
  if (object.is_generator()) {
    // A generator is not subscriptable; jinja2 then gives undefined.
    return Value::Undefined("'generator' object is not subscriptable");
  }
  if (object.is_dict() && key.is_string()) {
    const Value* item = object.dict().Find(key.string_value());
    if (item != nullptr) return *item;
    return BoundMethod(object, key.string_value());
  }
  if (object.is_dict() && !object.dict().is_namespace) {
    if (const std::optional<std::string> stored = EncodeDictKey(key)) {
      const Value* item = object.dict().Find(*stored);
      if (item != nullptr) return *item;
    }
  }
  if ((object.is_list() || object.is_string()) && key.is_number() &&
      key.kind() != Value::Kind::kFloat) {
    if (object.is_list()) {
      auto i = Index(key.int_value(), object.list().size());
      if (i.has_value()) return object.list()[*i];
    } else {
      std::vector<std::string> cps = CodePoints(object.string_value());
      auto i = Index(key.int_value(), cps.size());
      if (i.has_value()) return Value::String(cps[*i]);
    }
    return Value::Undefined(absl::StrCat(
        object.TypeName(), " object has no element ", key.int_value()));
  }
  if (key.is_string()) return BoundMethod(object, key.string_value());
  return Value::Undefined(
      absl::StrCat(object.TypeName(), " object has no element ", key.Repr()));
}

absl::StatusOr<Value> GetSlice(const Value& object, const Value* start,
                               const Value* stop, const Value* step) {
  if (object.is_undefined()) return UndefinedError(object);
  std::vector<Value> items;
  std::vector<std::string> cps;
  int64_t size = 0;
  if (object.is_list()) {
    size = static_cast<int64_t>(object.list().size());
  } else if (object.is_string()) {
    cps = CodePoints(object.string_value());
    size = static_cast<int64_t>(cps.size());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("a ", object.TypeName(), " cannot be sliced"));
  }
  auto number = [](const Value* v) -> std::optional<int64_t> {
    if (v == nullptr || v->is_none() || v->is_undefined()) return std::nullopt;
    return v->int_value();
  };
  const int64_t by = number(step).value_or(1);
  if (by == 0) return absl::InvalidArgumentError("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](std::optional<int64_t> v, int64_t fallback) {
    if (!v.has_value()) return fallback;
    int64_t i = *v;
    if (i < 0) {
      i += size;
      if (i < 0) i = by < 0 ? -1 : 0;
    } else if (i >= size) {
      i = by < 0 ? size - 1 : size;
    }
    return i;
  };
  const int64_t from = adjust(number(start), by < 0 ? size - 1 : 0);
  const int64_t to = adjust(number(stop), by < 0 ? -1 : size);
  std::string text;
  for (int64_t i = from; by > 0 ? i < to : i > to; i += by) {
    if (object.is_list()) {
      items.push_back(object.list()[static_cast<size_t>(i)]);
    } else {
      text += cps[static_cast<size_t>(i)];
    }
  }
  if (object.is_tuple()) return Value::Tuple(std::move(items));
  return object.is_list() ? Value::List(std::move(items))
                          : Value::String(std::move(text));
}

}  // namespace loraplex::jinja
