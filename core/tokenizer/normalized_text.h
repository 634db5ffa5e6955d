// A piece of text on its way through the tokenizer.json pipeline, with the
// span of the original input every byte came from (HF tokenizers'
// NormalizedString), so tokens can report where they came from.
//
//   NormalizedText text(input);           // identity alignment
//   text.Prepend("\xe2\x96\x81");         // "▁" aligned to the first char
//   LORAPLEX_ASSIGN_OR_RETURN(auto pieces,
//       text.Split(pattern, SplitBehavior::kIsolated));
#ifndef LORAPLEX_CORE_TOKENIZER_NORMALIZED_TEXT_H_
#define LORAPLEX_CORE_TOKENIZER_NORMALIZED_TEXT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "core/tokenizer/text_pattern.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {

// What Split does with the pieces a pattern matches (HF's
// SplitDelimiterBehavior).
enum class SplitBehavior {
  kRemoved,             // matches are dropped
  kIsolated,            // every match is a piece of its own
  kMergedWithPrevious,  // a match joins the piece before it
  kMergedWithNext,      // a match joins the piece after it
  kContiguous,          // consecutive matches form one piece
};

class NormalizedText {
 public:
  NormalizedText() = default;
  // `original` (valid UTF-8) starting at byte `offset` of the input.
  NormalizedText(std::string_view original, uint32_t offset);

  const std::string& text() const { return text_; }
  bool empty() const { return text_.empty(); }
  // The span of the original input that normalized bytes [begin, end) came
  // from; for an empty range, an empty span where the piece starts.
  TextSpan OriginalSpan(size_t begin, size_t end) const;
  TextSpan OriginalSpan() const { return OriginalSpan(0, text_.size()); }

  // Normalized bytes [begin, end) (on code point boundaries).
  NormalizedText Slice(size_t begin, size_t end) const;

  // Puts `prefix` before a non-empty text, aligned to its first character.
  void Prepend(std::string_view prefix);
  // Replaces every match of `pattern` with `content`, aligned to the last
  // byte of what it replaces.
  absl::Status Replace(const TextPattern& pattern, std::string_view content);
  // Replaces each code point by `map(c)` (one or more code points, aligned
  // to the code point they come from).
  void MapCodePoints(const std::function<void(char32_t, std::u32string*)>& map);
  // Replaces each byte of the text by `map[byte]` (UTF-8), aligned to the
  // character the byte belongs to: the ByteLevel step.
  void MapBytes(const std::string (&map)[256]);
  // Unicode normalization; decomposed pieces keep their character's span,
  // a composite its starter's (NormalizeCodePoints).
  absl::Status Normalize(UnicodeForm form);
  // Removes leading and/or trailing whitespace.
  void Strip(bool left, bool right);

  // The pieces HF's NormalizedString::split gives; empty pieces are dropped.
  absl::StatusOr<std::vector<NormalizedText>> Split(
      const TextPattern& pattern, SplitBehavior behavior) const;

 private:
  std::string text_;
  std::vector<TextSpan> alignment_;  // one span per byte of text_
  uint32_t offset_ = 0;              // where an empty text sits
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_NORMALIZED_TEXT_H_
