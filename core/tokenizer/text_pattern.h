// Patterns that split and replace text in the tokenizer.json pipeline, with
// the semantics of HF tokenizers' `Pattern::find_matches`: the text comes
// back cut into consecutive pieces, each flagged as a match or not.
//
// Regexes are written for Oniguruma (what HF tokenizers uses) and run on
// PCRE2 in UTF mode with Unicode properties; the few escapes whose meaning
// differs between the two (\s, \h, \w) are rewritten to their Oniguruma
// meaning first.
//
//   LORAPLEX_ASSIGN_OR_RETURN(TextPattern split, TextPattern::Regex(pattern));
//   LORAPLEX_ASSIGN_OR_RETURN(std::vector<PatternPiece> pieces,
//                             split.FindMatches(text));
#ifndef LORAPLEX_CORE_TOKENIZER_TEXT_PATTERN_H_
#define LORAPLEX_CORE_TOKENIZER_TEXT_PATTERN_H_

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

struct pcre2_real_code_8;

namespace loraplex {

struct PatternPiece {
  size_t start = 0;  // byte offsets into the searched text
  size_t end = 0;
  bool is_match = false;
};

class TextPattern {
 public:
  // An Oniguruma-syntax regular expression.
  static absl::StatusOr<TextPattern> Regex(std::string_view pattern);
  // `text` matched literally.
  static absl::StatusOr<TextPattern> Literal(std::string_view text);
  // Every code point for which `predicate` holds is a match of its own.
  static TextPattern CodePoints(bool (*predicate)(char32_t));

  // The same pattern with match and non-match swapped (HF's Invert).
  TextPattern Inverted() const;

  // Consecutive pieces covering all of `text` (valid UTF-8); an empty text
  // gives one empty non-match.
  absl::StatusOr<std::vector<PatternPiece>> FindMatches(
      std::string_view text) const;

  // The pattern as PCRE2 runs it (for error messages and tests).
  const std::string& pcre2_pattern() const { return pcre2_pattern_; }

 private:
  TextPattern() = default;
  absl::StatusOr<std::vector<PatternPiece>> FindRegexMatches(
      std::string_view text) const;
  std::vector<PatternPiece> FindCodePointMatches(std::string_view text) const;

  std::shared_ptr<pcre2_real_code_8> code_;
  std::string pcre2_pattern_;
  bool (*predicate_)(char32_t) = nullptr;
  bool literal_empty_ = false;
  bool inverted_ = false;
};

// `pattern` (Oniguruma syntax) with \s, \S, \h, \H, \w and \W spelled the
// way Oniguruma means them, for PCRE2.
absl::StatusOr<std::string> OnigurumaToPcre2(std::string_view pattern);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_TEXT_PATTERN_H_
