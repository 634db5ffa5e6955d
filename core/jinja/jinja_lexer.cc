#include "core/jinja/jinja_lexer.h"

#include <algorithm>
#include <cctype>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex::jinja {
namespace {

// Python's str.isspace() for the ASCII range (what \s matches in the
// lexer's regular expressions, for the text templates have).
bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' ||
         c == '\v';
}

std::string RStrip(std::string text) {
  while (!text.empty() && IsSpace(text.back())) text.pop_back();
  return text;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja normalizes newlines and, without keep_trailing_newline, drops
    // one final newline.
    for (size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        source_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        source_ += source[i];
      }
    }
    if (!source_.empty() && source_.back() == '\n') source_.pop_back();
  }

  absl::StatusOr<std::vector<Token>> Run() {
    bool line_starting = true;
    bool strip_next = false;  // The previous tag ended with '-'.
    while (pos_ < source_.size()) {
      size_t tag = pos_;
      while (true) {
        tag = source_.find('{', tag);
        if (tag == std::string::npos || tag + 1 >= source_.size()) {
          tag = source_.size();
          break;
        }
        const char next = source_[tag + 1];
        if (next == '{' || next == '%' || next == '#') break;
        ++tag;
      }
      std::string text = source_.substr(pos_, tag - pos_);
      if (strip_next) {
        size_t skip = 0;
        while (skip < text.size() && IsSpace(text[skip])) ++skip;
        text.erase(0, skip);
      }
      const int text_line = line_;
      line_ += static_cast<int>(
          std::count(source_.begin() + pos_, source_.begin() + tag, '\n'));
      if (tag == source_.size()) {
        Emit(TokenType::kText, std::move(text), text_line);
        break;
      }
      const char kind = source_[tag + 1];
      const char sign = tag + 2 < source_.size() ? source_[tag + 2] : '\0';
      if (sign == '-') {
        text = RStrip(std::move(text));
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: a block or comment tag alone on its line takes the
        // line's indentation with it.
        const size_t line_start = text.rfind('\n') + 1;  // npos + 1 == 0
        if ((line_start > 0 || line_starting) && line_start < text.size()) {
          bool blank = true;
          for (size_t i = line_start; i < text.size(); ++i) {
            blank = blank && IsSpace(text[i]);
          }
          if (blank) text.erase(line_start);
        }
      }
      Emit(TokenType::kText, std::move(text), text_line);
      pos_ = tag + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        LORAPLEX_RETURN_IF_ERROR(SkipComment(&strip_next, &line_starting));
        continue;
      }
      const bool block = kind == '%';
      Emit(block ? TokenType::kBlockBegin : TokenType::kVarBegin, "", line_);
      LORAPLEX_RETURN_IF_ERROR(LexTag(block, &strip_next, &line_starting));
    }
    Emit(TokenType::kEnd, "", line_);
    return std::move(tokens_);
  }

 private:
  void Emit(TokenType type, std::string text, int line) {
    if (type == TokenType::kText && text.empty()) return;
    tokens_.push_back({type, std::move(text), line});
  }

  // After a tag's closing delimiter: '-' strips the whitespace that
  // follows; otherwise block and comment tags (trim_blocks) eat one newline.
  void AfterClose(bool minus, bool plus, bool trim, bool* strip_next,
                  bool* line_starting) {
    *strip_next = minus;
    *line_starting = false;
    if (minus) {
      size_t end = pos_;
      while (end < source_.size() && IsSpace(source_[end])) ++end;
      *line_starting = end > pos_ && source_[end - 1] == '\n';
    } else if (trim && !plus && pos_ < source_.size() &&
               source_[pos_] == '\n') {
      ++pos_;
      ++line_;
      *line_starting = true;
    }
  }

  absl::Status SkipComment(bool* strip_next, bool* line_starting) {
    const size_t end = source_.find("#}", pos_);
    if (end == std::string::npos) {
      return ErrorAt(line_, "a comment is not closed with #}");
    }
    const bool minus = end > pos_ && source_[end - 1] == '-';
    const bool plus = end > pos_ && source_[end - 1] == '+';
    line_ += static_cast<int>(
        std::count(source_.begin() + pos_, source_.begin() + end, '\n'));
    pos_ = end + 2;
    AfterClose(minus, plus, /*trim=*/true, strip_next, line_starting);
    return absl::OkStatus();
  }

  absl::Status LexTag(bool block, bool* strip_next, bool* line_starting) {
    const char close = block ? '%' : '}';
    int depth = 0;
    while (true) {
      while (pos_ < source_.size() && IsSpace(source_[pos_])) {
        if (source_[pos_] == '\n') ++line_;
        ++pos_;
      }
      if (pos_ >= source_.size()) {
        return ErrorAt(line_, block ? "a tag is not closed with %}"
                                    : "an expression is not closed with }}");
      }
      const char c = source_[pos_];
      auto at = [&](std::string_view s) {
        return source_.compare(pos_, s.size(), s) == 0;
      };
      if (depth == 0) {
        const bool minus = c == '-' && pos_ + 2 < source_.size() + 0 &&
                           source_[pos_ + 1] == close &&
                           source_[pos_ + 2] == '}';
        const bool plus = block && c == '+' && pos_ + 2 < source_.size() + 0 &&
                          source_[pos_ + 1] == close &&
                          source_[pos_ + 2] == '}';
        if (minus || plus || (c == close && at(block ? "%}" : "}}"))) {
          pos_ += (minus || plus) ? 3 : 2;
          Emit(block ? TokenType::kBlockEnd : TokenType::kVarEnd, "", line_);
          AfterClose(minus, plus, /*trim=*/block, strip_next, line_starting);
          return absl::OkStatus();
        }
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos_;
        while (end < source_.size() &&
               (std::isalnum(static_cast<unsigned char>(source_[end])) ||
                source_[end] == '_')) {
          ++end;
        }
        Emit(TokenType::kName, source_.substr(pos_, end - pos_), line_);
        pos_ = end;
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        LexNumber();
        continue;
      }
      if (c == '\'' || c == '"') {
        LORAPLEX_RETURN_IF_ERROR(LexString(c));
        continue;
      }
      static constexpr std::string_view kTwo[] = {
          "//", "**", "==", "!=", "<=", ">="};
      bool two = false;
      for (std::string_view op : kTwo) {
        if (at(op)) {
          Emit(TokenType::kOp, std::string(op), line_);
          pos_ += 2;
          two = true;
          break;
        }
      }
      if (two) continue;
      if (std::string_view("+-*/%~()[]{}<>=.:|,").find(c) ==
          std::string_view::npos) {
        return ErrorAt(line_, absl::StrCat("unexpected character '",
                                           std::string(1, c), "'"));
      }
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      Emit(TokenType::kOp, std::string(1, c), line_);
      ++pos_;
    }
  }

  void LexNumber() {
    size_t end = pos_;
    auto digits = [&] {
      while (end < source_.size() &&
             (std::isdigit(static_cast<unsigned char>(source_[end])) ||
              source_[end] == '_')) {
        ++end;
      }
    };
    digits();
    bool is_float = false;
    if (end + 1 < source_.size() && source_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(source_[end + 1]))) {
      is_float = true;
      ++end;
      digits();
    }
    if (end < source_.size() && (source_[end] == 'e' || source_[end] == 'E')) {
      size_t e = end + 1;
      if (e < source_.size() && (source_[e] == '+' || source_[e] == '-')) ++e;
      if (e < source_.size() &&
          std::isdigit(static_cast<unsigned char>(source_[e]))) {
        is_float = true;
        end = e;
        digits();
      }
    }
    std::string text;
    for (size_t i = pos_; i < end; ++i) {
      if (source_[i] != '_') text += source_[i];
    }
    Emit(is_float ? TokenType::kFloat : TokenType::kInt, std::move(text),
         line_);
    pos_ = end;
  }

  // A string literal with Python's escapes (Jinja decodes them with
  // "unicode-escape"); unknown escapes stay as written.
  absl::Status LexString(char quote) {
    const int line = line_;
    std::string value;
    size_t i = pos_ + 1;
    while (true) {
      if (i >= source_.size()) {
        return ErrorAt(line, "a string literal is not closed");
      }
      const char c = source_[i];
      if (c == quote) break;
      if (c == '\n') ++line_;
      if (c != '\\' || i + 1 >= source_.size()) {
        value += c;
        ++i;
        continue;
      }
      const char e = source_[i + 1];
      i += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '0':
          value += '\0';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\\':
        case '\'':
        case '"':
          value += e;
          break;
        case '\n':
          ++line_;
          break;
        case 'x':
        case 'u':
        case 'U': {
          const size_t width = e == 'x' ? 2 : (e == 'u' ? 4 : 8);
          if (i + width > source_.size()) {
            return ErrorAt(line_, "a string has a truncated \\x/\\u escape");
          }
          const std::string hex = source_.substr(i, width);
          if (hex.find_first_not_of("0123456789abcdefABCDEF") !=
              std::string::npos) {
            return ErrorAt(line_,
                           absl::StrCat("bad escape \\", std::string(1, e), hex,
                                        " in a string"));
          }
          AppendUtf8(static_cast<char32_t>(std::stoul(hex, nullptr, 16)),
                     &value);
          i += width;
          break;
        }
        default:
          value += '\\';
          value += e;
      }
    }
    Emit(TokenType::kString, std::move(value), line);
    pos_ = i + 1;
    return absl::OkStatus();
  }

  std::string source_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> tokens_;
};

}  // namespace

absl::Status ErrorAt(int line, std::string_view message) {
  return absl::InvalidArgumentError(
      absl::StrCat("line ", line, ": ", std::string(message)));
}

absl::StatusOr<std::vector<Token>> LexTemplate(std::string_view source) {
  Lexer lexer(source);
  return lexer.Run();
}

}  // namespace loraplex::jinja
