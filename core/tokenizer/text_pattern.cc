#include "core/tokenizer/text_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

// Oniguruma's \w: letters, marks, decimal digits, connector punctuation.
constexpr std::string_view kWordClassBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";

std::string Pcre2Error(int code) {
  PCRE2_UCHAR buffer[256];
  if (pcre2_get_error_message(code, buffer, sizeof(buffer)) < 0) {
    return absl::StrCat("PCRE2 error ", code);
  }
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* data) const { pcre2_match_data_free(data); }
};

}  // namespace

absl::StatusOr<std::string> OnigurumaToPcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 16);
  int class_depth = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char escape = pattern[++i];
      const bool in_class = class_depth > 0;
      switch (escape) {
        case 's':
          out += "\\p{White_Space}";
          break;
        case 'S':
          out += "\\P{White_Space}";
          break;
        case 'h':
          out += in_class ? "0-9a-fA-F" : "[0-9a-fA-F]";
          break;
        case 'w':
          out += in_class ? std::string(kWordClassBody)
                          : absl::StrCat("[", std::string(kWordClassBody), "]");
          break;
        case 'H':
        case 'W':
          if (in_class) {
            return absl::InvalidArgumentError(
                absl::StrCat("regex \\", std::string(1, escape),
                             " inside a character class is not supported"));
          }
          out += escape == 'H'
                     ? "[^0-9a-fA-F]"
                     : absl::StrCat("[^", std::string(kWordClassBody), "]");
          break;
        default:
          out.push_back('\\');
          out.push_back(escape);
      }
      continue;
    }
    if (c == '[') ++class_depth;
    if (c == ']' && class_depth > 0) --class_depth;
    out.push_back(c);
  }
  return out;
}

absl::StatusOr<TextPattern> TextPattern::Regex(std::string_view pattern) {
  TextPattern result;
  absl::StatusOr<std::string> translated = OnigurumaToPcre2(pattern);
  if (!translated.ok()) return translated.status();
  result.pcre2_pattern_ = *std::move(translated);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(result.pcre2_pattern_.data()),
                    result.pcre2_pattern_.size(), PCRE2_UTF | PCRE2_UCP, &error,
                    &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "regex \"", std::string(pattern),
        "\" does not compile: ", Pcre2Error(error), " at offset ", offset));
  }
  result.code_.reset(code, pcre2_code_free);
  // JIT is an optimisation only; the interpreter runs when it is missing.
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return result;
}

absl::StatusOr<TextPattern> TextPattern::Literal(std::string_view text) {
  if (text.empty()) {
    TextPattern result;
    result.literal_empty_ = true;
    return result;
  }
  std::string escaped = "\\Q";
  for (size_t i = 0; i < text.size(); ++i) {
    // \E cannot appear inside \Q...\E; close and reopen around it.
    if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == 'E') {
      escaped += "\\E\\\\\\QE";
      ++i;
      continue;
    }
    escaped.push_back(text[i]);
  }
  escaped += "\\E";
  TextPattern result;
  result.pcre2_pattern_ = escaped;
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(escaped.data()),
                    escaped.size(), PCRE2_UTF, &error, &offset, nullptr);
  if (code == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("pattern \"", std::string(text),
                     "\" does not compile: ", Pcre2Error(error)));
  }
  result.code_.reset(code, pcre2_code_free);
  pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
  return result;
}

TextPattern TextPattern::CodePoints(bool (*predicate)(char32_t)) {
  TextPattern result;
  result.predicate_ = predicate;
  return result;
}

TextPattern TextPattern::Inverted() const {
  TextPattern result = *this;
  result.inverted_ = !inverted_;
  return result;
}

absl::StatusOr<std::vector<PatternPiece>> TextPattern::FindMatches(
    std::string_view text) const {
  std::vector<PatternPiece> pieces;
  if (literal_empty_) {
    pieces.push_back({0, text.size(), false});
  } else if (text.empty()) {
    pieces.push_back({0, 0, false});
  } else if (predicate_ != nullptr) {
    pieces = FindCodePointMatches(text);
  } else {
    absl::StatusOr<std::vector<PatternPiece>> found = FindRegexMatches(text);
    if (!found.ok()) return found.status();
    pieces = *std::move(found);
  }
  if (inverted_) {
    for (PatternPiece& piece : pieces) piece.is_match = !piece.is_match;
  }
  return pieces;
}

absl::StatusOr<std::vector<PatternPiece>> TextPattern::FindRegexMatches(
    std::string_view text) const {
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> data(
      pcre2_match_data_create_from_pattern(code_.get(), nullptr));
  std::vector<PatternPiece> pieces;
  size_t previous_end = 0;
  size_t search_from = 0;
  bool matched_before = false;
  size_t last_match_end = 0;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (search_from <= text.size()) {
    const int rc = pcre2_match(code_.get(), subject, text.size(), search_from,
                               PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("regex \"", pcre2_pattern_,
                       "\" failed on the text: ", Pcre2Error(rc)));
    }
    const PCRE2_SIZE* vector = pcre2_get_ovector_pointer(data.get());
    const size_t start = vector[0];
    const size_t end = vector[1];
    if (start == end) {
      // An empty match: Oniguruma's iterator drops one right after the
      // previous match and searches again one code point further.
      search_from =
          start +
          (start < text.size()
               ? Utf8SequenceLength(static_cast<unsigned char>(text[start]))
               : 1);
      if (matched_before && start == last_match_end) continue;
    } else {
      search_from = end;
    }
    if (previous_end != start) pieces.push_back({previous_end, start, false});
    pieces.push_back({start, end, true});
    previous_end = end;
    matched_before = true;
    last_match_end = end;
  }
  if (previous_end != text.size()) {
    pieces.push_back({previous_end, text.size(), false});
  }
  return pieces;
}

std::vector<PatternPiece> TextPattern::FindCodePointMatches(
    std::string_view text) const {
  std::vector<PatternPiece> pieces;
  size_t last_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t start = pos;
    const char32_t c = NextCodePoint(text, &pos);
    if (!predicate_(c)) continue;
    if (last_offset < start) pieces.push_back({last_offset, start, false});
    pieces.push_back({start, pos, true});
    last_offset = pos;
  }
  if (pos > last_offset) pieces.push_back({last_offset, pos, false});
  return pieces;
}

}  // namespace loraplex
