// Python's %-formatting and str.format (jinja_format.h). Both share one
// number formatter; they differ in how specs are written and in errors.
#include "core/jinja/jinja_format.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/jinja/jinja_builtins.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex::jinja {
namespace {

// A parsed format spec ("*^+#010,.3f"); for %-formats, the flags mapped
// onto the same fields.
struct Spec {
  std::string fill = " ";  // One code point.
  char align = 0;          // '<' '>' '^' '=' or 0 (the type's default).
  char sign = '-';         // '-' '+' ' '
  bool alternate = false;  // '#'
  bool zero = false;       // '0' before the width
  int width = 0;
  char grouping = 0;  // ',' '_' or 0
  int precision = -1;
  char type = 0;
};

absl::StatusOr<Spec> ParseSpec(const std::string& text) {
  Spec spec;
  size_t i = 0;
  auto is_align = [](char c) {
    return c == '<' || c == '>' || c == '^' || c == '=';
  };
  const size_t first =
      text.empty()
          ? 0
          : std::max<size_t>(
                1, Utf8SequenceLength(static_cast<unsigned char>(text[0])));
  if (text.size() > first && is_align(text[first])) {
    spec.fill = text.substr(0, first);
    spec.align = text[first];
    i = first + 1;
  } else if (!text.empty() && is_align(text[0])) {
    spec.align = text[0];
    i = 1;
  }
  if (i < text.size() && (text[i] == '+' || text[i] == '-' || text[i] == ' ')) {
    spec.sign = text[i++];
  }
  if (i < text.size() && text[i] == '#') {
    spec.alternate = true;
    ++i;
  }
  if (i < text.size() && text[i] == '0') {
    spec.zero = true;
    ++i;
  }
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    spec.width = spec.width * 10 + (text[i++] - '0');
    if (spec.width > 4096) {
      return absl::InvalidArgumentError("format width is too large");
    }
  }
  if (i < text.size() && (text[i] == ',' || text[i] == '_')) {
    spec.grouping = text[i++];
  }
  if (i < text.size() && text[i] == '.') {
    ++i;
    if (i >= text.size() ||
        !std::isdigit(static_cast<unsigned char>(text[i]))) {
      return absl::InvalidArgumentError("Format specifier missing precision");
    }
    spec.precision = 0;
    while (i < text.size() &&
           std::isdigit(static_cast<unsigned char>(text[i]))) {
      spec.precision = spec.precision * 10 + (text[i++] - '0');
      if (spec.precision > 4096) {
        return absl::InvalidArgumentError("format precision is too large");
      }
    }
  }
  if (i < text.size()) spec.type = text[i++];
  if (i < text.size()) {
    return absl::InvalidArgumentError("Invalid format specifier");
  }
  return spec;
}

std::string Repeat(const std::string& fill, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) out += fill;
  return out;
}

// Pads `sign + prefix + digits` to the spec's width; '=' puts the padding
// after the sign and prefix (what '0' asks for).
std::string Pad(const std::string& head, const std::string& body,
                const Spec& spec, char default_align) {
  std::string fill = spec.fill;
  char align = spec.align;
  if (spec.zero && align == 0) {
    fill = "0";
    align = '=';
  }
  if (align == 0) align = default_align;
  const int length = static_cast<int>(CodePoints(head + body).size());
  const int pad = std::max(0, spec.width - length);
  switch (align) {
    case '<':
      return head + body + Repeat(fill, pad);
    case '^':
      return Repeat(fill, pad / 2) + head + body + Repeat(fill, pad - pad / 2);
    case '=':
      return head + Repeat(fill, pad) + body;
    default:
      return Repeat(fill, pad) + head + body;
  }
}

// Inserts `separator` every `every` digits of the leading run of digits.
std::string Group(const std::string& digits, char separator, int every) {
  if (separator == 0) return digits;
  size_t end = 0;
  while (end < digits.size() &&
         std::isxdigit(static_cast<unsigned char>(digits[end])) &&
         digits[end] != 'e' && digits[end] != 'E') {
    ++end;
  }
  std::string out;
  for (size_t i = 0; i < end; ++i) {
    if (i > 0 && (end - i) % every == 0) out += separator;
    out += digits[i];
  }
  return out + digits.substr(end);
}

std::string SignOf(bool negative, const Spec& spec) {
  if (negative) return "-";
  if (spec.sign == '+') return "+";
  if (spec.sign == ' ') return " ";
  return "";
}

// An integer with type one of d n b o x X c (0: d).
absl::StatusOr<std::string> FormatInt(int64_t value, const Spec& spec) {
  const bool negative = value < 0;
  uint64_t magnitude = negative ? 0 - static_cast<uint64_t>(value)
                                : static_cast<uint64_t>(value);
  if (spec.type == 'c') {
    if (negative || magnitude > 0x10FFFF) {
      return absl::InvalidArgumentError("%c arg not in range(0x110000)");
    }
    std::string out;
    AppendUtf8(static_cast<char32_t>(magnitude), &out);
    return Pad("", out, spec, '<');
  }
  int base = 10;
  std::string prefix;
  if (spec.type == 'x' || spec.type == 'X') base = 16;
  if (spec.type == 'o') base = 8;
  if (spec.type == 'b') base = 2;
  if (spec.alternate && base != 10) {
    prefix = std::string("0") + (spec.type == 'X' ? 'X' : spec.type);
  }
  const char* symbols =
      spec.type == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
  std::string digits;
  do {
    digits.insert(digits.begin(), symbols[magnitude % base]);
    magnitude /= base;
  } while (magnitude > 0);
  if (spec.precision > static_cast<int>(digits.size())) {  // %.3d
    digits.insert(0, spec.precision - digits.size(), '0');
  }
  digits = Group(digits, spec.grouping, base == 10 ? 3 : 4);
  return Pad(SignOf(negative, spec) + prefix, digits, spec, '>');
}

// A float with type one of e E f F g G n % (0: repr, or g keeping ".0").
std::string FormatFloat(double value, const Spec& spec) {
  const bool negative = std::signbit(value) && !std::isnan(value);
  double magnitude = std::fabs(value);
  char type = spec.type;
  int precision = spec.precision;
  std::string suffix;
  if (type == '%') {
    magnitude *= 100;
    type = 'f';
    suffix = "%";
  }
  std::string digits;
  if (type == 0 && precision < 0) {
    digits = PythonFloatRepr(magnitude);
  } else {
    if (precision < 0) precision = 6;
    char conversion = type == 0 || type == 'n' ? 'g' : type;
    if ((conversion == 'g' || conversion == 'G') && precision == 0) {
      precision = 1;
    }
    const std::string format = absl::StrCat("%", spec.alternate ? "#" : "",
                                            ".*", std::string(1, conversion));
    char buffer[512];
    const int n = std::snprintf(buffer, sizeof(buffer), format.c_str(),
                                precision, magnitude);
    digits.assign(buffer, n > 0 ? std::min<size_t>(n, sizeof(buffer) - 1) : 0);
    if (type == 0 && std::isfinite(magnitude) &&
        digits.find_first_of(".e") == std::string::npos) {
      digits += ".0";  // Python's general format keeps a float a float.
    }
  }
  digits = Group(digits, spec.grouping, 3) + suffix;
  return Pad(SignOf(negative, spec), digits, spec, '>');
}

// format(value, spec) for a str.format field.
absl::StatusOr<std::string> FormatField(const Value& value,
                                        const std::string& spec_text) {
  if (spec_text.empty()) return value.Str();
  LORAPLEX_ASSIGN_OR_RETURN(Spec spec, ParseSpec(spec_text));
  auto unknown = [&](const char* type_name) {
    return absl::InvalidArgumentError(
        absl::StrCat("Unknown format code '", std::string(1, spec.type),
                     "' for object of type '", type_name, "'"));
  };
  if (value.is_string()) {
    if (spec.type != 0 && spec.type != 's') return unknown("str");
    if (spec.sign != '-') {
      return absl::InvalidArgumentError(
          "Sign not allowed in string format specifier");
    }
    if (spec.align == '=') {
      return absl::InvalidArgumentError(
          "'=' alignment not allowed in string format specifier");
    }
    std::string text = value.string_value();
    if (spec.precision >= 0) {
      std::vector<std::string> cps = CodePoints(text);
      if (static_cast<int>(cps.size()) > spec.precision) {
        text.clear();
        for (int i = 0; i < spec.precision; ++i) text += cps[i];
      }
    }
    return Pad("", text, spec, '<');
  }
  const bool is_int =
      value.kind() == Value::Kind::kInt || value.kind() == Value::Kind::kBool;
  if (is_int) {
    const std::string_view int_types = "bcdoxXn";
    if (spec.type == 0 || int_types.find(spec.type) != std::string_view::npos) {
      if (spec.precision >= 0) {
        return absl::InvalidArgumentError(
            "Precision not allowed in integer format specifier");
      }
      return FormatInt(value.int_value(), spec);
    }
  }
  if (value.is_number()) {
    const std::string_view float_types = "eEfFgGn%";
    if (float_types.find(spec.type) == std::string_view::npos &&
        spec.type != 0) {
      return unknown(is_int ? "int" : "float");
    }
    return FormatFloat(value.float_value(), spec);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unsupported format string passed to ",
      value.is_undefined() ? "Undefined" : value.TypeName(), ".__format__"));
}

}  // namespace

absl::StatusOr<Value> PythonPercentFormat(const std::string& format,
                                          const Value& args) {
  // As CPython's PyUnicode_Format: a tuple is the values; any other mapping
  // (dict, list, Undefined) may be indexed by %(key)s and is never "not
  // all converted"; anything else is one value.
  const bool tuple = args.is_tuple();
  const bool mapping =
      !tuple && (args.is_list() || args.is_dict() || args.is_undefined());
  const int64_t count = tuple ? static_cast<int64_t>(args.list().size()) : -1;
  int64_t next = tuple ? 0 : -2;
  auto next_arg = [&]() -> absl::StatusOr<Value> {
    if (next == -2) {
      next = -1;
      return args;
    }
    if (next >= 0 && next < count) return args.list()[next++];
    return absl::InvalidArgumentError("not enough arguments for format string");
  };
  std::string out;
  size_t i = 0;
  while (i < format.size()) {
    const size_t percent = format.find('%', i);
    if (percent == std::string::npos) {
      out.append(format, i, std::string::npos);
      break;
    }
    out.append(format, i, percent - i);
    i = percent + 1;
    if (i >= format.size()) {
      return absl::InvalidArgumentError("incomplete format");
    }
    std::optional<Value> keyed;
    if (format[i] == '(') {
      if (!mapping)
        return absl::InvalidArgumentError("format requires a mapping");
      int depth = 1;
      size_t end = i + 1;
      for (; end < format.size() && depth > 0; ++end) {
        if (format[end] == '(') ++depth;
        if (format[end] == ')') --depth;
      }
      if (depth > 0) {
        return absl::InvalidArgumentError("incomplete format key");
      }
      const std::string key = format.substr(i + 1, end - i - 2);
      LORAPLEX_ASSIGN_OR_RETURN(keyed, GetItem(args, Value::String(key)));
      if (keyed->is_undefined() && args.is_dict()) {
        return absl::InvalidArgumentError(absl::StrCat("'", key, "'"));
      }
      i = end;
    }
    Spec spec;
    for (; i < format.size(); ++i) {
      const char c = format[i];
      if (c == '-') {
        spec.align = '<';
      } else if (c == '+' || c == ' ') {
        if (spec.sign != '+') spec.sign = c;
      } else if (c == '#') {
        spec.alternate = true;
      } else if (c == '0') {
        spec.zero = true;
      } else {
        break;
      }
    }
    if (spec.align == '<') spec.zero = false;
    while (i < format.size() &&
           std::isdigit(static_cast<unsigned char>(format[i]))) {
      spec.width = std::min(spec.width * 10 + (format[i++] - '0'), 4096);
    }
    if (i < format.size() && format[i] == '.') {
      spec.precision = 0;
      for (++i; i < format.size() &&
                std::isdigit(static_cast<unsigned char>(format[i]));
           ++i) {
        spec.precision =
            std::min(spec.precision * 10 + (format[i] - '0'), 4096);
      }
    }
    while (i < format.size() &&
           (format[i] == 'h' || format[i] == 'l' || format[i] == 'L')) {
      ++i;
    }
    if (i >= format.size()) {
      return absl::InvalidArgumentError("incomplete format");
    }
    const char conversion = format[i++];
    if (conversion == '%') {
      out += '%';
      continue;
    }
    Value value;
    if (keyed.has_value()) {
      value = *keyed;
    } else {
      LORAPLEX_ASSIGN_OR_RETURN(value, next_arg());
    }
    const bool number = value.is_number();
    switch (conversion) {
      case 's':
      case 'r':
      case 'a': {
        std::string text = conversion == 's' ? value.Str() : value.Repr();
        if (spec.precision >= 0) {
          std::vector<std::string> cps = CodePoints(text);
          if (static_cast<int>(cps.size()) > spec.precision) {
            text.clear();
            for (int k = 0; k < spec.precision; ++k) text += cps[k];
          }
        }
        spec.zero = false;
        spec.precision = -1;
        out += Pad("", text, spec, '>');
        break;
      }
      case 'd':
      case 'i':
      case 'u':
      case 'x':
      case 'X':
      case 'o': {
        const bool decimal =
            conversion == 'd' || conversion == 'i' || conversion == 'u';
        if (!number || (!decimal && value.kind() == Value::Kind::kFloat)) {
          return absl::InvalidArgumentError(absl::StrCat(
              "%", std::string(1, conversion),
              " format: ", decimal ? "a real number" : "an integer",
              " is required, not ", value.TypeName()));
        }
        spec.type = decimal ? 'd' : conversion;
        const int64_t n = value.kind() == Value::Kind::kFloat
                              ? static_cast<int64_t>(value.float_value())
                              : value.int_value();
        LORAPLEX_ASSIGN_OR_RETURN(std::string text, FormatInt(n, spec));
        out += text;
        break;
      }
      case 'e':
      case 'E':
      case 'f':
      case 'F':
      case 'g':
      case 'G':
        if (!number) {
          return absl::InvalidArgumentError(
              absl::StrCat("must be real number, not ", value.TypeName()));
        }
        spec.type = conversion;
        out += FormatFloat(value.float_value(), spec);
        break;
      case 'c': {
        if (value.is_string() && CodePoints(value.string_value()).size() == 1) {
          out += Pad("", value.string_value(), spec, '>');
          break;
        }
        if (value.kind() != Value::Kind::kInt) {
          return absl::InvalidArgumentError("%c requires int or char");
        }
        spec.type = 'c';
        if (spec.align == 0) spec.align = '>';
        LORAPLEX_ASSIGN_OR_RETURN(std::string text,
                                  FormatInt(value.int_value(), spec));
        out += text;
        break;
      }
      default: {
        char where[64];
        std::snprintf(where, sizeof(where), " (0x%x) at index %zu",
                      static_cast<unsigned char>(conversion), i - 1);
        return absl::InvalidArgumentError(
            absl::StrCat("unsupported format character '",
                         std::string(1, conversion), "'", where));
      }
    }
  }
  if (next < count && !mapping) {
    return absl::InvalidArgumentError(
        "not all arguments converted during string formatting");
  }
  return Value::String(std::move(out));
}

absl::StatusOr<Value> PythonStrFormat(const std::string& format,
                                      const CallArgs& args) {
  std::string out;
  int auto_index = 0;  // -1 once a field is numbered by hand.
  bool manual = false;
  // Resolves "0[key].attr" / "name" / "" to a value.
  auto field_value = [&](const std::string& field) -> absl::StatusOr<Value> {
    size_t end = field.find_first_of(".[");
    const std::string head = field.substr(0, end);
    Value value;
    if (head.empty() || std::isdigit(static_cast<unsigned char>(head[0]))) {
      size_t index = 0;
      if (head.empty()) {
        if (manual) {
          return absl::InvalidArgumentError(
              "cannot switch from manual field specification to automatic "
              "field numbering");
        }
        index = auto_index++;
      } else {
        if (auto_index > 0) {
          return absl::InvalidArgumentError(
              "cannot switch from automatic field numbering to manual field "
              "specification");
        }
        manual = true;
        index = std::strtoul(head.c_str(), nullptr, 10);
      }
      if (index >= args.positional.size()) {
        return absl::InvalidArgumentError("tuple index out of range");
      }
      value = args.positional[index];
    } else {
      const Value* found = nullptr;
      for (const auto& [key, v] : args.keyword) {
        if (key == head) found = &v;
      }
      if (found == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat("'", head, "'"));
      }
      value = *found;
    }
    while (end != std::string::npos && end < field.size()) {
      if (field[end] == '.') {
        const size_t next = field.find_first_of(".[", end + 1);
        LORAPLEX_ASSIGN_OR_RETURN(
            value, GetAttribute(value, field.substr(end + 1, next - end - 1)));
        end = next;
        continue;
      }
      const size_t close = field.find(']', end);
      if (close == std::string::npos) {
        return absl::InvalidArgumentError("Missing ']' in format string");
      }
      const std::string key = field.substr(end + 1, close - end - 1);
      const bool numeric =
          !key.empty() &&
          key.find_first_not_of("0123456789") == std::string::npos;
      LORAPLEX_ASSIGN_OR_RETURN(
          value, GetItem(value, numeric ? Value::Int(std::stoll(key))
                                        : Value::String(key)));
      end = close + 1;
    }
    return value;
  };
  size_t i = 0;
  while (i < format.size()) {
    const char c = format[i];
    if (c == '}') {
      if (i + 1 < format.size() && format[i + 1] == '}') {
        out += '}';
        i += 2;
        continue;
      }
      return absl::InvalidArgumentError(
          "Single '}' encountered in format string");
    }
    if (c != '{') {
      out += c;
      ++i;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      i += 2;
      continue;
    }
    // The field runs to the matching '}' (a spec may nest {width}).
    int depth = 1;
    size_t end = i + 1;
    for (; end < format.size(); ++end) {
      if (format[end] == '{') ++depth;
      if (format[end] == '}' && --depth == 0) break;
    }
    if (end >= format.size()) {
      return absl::InvalidArgumentError(
          "Single '{' encountered in format string");
    }
    const std::string field = format.substr(i + 1, end - i - 1);
    i = end + 1;
    size_t name_end = 0;
    for (int brackets = 0; name_end < field.size(); ++name_end) {
      const char f = field[name_end];
      if (f == '[') ++brackets;
      if (f == ']') --brackets;
      if (brackets == 0 && (f == '!' || f == ':')) break;
    }
    LORAPLEX_ASSIGN_OR_RETURN(Value value,
                              field_value(field.substr(0, name_end)));
    size_t rest = name_end;
    if (rest < field.size() && field[rest] == '!') {
      const char conversion = rest + 1 < field.size() ? field[rest + 1] : 0;
      if (conversion != 'r' && conversion != 's' && conversion != 'a') {
        return absl::InvalidArgumentError(
            "Unknown conversion specifier in format string");
      }
      value = Value::String(conversion == 's' ? value.Str() : value.Repr());
      rest += 2;
      if (rest < field.size() && field[rest] != ':') {
        return absl::InvalidArgumentError(
            "expected ':' after conversion specifier");
      }
    }
    std::string spec =
        rest < field.size() ? field.substr(rest + 1) : std::string();
    if (spec.find('{') != std::string::npos) {
      CallArgs nested = args;
      LORAPLEX_ASSIGN_OR_RETURN(Value expanded, PythonStrFormat(spec, nested));
      spec = expanded.string_value();
    }
    LORAPLEX_ASSIGN_OR_RETURN(std::string text, FormatField(value, spec));
    out += text;
  }
  return Value::String(std::move(out));
}

}  // namespace loraplex::jinja
