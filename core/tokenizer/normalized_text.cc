#include "core/tokenizer/normalized_text.h"

#include <algorithm>
#include <utility>

namespace loraplex {
namespace {

bool IsAscii(std::string_view text) {
  for (char c : text) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

}  // namespace

NormalizedText::NormalizedText(std::string_view original, uint32_t offset)
    : text_(original), offset_(offset) {
  alignment_.reserve(text_.size());
  size_t pos = 0;
  while (pos < text_.size()) {
    const size_t start = pos;
    NextCodePoint(text_, &pos);
    const TextSpan span{static_cast<uint32_t>(offset + start),
                        static_cast<uint32_t>(offset + pos)};
    alignment_.insert(alignment_.end(), pos - start, span);
  }
}

TextSpan NormalizedText::OriginalSpan(size_t begin, size_t end) const {
  if (begin >= end) {
    uint32_t at = offset_;
    if (begin < alignment_.size()) {
      at = alignment_[begin].start;
    } else if (!alignment_.empty()) {
      at = alignment_.back().end;
    }
    return {at, at};
  }
  return {alignment_[begin].start, alignment_[end - 1].end};
}

NormalizedText NormalizedText::Slice(size_t begin, size_t end) const {
  NormalizedText slice;
  slice.offset_ = OriginalSpan(begin, begin).start;
  slice.text_ = text_.substr(begin, end - begin);
  slice.alignment_.assign(alignment_.begin() + begin, alignment_.begin() + end);
  return slice;
}

void NormalizedText::Prepend(std::string_view prefix) {
  if (text_.empty() || prefix.empty()) return;
  const TextSpan first = alignment_.front();
  text_.insert(0, prefix);
  alignment_.insert(alignment_.begin(), prefix.size(), first);
}

absl::Status NormalizedText::Replace(const TextPattern& pattern,
                                     std::string_view content) {
  absl::StatusOr<std::vector<PatternPiece>> pieces = pattern.FindMatches(text_);
  if (!pieces.ok()) return pieces.status();
  std::string text;
  std::vector<TextSpan> alignment;
  text.reserve(text_.size());
  alignment.reserve(alignment_.size());
  for (const PatternPiece& piece : *pieces) {
    if (!piece.is_match) {
      text.append(text_, piece.start, piece.end - piece.start);
      alignment.insert(alignment.end(), alignment_.begin() + piece.start,
                       alignment_.begin() + piece.end);
      continue;
    }
    const TextSpan span =
        piece.end > 0 ? alignment_[piece.end - 1] : TextSpan{offset_, offset_};
    text.append(content);
    alignment.insert(alignment.end(), content.size(), span);
  }
  text_ = std::move(text);
  alignment_ = std::move(alignment);
  return absl::OkStatus();
}

void NormalizedText::MapCodePoints(
    const std::function<void(char32_t, std::u32string*)>& map) {
  std::string text;
  std::vector<TextSpan> alignment;
  text.reserve(text_.size());
  alignment.reserve(alignment_.size());
  std::u32string mapped;
  size_t pos = 0;
  while (pos < text_.size()) {
    const TextSpan span = alignment_[pos];
    const char32_t c = NextCodePoint(text_, &pos);
    mapped.clear();
    map(c, &mapped);
    const size_t before = text.size();
    for (char32_t out : mapped) AppendUtf8(out, &text);
    alignment.insert(alignment.end(), text.size() - before, span);
  }
  text_ = std::move(text);
  alignment_ = std::move(alignment);
}

void NormalizedText::MapBytes(const std::string (&map)[256]) {
  std::string text;
  std::vector<TextSpan> alignment;
  text.reserve(text_.size() * 2);
  alignment.reserve(alignment_.size() * 2);
  for (size_t i = 0; i < text_.size(); ++i) {
    const std::string& out = map[static_cast<unsigned char>(text_[i])];
    text += out;
    alignment.insert(alignment.end(), out.size(), alignment_[i]);
  }
  text_ = std::move(text);
  alignment_ = std::move(alignment);
}

absl::Status NormalizedText::Normalize(UnicodeForm form) {
  if (IsAscii(text_)) return absl::OkStatus();
  absl::StatusOr<std::string> whole = NormalizeUnicode(text_, form);
  if (!whole.ok()) return whole.status();
  if (*whole == text_) return absl::OkStatus();
  std::u32string chars;
  std::vector<TextSpan> spans;
  size_t pos = 0;
  while (pos < text_.size()) {
    spans.push_back(alignment_[pos]);
    chars.push_back(NextCodePoint(text_, &pos));
  }
  std::vector<size_t> origin;
  const std::u32string normalized = NormalizeCodePoints(chars, form, &origin);
  std::string text;
  std::vector<TextSpan> alignment;
  for (size_t i = 0; i < normalized.size(); ++i) {
    const size_t before = text.size();
    AppendUtf8(normalized[i], &text);
    alignment.insert(alignment.end(), text.size() - before, spans[origin[i]]);
  }
  text_ = std::move(text);
  alignment_ = std::move(alignment);
  return absl::OkStatus();
}

void NormalizedText::Strip(bool left, bool right) {
  size_t begin = 0;
  size_t end = text_.size();
  if (left) {
    while (begin < end) {
      size_t next = begin;
      if (!IsWhitespace(NextCodePoint(text_, &next))) break;
      begin = next;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin &&
             (static_cast<unsigned char>(text_[start]) & 0xC0) == 0x80) {
        --start;
      }
      size_t next = start;
      if (!IsWhitespace(NextCodePoint(text_, &next))) break;
      end = start;
    }
  }
  if (begin == 0 && end == text_.size()) return;
  *this = Slice(begin, end);
}

absl::StatusOr<std::vector<NormalizedText>> NormalizedText::Split(
    const TextPattern& pattern, SplitBehavior behavior) const {
  absl::StatusOr<std::vector<PatternPiece>> matches =
      pattern.FindMatches(text_);
  if (!matches.ok()) return matches.status();
  // (piece, remove) as HF computes them.
  std::vector<std::pair<PatternPiece, bool>> splits;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const PatternPiece& piece : *matches)
        splits.push_back({piece, false});
      break;
    case SplitBehavior::kRemoved:
      for (const PatternPiece& piece : *matches) {
        splits.push_back({piece, piece.is_match});
      }
      break;
    case SplitBehavior::kContiguous:
      for (const PatternPiece& piece : *matches) {
        if (piece.is_match == previous_match && !splits.empty()) {
          splits.back().first.end = piece.end;
        } else {
          splits.push_back({piece, false});
        }
        previous_match = piece.is_match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const PatternPiece& piece : *matches) {
        if (piece.is_match && !previous_match && !splits.empty()) {
          splits.back().first.end = piece.end;
        } else {
          splits.push_back({piece, false});
        }
        previous_match = piece.is_match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (auto it = matches->rbegin(); it != matches->rend(); ++it) {
        if (it->is_match && !previous_match && !splits.empty()) {
          splits.back().first.start = it->start;
        } else {
          splits.push_back({*it, false});
        }
        previous_match = it->is_match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  std::vector<NormalizedText> pieces;
  pieces.reserve(splits.size());
  for (const auto& [piece, remove] : splits) {
    if (remove || piece.start == piece.end) continue;
    pieces.push_back(Slice(piece.start, piece.end));
  }
  return pieces;
}

}  // namespace loraplex
