// UTF-8 and Unicode helpers for the tokenizer.json pipeline: code point
// iteration, character classes as Rust's `char` methods define them (which
// HF tokenizers uses), Unicode normalization forms through utf8proc, and
// Rust's `String::from_utf8_lossy` for decoding byte tokens.
//
//   size_t pos = 0;
//   while (pos < text.size()) {
//     const char32_t c = NextCodePoint(text, &pos);  // text is valid UTF-8
//     if (IsWhitespace(c)) ...
//   }
#ifndef LORAPLEX_CORE_TOKENIZER_UNICODE_TEXT_H_
#define LORAPLEX_CORE_TOKENIZER_UNICODE_TEXT_H_

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loraplex {

// The code point starting at *pos of valid UTF-8 `text`; advances *pos.
char32_t NextCodePoint(std::string_view text, size_t* pos);

// Byte length of the UTF-8 sequence that `lead` starts (1 for stray bytes).
size_t Utf8SequenceLength(unsigned char lead);

void AppendUtf8(char32_t c, std::string* out);

// Rust's String::from_utf8_lossy: every maximal invalid subsequence becomes
// one U+FFFD. Valid input comes back unchanged.
std::string Utf8Lossy(std::string_view bytes);

bool IsValidUtf8(std::string_view bytes);

// Rust char::is_whitespace (the White_Space property).
bool IsWhitespace(char32_t c);
// Rust char::is_numeric (general categories Nd, Nl, No).
bool IsNumeric(char32_t c);
// Unicode punctuation (general category P*) or ASCII punctuation, as HF
// tokenizers' Punctuation pre-tokenizer defines it.
bool IsPunctuation(char32_t c);

// Code points where the Rust regex crate's \w (HF's test for single_word
// added tokens) differs from PCRE2's [\p{Alphabetic}\p{M}\p{Nd}\p{Pc}
// \p{Join_Control}]: a word character it lacks, or one it has in excess.
bool IsHfWordCharacterOverride(char32_t c);
bool IsHfNonWordCharacterOverride(char32_t c);

enum class UnicodeForm { kNfc, kNfd, kNfkc, kNfkd };

// `text` (valid UTF-8) in normalization form `form`.
absl::StatusOr<std::string> NormalizeUnicode(std::string_view text,
                                             UnicodeForm form);

// `text` in normalization form `form`, computed code point by code point
// (decomposition, canonical reordering, composition) so that each output
// code point knows the input code point it comes from: decomposed pieces
// come from their source, a composite from its starter (as HF tokenizers
// aligns them). `origin` gets one input index per output code point.
std::u32string NormalizeCodePoints(const std::u32string& text, UnicodeForm form,
                                   std::vector<size_t>* origin);

// Rust's char::to_lowercase: the simple mapping, plus the one
// unconditional multi-character mapping of SpecialCasing.txt (U+0130 ->
// "i\u0307"). Appends to `out`.
void AppendLowercase(char32_t c, std::u32string* out);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_UNICODE_TEXT_H_
