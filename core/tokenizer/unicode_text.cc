#include "core/tokenizer/unicode_text.h"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <memory>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/hf_unicode_tables.h"

namespace loraplex {
namespace {

// Whether `c` lies in one of `ranges` (sorted, disjoint; an empty range has
// first > last).
template <size_t N>
bool InRanges(const hf_unicode::Range (&ranges)[N], char32_t c) {
  const hf_unicode::Range* end = ranges + N;
  const hf_unicode::Range* it = std::upper_bound(
      ranges, end, c, [](char32_t value, const hf_unicode::Range& r) {
        return value < r.first;
      });
  return it != ranges && c <= (it - 1)->last && (it - 1)->first <= c;
}

// HF's normalizers know Unicode 9.0: later combining marks and
// decompositions are unassigned to them (hf_unicode_tables.h).
bool UnknownToNormalization(char32_t c) {
  return InRanges(hf_unicode::kNormalizationUnassigned, c);
}

// Length of the valid UTF-8 prefix of bytes[pos..] that starts a code point:
// the whole sequence when valid, else how many bytes form the maximal
// subpart of an ill-formed sequence (at least 1), negated.
int ValidSequenceAt(std::string_view bytes, size_t pos) {
  const auto byte = [&](size_t i) {
    return static_cast<unsigned char>(bytes[i]);
  };
  const unsigned char lead = byte(pos);
  if (lead < 0x80) return 1;
  int length = 0;
  unsigned char low = 0x80, high = 0xBF;  // range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return -1;
  }
  for (int i = 1; i < length; ++i) {
    if (pos + i >= bytes.size()) return -i;
    const unsigned char next = byte(pos + i);
    const bool ok =
        i == 1 ? next >= low && next <= high : next >= 0x80 && next <= 0xBF;
    if (!ok) return -i;
  }
  return length;
}

utf8proc_category_t Category(char32_t c) {
  return utf8proc_category(static_cast<utf8proc_int32_t>(c));
}

}  // namespace

size_t Utf8SequenceLength(unsigned char lead) {
  if (lead < 0xC0) return 1;
  if (lead < 0xE0) return 2;
  if (lead < 0xF0) return 3;
  return 4;
}

char32_t NextCodePoint(std::string_view text, size_t* pos) {
  const unsigned char lead = static_cast<unsigned char>(text[*pos]);
  const size_t length = Utf8SequenceLength(lead);
  char32_t c = length == 1   ? lead
               : length == 2 ? lead & 0x1F
               : length == 3 ? lead & 0x0F
                             : lead & 0x07;
  for (size_t i = 1; i < length && *pos + i < text.size(); ++i) {
    c = (c << 6) | (static_cast<unsigned char>(text[*pos + i]) & 0x3F);
  }
  *pos += length;
  return c;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string Utf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  size_t pos = 0;
  while (pos < bytes.size()) {
    const int length = ValidSequenceAt(bytes, pos);
    if (length > 0) {
      out.append(bytes.substr(pos, length));
      pos += length;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      pos += -length;
    }
  }
  return out;
}

bool IsValidUtf8(std::string_view bytes) {
  size_t pos = 0;
  while (pos < bytes.size()) {
    const int length = ValidSequenceAt(bytes, pos);
    if (length < 0) return false;
    pos += length;
  }
  return true;
}

bool IsWhitespace(char32_t c) {
  if ((c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85) return true;
  if (c < 0xA0) return false;
  if (InRanges(hf_unicode::kWhitespaceAdded, c)) return true;
  if (InRanges(hf_unicode::kWhitespaceRemoved, c)) return false;
  const utf8proc_category_t category = Category(c);
  return category == UTF8PROC_CATEGORY_ZS || category == UTF8PROC_CATEGORY_ZL ||
         category == UTF8PROC_CATEGORY_ZP;
}

bool IsHfWordCharacterOverride(char32_t c) {
  return InRanges(hf_unicode::kWordAdded, c);
}

bool IsHfNonWordCharacterOverride(char32_t c) {
  return InRanges(hf_unicode::kWordRemoved, c);
}

bool IsNumeric(char32_t c) {
  if (InRanges(hf_unicode::kNumericAdded, c)) return true;
  if (InRanges(hf_unicode::kNumericRemoved, c)) return false;
  const utf8proc_category_t category = Category(c);
  return category == UTF8PROC_CATEGORY_ND || category == UTF8PROC_CATEGORY_NL ||
         category == UTF8PROC_CATEGORY_NO;
}

bool IsPunctuation(char32_t c) {
  if (c < 0x80) {
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) ||
           (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
  }
  // HF's table (crate unicode_categories) is older than utf8proc's.
  if (InRanges(hf_unicode::kPunctuationAdded, c)) return true;
  if (InRanges(hf_unicode::kPunctuationRemoved, c)) return false;
  switch (Category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

absl::StatusOr<std::string> NormalizeUnicode(std::string_view text,
                                             UnicodeForm form) {
  if (text.empty()) return std::string();
  std::u32string chars;
  bool unknown = false;
  for (size_t pos = 0; pos < text.size();) {
    chars.push_back(NextCodePoint(text, &pos));
    unknown = unknown || UnknownToNormalization(chars.back());
  }
  if (unknown) {  // utf8proc would use its newer data for these
    std::vector<size_t> origin;
    std::string out;
    for (char32_t c : NormalizeCodePoints(chars, form, &origin)) {
      AppendUtf8(c, &out);
    }
    return out;
  }
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::kNfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case UnicodeForm::kNfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case UnicodeForm::kNfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case UnicodeForm::kNfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                   static_cast<utf8proc_ssize_t>(text.size()), &result,
                   static_cast<utf8proc_option_t>(options));
  if (length < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Unicode normalization failed: ", utf8proc_errmsg(length)));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result,
                                                                &std::free);
  return std::string(reinterpret_cast<const char*>(result),
                     static_cast<size_t>(length));
}

namespace {

int CombiningClass(char32_t c) {
  if (UnknownToNormalization(c)) return 0;
  return utf8proc_get_property(static_cast<utf8proc_int32_t>(c))
      ->combining_class;
}

// The primary composite of `starter` followed by `mark`, or 0.
char32_t Compose(char32_t starter, char32_t mark) {
  if (UnknownToNormalization(starter) || UnknownToNormalization(mark)) {
    return 0;
  }
  std::string pair;
  AppendUtf8(starter, &pair);
  AppendUtf8(mark, &pair);
  absl::StatusOr<std::string> composed =
      NormalizeUnicode(pair, UnicodeForm::kNfc);
  if (!composed.ok() || composed->empty()) return 0;
  size_t pos = 0;
  const char32_t c = NextCodePoint(*composed, &pos);
  return pos == composed->size() && !UnknownToNormalization(c) ? c : 0;
}

}  // namespace

std::u32string NormalizeCodePoints(const std::u32string& text, UnicodeForm form,
                                   std::vector<size_t>* origin) {
  const bool compat = form == UnicodeForm::kNfkc || form == UnicodeForm::kNfkd;
  const bool compose = form == UnicodeForm::kNfc || form == UnicodeForm::kNfkc;
  // 1. Decompose each code point.
  std::u32string decomposed;
  std::vector<size_t> from;
  utf8proc_int32_t buffer[32];
  const auto options = static_cast<utf8proc_option_t>(
      UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0));
  for (size_t i = 0; i < text.size(); ++i) {
    if (UnknownToNormalization(text[i])) {
      decomposed.push_back(text[i]);
      from.push_back(i);
      continue;
    }
    int boundclass = 0;
    const utf8proc_ssize_t count =
        utf8proc_decompose_char(static_cast<utf8proc_int32_t>(text[i]), buffer,
                                32, options, &boundclass);
    if (count <= 0 || count > 32) {  // cannot happen for valid code points
      decomposed.push_back(text[i]);
      from.push_back(i);
      continue;
    }
    for (utf8proc_ssize_t k = 0; k < count; ++k) {
      decomposed.push_back(static_cast<char32_t>(buffer[k]));
      from.push_back(i);
    }
  }
  // 2. Canonical ordering: runs of non-starters sorted by combining class.
  std::vector<size_t> order(decomposed.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (size_t start = 0; start < decomposed.size();) {
    if (CombiningClass(decomposed[start]) == 0) {
      ++start;
      continue;
    }
    size_t end = start;
    while (end < decomposed.size() && CombiningClass(decomposed[end]) != 0) {
      ++end;
    }
    std::stable_sort(
        order.begin() + start, order.begin() + end, [&](size_t a, size_t b) {
          return CombiningClass(decomposed[a]) < CombiningClass(decomposed[b]);
        });
    start = end;
  }
  std::u32string out;
  origin->clear();
  if (!compose) {
    for (size_t i : order) {
      out.push_back(decomposed[i]);
      origin->push_back(from[i]);
    }
    return out;
  }
  // 3. Canonical composition onto the last starter.
  int starter = -1;
  int last_class = 0;
  for (size_t i : order) {
    const char32_t c = decomposed[i];
    const int combining = CombiningClass(c);
    const bool adjacent =
        starter >= 0 && static_cast<size_t>(starter) + 1 == out.size();
    if (starter >= 0 && (adjacent || last_class < combining)) {
      if (const char32_t composite = Compose(out[starter], c)) {
        out[starter] = composite;
        continue;
      }
    }
    if (combining == 0) starter = static_cast<int>(out.size());
    last_class = combining;
    out.push_back(c);
    origin->push_back(from[i]);
  }
  return out;
}

void AppendLowercase(char32_t c, std::u32string* out) {
  const hf_unicode::Lowercase* end = std::end(hf_unicode::kLowercase);
  const hf_unicode::Lowercase* it =
      std::lower_bound(std::begin(hf_unicode::kLowercase), end, c,
                       [](const hf_unicode::Lowercase& l, char32_t value) {
                         return l.from < value;
                       });
  if (it != end && it->from == c) {  // Rust's tables are newer than utf8proc's
    out->push_back(it->to);
    return;
  }
  if (c == 0x130) {  // LATIN CAPITAL LETTER I WITH DOT ABOVE
    out->push_back(U'i');
    out->push_back(0x307);
    return;
  }
  out->push_back(static_cast<char32_t>(
      utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
}

}  // namespace loraplex
