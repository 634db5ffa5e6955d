// The "added_tokens" of a tokenizer.json: tokens matched in the text before
// the model sees it (longest first, leftmost first), with HF tokenizers'
// flags: special (skipped when decoding), lstrip/rstrip (absorb the
// whitespace beside them), single_word (only between non-word characters)
// and normalized (matched in the normalized text rather than the raw one).
//
//   LORAPLEX_ASSIGN_OR_RETURN(AddedVocabulary added,
//       AddedVocabulary::FromJson(root["added_tokens"], normalizer));
//   for (const AddedMatch& piece : added.Split(text, /*normalized=*/false))
#ifndef LORAPLEX_CORE_TOKENIZER_ADDED_VOCABULARY_H_
#define LORAPLEX_CORE_TOKENIZER_ADDED_VOCABULARY_H_

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "core/tokenizer/text_pattern.h"
#include "core/tokenizer/text_pipeline.h"

namespace loraplex {

struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = false;
  bool lstrip = false;
  bool rstrip = false;
  bool single_word = false;
  bool normalized = false;
};

// A piece of text: an added token (id set) or text between them.
struct AddedMatch {
  size_t start = 0;
  size_t end = 0;
  std::optional<int32_t> id;
};

class AddedVocabulary {
 public:
  // `normalizer` gives the form in which normalized tokens are matched.
  static absl::StatusOr<AddedVocabulary> FromJson(
      const nlohmann::json& tokens, const NormalizerChain& normalizer);

  // `text` cut at the tokens of one set: those with normalized=false (for
  // the raw text) or normalized=true (for normalized text).
  std::vector<AddedMatch> Split(std::string_view text, bool normalized) const;

  const AddedToken* Find(int32_t id) const;
  std::optional<int32_t> TokenToId(std::string_view content) const;
  const std::vector<AddedToken>& tokens() const { return tokens_; }

 private:
  // Patterns of one set, indexed by their first byte, longest first.
  struct MatchingSet {
    std::vector<std::pair<std::string, size_t>> patterns;  // text, token
    std::array<std::vector<size_t>, 256> by_first_byte;
    bool empty() const { return patterns.empty(); }
  };
  void Build(MatchingSet* set, bool normalized,
             const std::vector<std::string>& forms);
  bool IsWordAt(std::string_view text, size_t start, size_t end) const;

  std::vector<AddedToken> tokens_;
  absl::flat_hash_map<int32_t, size_t> by_id_;
  absl::flat_hash_map<std::string, size_t> by_content_;
  MatchingSet raw_;
  MatchingSet normalized_;
  std::optional<TextPattern> word_character_;  // set by FromJson
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_ADDED_VOCABULARY_H_
