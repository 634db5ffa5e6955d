#include "core/tokenizer/text_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <cctype>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/hf_unicode_tables.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

void AppendRange(char32_t first, char32_t last, std::string* out) {
  absl::StrAppend(out, "\\x{", absl::Hex(first), "}");
  if (last != first) absl::StrAppend(out, "-\\x{", absl::Hex(last), "}");
}

// The members of general category `name` (one letter: its group; two
// letters: itself) as HF's Oniguruma has them, written as the inside of a
// PCRE2 character class: PCRE2's \p{..} plus the code points its older
// tables leave out, or HF's whole set where a code point changed category
// (hf_unicode_tables.h). Empty for a name that is no general category.
std::string CategoryClassBody(std::string_view name) {
  static constexpr std::string_view kCategories[] = {
      "Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl",
      "No", "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po", "Sm", "Sc",
      "Sk", "So", "Zs", "Zl", "Zp", "Cc", "Cf", "Co", "Cn", "Cs"};
  if (name.empty() || name.size() > 2) return "";
  std::string body;
  bool known = false;
  bool exact_member = false;
  for (std::string_view category : kCategories) {
    if (category.substr(0, name.size()) != name) continue;
    known = true;
    for (const hf_unicode::PropertyRange& r : hf_unicode::kPropertyExact) {
      exact_member = exact_member || category == r.name;
    }
  }
  if (!known) return "";
  if (!exact_member) body = absl::StrCat("\\p{", std::string(name), "}");
  for (std::string_view category : kCategories) {
    if (category.substr(0, name.size()) != name) continue;
    bool exact = false;
    for (const hf_unicode::PropertyRange& r : hf_unicode::kPropertyExact) {
      if (category != r.name) continue;
      exact = true;
      AppendRange(r.first, r.last, &body);
    }
    if (exact_member && !exact) {
      absl::StrAppend(&body, "\\p{", std::string(category), "}");
    }
    for (const hf_unicode::PropertyRange& r : hf_unicode::kPropertyAdded) {
      if (category == r.name) AppendRange(r.first, r.last, &body);
    }
  }
  return body;
}

// Whether PCRE2 knows `name` as a script (\p{sc:name}).
bool Pcre2KnowsScript(std::string_view name) {
  for (char c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_') return false;
  }
  const std::string probe = absl::StrCat("\\p{sc:", std::string(name), "}");
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(probe.data()), probe.size(),
                    PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  if (code == nullptr) return false;
  pcre2_code_free(code);
  return true;
}

// The members of script `name` as HF's Oniguruma has them (its \p{Han} is
// the Script property; PCRE2's \p{Han} is Script_Extensions, \p{sc:Han} its
// Script), as the inside of a character class: \p{sc:..} plus what PCRE2's
// older tables leave out, or HF's whole set where PCRE2 lacks the script or
// a code point moved. Empty for a name that is no script (a binary
// property such as Alphabetic stays PCRE2's).
std::string ScriptClassBody(std::string_view name) {
  std::string body;
  for (const hf_unicode::PropertyRange& r : hf_unicode::kPropertyExact) {
    if (name == r.name) AppendRange(r.first, r.last, &body);
  }
  if (!body.empty()) return body;
  if (name.empty() || !Pcre2KnowsScript(name)) return "";
  body = absl::StrCat("\\p{sc:", std::string(name), "}");
  for (const hf_unicode::PropertyRange& r : hf_unicode::kPropertyAdded) {
    if (name == r.name) AppendRange(r.first, r.last, &body);
  }
  return body;
}

// A general category's or a script's members as HF has them, or empty.
std::string PropertyClassBody(std::string_view name) {
  std::string body = CategoryClassBody(name);
  return body.empty() ? ScriptClassBody(name) : body;
}

// Oniguruma's \w: letters, marks, decimal digits, connector punctuation.
std::string WordClassBody() {
  return absl::StrCat(CategoryClassBody("L"), CategoryClassBody("M"),
                      CategoryClassBody("Nd"), CategoryClassBody("Pc"));
}

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
          out += in_class ? WordClassBody()
                          : absl::StrCat("[", WordClassBody(), "]");
          break;
        case 'd':
          out += in_class ? CategoryClassBody("Nd")
                          : absl::StrCat("[", CategoryClassBody("Nd"), "]");
          break;
        case 'p':
        case 'P': {
          // \p{Xx}, \P{Xx}, \p{^Xx} with a general category or a script:
          // HF's members.
          const size_t close = pattern.find('}', i);
          if (i + 1 >= pattern.size() || pattern[i + 1] != '{' ||
              close == std::string_view::npos) {
            out.push_back('\\');
            out.push_back(escape);
            break;
          }
          std::string_view name = pattern.substr(i + 2, close - i - 2);
          bool negated = escape == 'P';
          if (!name.empty() && name[0] == '^') {
            negated = !negated;
            name.remove_prefix(1);
          }
          const std::string body = PropertyClassBody(name);
          if (body.empty() || (negated && in_class)) {
            // Neither a general category nor a script, or a complement
            // inside a class (which a class cannot spell): PCRE2's own.
            out.push_back('\\');
            out.append(pattern.substr(i, close - i + 1));
          } else if (in_class) {
            out += body;
          } else {
            absl::StrAppend(&out, negated ? "[^" : "[", body, "]");
          }
          i = close;
          break;
        }
        case 'H':
        case 'W':
          if (in_class) {
            return absl::InvalidArgumentError(
                absl::StrCat("regex \\", std::string(1, escape),
                             " inside a character class is not supported"));
          }
          out += escape == 'H' ? "[^0-9a-fA-F]"
                               : absl::StrCat("[^", WordClassBody(), "]");
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
