#include "core/jinja/jinja_value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex::jinja {

const Value* CallArgs::Find(size_t index, const std::string& name) const {
  for (const auto& [key, value] : keyword) {
    if (key == name) return &value;
  }
  return index < positional.size() ? &positional[index] : nullptr;
}

namespace {

// Encoded keys: two NUL bytes, a type letter (n: None, b: bool, i: int, f:
// float), then the value.
constexpr absl::string_view kEncodedKey("\0\0", 2);

bool IsEncodedKey(const std::string& key) {
  return key.size() > 2 && key[0] == '\0' && key[1] == '\0';
}

// What Python's hash equality compares: booleans and integral floats as
// the int they equal.
std::string HashForm(const std::string& key) {
  if (!IsEncodedKey(key)) return key;
  const char type = key[2];
  const std::string body = key.substr(3);
  if (type == 'b') return absl::StrCat(kEncodedKey, "i", body == "1" ? 1 : 0);
  if (type == 'f') {
    const double d = std::strtod(body.c_str(), nullptr);
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.2e18) {
      return absl::StrCat(kEncodedKey, "i", static_cast<int64_t>(d));
    }
  }
  return key;
}

bool SameKey(const std::string& a, const std::string& b) {
  if (a == b) return true;
  if (!IsEncodedKey(a) || !IsEncodedKey(b)) return false;
  return HashForm(a) == HashForm(b);
}

}  // namespace

const Value* Dict::Find(const std::string& key) const {
  for (const auto& [k, v] : items) {
    if (SameKey(k, key)) return &v;
  }
  return nullptr;
}

void Dict::Set(const std::string& key, Value value) {
  for (auto& [k, v] : items) {
    if (SameKey(k, key)) {
      v = std::move(value);
      return;
    }
  }
  items.emplace_back(key, std::move(value));
}

std::optional<std::string> EncodeDictKey(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.string_value();
    case Value::Kind::kNone:
      return absl::StrCat(kEncodedKey, "n");
    case Value::Kind::kBool:
      return absl::StrCat(kEncodedKey, "b", key.bool_value() ? 1 : 0);
    case Value::Kind::kInt:
      return absl::StrCat(kEncodedKey, "i", key.int_value());
    case Value::Kind::kFloat: {
      char buffer[32];
      std::snprintf(buffer, sizeof(buffer), "%.17g", key.float_value());
      return absl::StrCat(kEncodedKey, "f", buffer);
    }
    default:
      return std::nullopt;
  }
}

Value DictKeyValue(const std::string& stored) {
  if (!IsEncodedKey(stored)) return Value::String(stored);
  const std::string body = stored.substr(3);
  switch (stored[2]) {
    case 'n':
      return Value::None();
    case 'b':
      return Value::Bool(body == "1");
    case 'i':
      return Value::Int(std::strtoll(body.c_str(), nullptr, 10));
    default:
      return Value::Float(std::strtod(body.c_str(), nullptr));
  }
}

Value Value::Undefined(std::string name) {
  Value v;
  v.string_ = std::move(name);
  return v;
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Bool(bool value) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = value;
  return v;
}

Value Value::Int(int64_t value) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = value;
  return v;
}

Value Value::Float(double value) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = value;
  return v;
}

Value Value::String(std::string value) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(value);
  return v;
}

Value Value::List(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const std::vector<Value>>(std::move(items));
  return v;
}

Value Value::Tuple(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::Generator(std::vector<Value> items) {
  Value v = List(std::move(items));
  v.generator_ = true;
  return v;
}

Value Value::Markup(std::string value) {
  Value v = String(std::move(value));
  v.markup_ = true;
  return v;
}

std::string HtmlEscape(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value Value::MakeDict(std::shared_ptr<Dict> dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::move(dict);
  return v;
}

Value Value::MakeFunction(std::string name, Function function) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.string_ = std::move(name);
  v.function_ = std::make_shared<const Function>(std::move(function));
  return v;
}

bool Value::Truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !string_.empty();
    case Kind::kList:
      return generator_ || !list_->empty();  // A generator object is true.
    case Kind::kDict:
      return dict_->is_namespace || !dict_->items.empty();
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string PythonFloatRepr(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  char buffer[64];
  auto [end, error] = std::to_chars(buffer, buffer + sizeof(buffer), value,
                                    std::chars_format::scientific);
  std::string sci(buffer, end);  // "-d.ddde+XX"
  std::string sign;
  if (sci[0] == '-') {
    sign = "-";
    sci.erase(0, 1);
  }
  const size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e + 1));
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  const int point = exponent + 1;  // value = 0.digits * 10^point
  const int n = static_cast<int>(digits.size());
  if (point <= -4 || point > 16) {
    std::string out = sign + digits.substr(0, 1);
    if (n > 1) absl::StrAppend(&out, ".", digits.substr(1));
    char exp_text[16];
    std::snprintf(exp_text, sizeof(exp_text), "e%c%02d",
                  exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp_text;
  }
  if (point <= 0) {
    return absl::StrCat(sign, "0.", std::string(-point, '0'), digits);
  }
  if (point >= n) {
    return absl::StrCat(sign, digits, std::string(point - n, '0'), ".0");
  }
  return absl::StrCat(sign, digits.substr(0, point), ".", digits.substr(point));
}

namespace {

std::string ReprString(const std::string& text) {
  const bool has_single = text.find('\'') != std::string::npos;
  const bool has_double = text.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : text) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

void AppendJsonString(const std::string& text, bool ensure_ascii,
                      std::string* out) {
  *out += '"';
  size_t pos = 0;
  while (pos < text.size()) {
    const unsigned char u = static_cast<unsigned char>(text[pos]);
    if (u >= 0x80) {
      const size_t start = pos;
      const char32_t c = NextCodePoint(text, &pos);
      if (!ensure_ascii) {
        out->append(text, start, pos - start);
        continue;
      }
      char hex[16];
      if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        std::snprintf(hex, sizeof(hex), "\\u%04x\\u%04x",
                      static_cast<unsigned>(0xD800 + (v >> 10)),
                      static_cast<unsigned>(0xDC00 + (v & 0x3FF)));
      } else {
        std::snprintf(hex, sizeof(hex), "\\u%04x", static_cast<unsigned>(c));
      }
      *out += hex;
      continue;
    }
    ++pos;
    switch (u) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      default:
        if (u < 0x20 || (ensure_ascii && u == 0x7f)) {
          char hex[8];
          std::snprintf(hex, sizeof(hex), "\\u%04x", u);
          *out += hex;
        } else {
          *out += static_cast<char>(u);
        }
    }
  }
  *out += '"';
}

absl::Status DumpJsonTo(const Value& value, const JsonDumpOptions& options,
                        const std::string& item_sep, const std::string& key_sep,
                        int depth, std::string* out) {
  auto newline = [&](int level) {
    if (!options.indent.has_value()) return;
    *out += '\n';
    out->append(static_cast<size_t>(std::max(0, *options.indent) * level), ' ');
  };
  switch (value.kind()) {
    case Value::Kind::kNone:
      *out += "null";
      return absl::OkStatus();
    case Value::Kind::kBool:
      *out += value.bool_value() ? "true" : "false";
      return absl::OkStatus();
    case Value::Kind::kInt:
      absl::StrAppend(out, value.int_value());
      return absl::OkStatus();
    case Value::Kind::kFloat: {
      const double f = value.float_value();
      if (std::isnan(f)) {
        *out += "NaN";
      } else if (std::isinf(f)) {
        *out += f > 0 ? "Infinity" : "-Infinity";
      } else {
        *out += PythonFloatRepr(f);
      }
      return absl::OkStatus();
    }
    case Value::Kind::kString:
      AppendJsonString(value.string_value(), options.ensure_ascii, out);
      return absl::OkStatus();
    case Value::Kind::kList: {
      if (value.is_generator()) {
        return absl::InvalidArgumentError(
            "Object of type generator is not JSON serializable");
      }
      if (value.list().empty()) {
        *out += "[]";
        return absl::OkStatus();
      }
      *out += '[';
      bool first = true;
      for (const Value& item : value.list()) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        if (absl::Status s =
                DumpJsonTo(item, options, item_sep, key_sep, depth + 1, out);
            !s.ok()) {
          return s;
        }
      }
      newline(depth);
      *out += ']';
      return absl::OkStatus();
    }
    case Value::Kind::kDict: {
      if (value.dict().items.empty()) {
        *out += "{}";
        return absl::OkStatus();
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : value.dict().items) items.push_back(&item);
      if (options.sort_keys) {
        // Python sorts the keys themselves: 2 before 10, str with int fails.
        absl::Status status;
        std::stable_sort(
            items.begin(), items.end(), [&](const auto* a, const auto* b) {
              absl::StatusOr<int> c =
                  Compare(DictKeyValue(a->first), DictKeyValue(b->first));
              if (!c.ok()) status = c.status();
              return c.ok() && *c < 0;
            });
        if (!status.ok()) return status;
      }
      *out += '{';
      bool first = true;
      for (const auto* item : items) {
        if (!first) *out += item_sep;
        first = false;
        newline(depth + 1);
        // json.dumps writes None, bool, int and float keys as strings.
        const Value key = DictKeyValue(item->first);
        const std::string key_text = key.is_string() ? key.string_value()
                                     : key.is_none() ? "null"
                                     : key.kind() == Value::Kind::kBool
                                         ? (key.bool_value() ? "true" : "false")
                                         : key.Str();
        AppendJsonString(key_text, options.ensure_ascii, out);
        *out += key_sep;
        if (absl::Status s = DumpJsonTo(item->second, options, item_sep,
                                        key_sep, depth + 1, out);
            !s.ok()) {
          return s;
        }
      }
      newline(depth);
      *out += '}';
      return absl::OkStatus();
    }
    case Value::Kind::kUndefined:
      return absl::InvalidArgumentError(absl::StrCat(
          "cannot serialize an undefined value (", value.name(), ")"));
    case Value::Kind::kFunction:
      return absl::InvalidArgumentError(absl::StrCat(
          "tojson: function ", value.name(), " is not JSON serializable"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string Value::Str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return absl::StrCat(int_);
    case Kind::kFloat:
      return PythonFloatRepr(float_);
    case Kind::kString:
      return string_;
    default:
      return Repr();
  }
}

std::string Value::Repr() const {
  switch (kind_) {
    case Kind::kString:
      return ReprString(string_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i > 0) out += ", ";
        out += (*list_)[i].Repr();
      }
      if (tuple_) return out + (list_->size() == 1 ? ",)" : ")");
      return out + "]";
    }
    case Kind::kDict: {
      if (dict_->is_namespace) return "<Namespace>";
      std::string out = "{";
      for (size_t i = 0; i < dict_->items.size(); ++i) {
        if (i > 0) out += ", ";
        absl::StrAppend(&out, DictKeyValue(dict_->items[i].first).Repr(), ": ",
                        dict_->items[i].second.Repr());
      }
      return out + "}";
    }
    case Kind::kFunction:
      return absl::StrCat("<function ", string_, ">");
    case Kind::kUndefined:
      return "Undefined";
    default:
      return Str();
  }
}

std::string Value::TypeName() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : generator_ ? "generator" : "list";
    case Kind::kDict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case Kind::kFunction:
      return "function";
  }
  return "value";
}

bool Value::Equals(const Value& other) const {
  if (is_number() && other.is_number()) {
    if (kind_ == Kind::kFloat || other.kind_ == Kind::kFloat) {
      return float_value() == other.float_value();
    }
    return int_value() == other.int_value();
  }
  if (kind_ != other.kind_) return false;
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return true;
    case Kind::kString:
      return string_ == other.string_;
    case Kind::kList: {
      if (tuple_ != other.tuple_) return false;
      if (list_->size() != other.list_->size()) return false;
      for (size_t i = 0; i < list_->size(); ++i) {
        if (!(*list_)[i].Equals((*other.list_)[i])) return false;
      }
      return true;
    }
    case Kind::kDict: {
      if (dict_ == other.dict_) return true;
      if (dict_->is_namespace || other.dict_->is_namespace) return false;
      if (dict_->items.size() != other.dict_->items.size()) return false;
      for (const auto& [key, value] : dict_->items) {
        const Value* theirs = other.dict_->Find(key);
        if (theirs == nullptr || !value.Equals(*theirs)) return false;
      }
      return true;
    }
    case Kind::kFunction:
      return function_ == other.function_;
    default:
      return false;
  }
}

std::vector<std::string> CodePoints(const std::string& text) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    pos += std::max<size_t>(
        1, Utf8SequenceLength(static_cast<unsigned char>(text[pos])));
    pos = std::min(pos, text.size());
    out.push_back(text.substr(start, pos - start));
  }
  return out;
}

std::optional<int64_t> Value::Length() const {
  switch (kind_) {
    case Kind::kString:
      return static_cast<int64_t>(CodePoints(string_).size());
    case Kind::kList:
      if (generator_) return std::nullopt;  // A generator has no len().
      return static_cast<int64_t>(list_->size());
    case Kind::kDict:
      return static_cast<int64_t>(dict_->items.size());
    case Kind::kUndefined:
      return 0;
    default:
      return std::nullopt;
  }
}

absl::StatusOr<std::vector<Value>> Value::Iterate() const {
  switch (kind_) {
    case Kind::kUndefined:
      return std::vector<Value>{};
    case Kind::kList:
      return *list_;
    case Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& item : dict_->items) {
        keys.push_back(DictKeyValue(item.first));
      }
      return keys;
    }
    case Kind::kString: {
      std::vector<Value> chars;
      for (std::string& c : CodePoints(string_)) {
        chars.push_back(String(std::move(c)));
      }
      return chars;
    }
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("'", TypeName(), "' object is not iterable"));
  }
}

absl::StatusOr<int> Compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind() == Value::Kind::kFloat || b.kind() == Value::Kind::kFloat) {
      const double x = a.float_value(), y = b.float_value();
      return x < y ? -1 : (x > y ? 1 : 0);
    }
    const int64_t x = a.int_value(), y = b.int_value();
    return x < y ? -1 : (x > y ? 1 : 0);
  }
  if (a.is_string() && b.is_string()) {
    // UTF-8 byte order is code point order.
    const int c = a.string_value().compare(b.string_value());
    return c < 0 ? -1 : (c > 0 ? 1 : 0);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("ordering is not supported between '", a.TypeName(),
                   "' and '", b.TypeName(), "'"));
}

absl::StatusOr<std::string> DumpJson(const Value& value,
                                     const JsonDumpOptions& options) {
  const std::string item_sep =
      options.item_separator.value_or(options.indent.has_value() ? "," : ", ");
  const std::string key_sep = options.key_separator.value_or(": ");
  std::string out;
  if (absl::Status s = DumpJsonTo(value, options, item_sep, key_sep, 0, &out);
      !s.ok()) {
    return s;
  }
  return out;
}

}  // namespace loraplex::jinja
