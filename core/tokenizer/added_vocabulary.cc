#include "core/tokenizer/added_vocabulary.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

using nlohmann::json;

// The Rust regex crate's Unicode \w, which HF uses for single_word.
constexpr std::string_view kWordCharacter =
    "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]";

absl::Status Bad(size_t index, absl::string_view reason) {
  return absl::InvalidArgumentError(
      absl::StrCat("added_tokens[", index, "]: ", reason));
}

size_t PreviousCodePointStart(std::string_view text, size_t end) {
  size_t start = end - 1;
  while (start > 0 &&
         (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) {
    --start;
  }
  return start;
}

}  // namespace

absl::StatusOr<AddedVocabulary> AddedVocabulary::FromJson(
    const json& tokens, const NormalizerChain& normalizer) {
  AddedVocabulary vocabulary;
  LORAPLEX_ASSIGN_OR_RETURN(TextPattern word,
                            TextPattern::Regex(kWordCharacter));
  vocabulary.word_character_ = std::move(word);
  if (tokens.is_null()) return vocabulary;
  if (!tokens.is_array()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "added_tokens must be a list, got ", DescribeJson(tokens)));
  }
  std::vector<std::string> forms;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const json& entry = tokens[i];
    if (!entry.is_object()) {
      return Bad(i,
                 absl::StrCat("must be an object, got ", DescribeJson(entry)));
    }
    AddedToken token;
    if (!entry.contains("id") || !entry["id"].is_number_unsigned() ||
        entry["id"].get<uint64_t>() > 0x7FFFFFFF) {
      return Bad(i, "\"id\" must be an id in [0, 2^31)");
    }
    token.id = static_cast<int32_t>(entry["id"].get<uint64_t>());
    if (!entry.contains("content") || !entry["content"].is_string()) {
      return Bad(i, "\"content\" must be a string");
    }
    token.content = entry["content"].get<std::string>();
    for (auto [key, field] : {std::pair{"special", &token.special},
                              std::pair{"lstrip", &token.lstrip},
                              std::pair{"rstrip", &token.rstrip},
                              std::pair{"single_word", &token.single_word},
                              std::pair{"normalized", &token.normalized}}) {
      if (!entry.contains(key)) continue;
      if (!entry[key].is_boolean()) {
        return Bad(i, absl::StrCat("\"", key, "\" must be true or false"));
      }
      *field = entry[key].get<bool>();
    }
    std::string form = token.content;
    if (token.normalized && !normalizer.empty() && !form.empty()) {
      NormalizedText text(form, 0);
      LORAPLEX_RETURN_IF_ERROR(normalizer.Normalize(&text));
      form = text.text();
    }
    vocabulary.by_id_[token.id] = vocabulary.tokens_.size();
    vocabulary.by_content_[token.content] = vocabulary.tokens_.size();
    vocabulary.tokens_.push_back(std::move(token));
    forms.push_back(std::move(form));
  }
  vocabulary.Build(&vocabulary.raw_, false, forms);
  vocabulary.Build(&vocabulary.normalized_, true, forms);
  return vocabulary;
}

void AddedVocabulary::Build(MatchingSet* set, bool normalized,
                            const std::vector<std::string>& forms) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    if (tokens_[i].normalized != normalized || forms[i].empty()) continue;
    set->patterns.push_back({forms[i], i});
  }
  for (size_t p = 0; p < set->patterns.size(); ++p) {
    const unsigned char first =
        static_cast<unsigned char>(set->patterns[p].first[0]);
    set->by_first_byte[first].push_back(p);
  }
  for (std::vector<size_t>& candidates : set->by_first_byte) {
    std::stable_sort(
        candidates.begin(), candidates.end(), [&](size_t a, size_t b) {
          return set->patterns[a].first.size() > set->patterns[b].first.size();
        });
  }
}

bool AddedVocabulary::IsWordAt(std::string_view text, size_t start,
                               size_t end) const {
  if (start < end) {
    size_t pos = start;
    const char32_t c = NextCodePoint(text, &pos);
    if (IsHfWordCharacterOverride(c)) return true;
    if (IsHfNonWordCharacterOverride(c)) return false;
  }
  absl::StatusOr<std::vector<PatternPiece>> pieces =
      word_character_->FindMatches(text.substr(start, end - start));
  return pieces.ok() && !pieces->empty() && (*pieces)[0].is_match;
}

std::vector<AddedMatch> AddedVocabulary::Split(std::string_view text,
                                               bool normalized) const {
  const MatchingSet& set = normalized ? normalized_ : raw_;
  std::vector<AddedMatch> splits;
  if (text.empty() || set.empty()) {
    splits.push_back({0, text.size(), std::nullopt});
    return splits;
  }
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    const std::vector<size_t>& candidates =
        set.by_first_byte[static_cast<unsigned char>(text[pos])];
    const std::pair<std::string, size_t>* found = nullptr;
    for (size_t candidate : candidates) {
      const std::string& pattern = set.patterns[candidate].first;
      if (text.compare(pos, pattern.size(), pattern) == 0) {
        found = &set.patterns[candidate];
        break;
      }
    }
    if (found == nullptr) {
      ++pos;
      continue;
    }
    size_t start = pos;
    size_t stop = pos + found->first.size();
    pos = stop;  // the search goes on after the match as found
    const AddedToken& token = tokens_[found->second];
    if (token.single_word) {
      const bool word_before =
          start > 0 &&
          IsWordAt(text, PreviousCodePointStart(text, start), start);
      const bool word_after =
          stop < text.size() &&
          IsWordAt(text, stop,
                   stop + Utf8SequenceLength(
                              static_cast<unsigned char>(text[stop])));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t new_start = start;
      while (new_start > 0) {
        const size_t previous = PreviousCodePointStart(text, new_start);
        size_t next = previous;
        if (!IsWhitespace(NextCodePoint(text, &next))) break;
        new_start = previous;
      }
      start = std::max(new_start, start_offset);
    }
    if (token.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!IsWhitespace(NextCodePoint(text, &next))) break;
        stop = next;
      }
    }
    if (start_offset < start) {
      splits.push_back({start_offset, start, std::nullopt});
    }
    splits.push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset != text.size()) {
    splits.push_back({start_offset, text.size(), std::nullopt});
  }
  return splits;
}

const AddedToken* AddedVocabulary::Find(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &tokens_[it->second];
}

std::optional<int32_t> AddedVocabulary::TokenToId(
    std::string_view content) const {
  auto it = by_content_.find(absl::string_view(content.data(), content.size()));
  if (it == by_content_.end()) return std::nullopt;
  return tokens_[it->second].id;
}

}  // namespace loraplex
