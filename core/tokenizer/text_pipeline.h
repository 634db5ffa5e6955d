// The normalizer, pre-tokenizer and decoder of a tokenizer.json, parsed
// into chains of steps that HF tokenizers' components define:
//
//   normalizers     NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, Prepend,
//                   Sequence
//   pre-tokenizers  ByteLevel, Split, Digits, Metaspace, Whitespace,
//                   WhitespaceSplit, Punctuation, Sequence
//   decoders        ByteLevel, ByteFallback, Metaspace, Fuse, Strip, Replace,
//                   Sequence
//
// Any other type is an INVALID_ARGUMENT naming it and where it sits.
//
//   LORAPLEX_ASSIGN_OR_RETURN(NormalizerChain normalizer,
//       NormalizerChain::FromJson(root["normalizer"], "normalizer"));
#ifndef LORAPLEX_CORE_TOKENIZER_TEXT_PIPELINE_H_
#define LORAPLEX_CORE_TOKENIZER_TEXT_PIPELINE_H_

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tokenizer/normalized_text.h"
#include "core/tokenizer/text_pattern.h"

namespace loraplex {

// GPT-2's map from bytes to printable characters (UTF-8) used by the
// ByteLevel pre-tokenizer, and its inverse.
const std::string (&ByteLevelAlphabet())[256];
// The byte a ByteLevel character stands for, or -1.
int ByteLevelByte(char32_t c);

class NormalizerChain {
 public:
  // `config` may be null (no normalizer).
  static absl::StatusOr<NormalizerChain> FromJson(const nlohmann::json& config,
                                                  const std::string& where);
  absl::Status Normalize(NormalizedText* text) const;
  bool empty() const { return steps_.empty(); }

 private:
  enum class Kind { kUnicode, kLowercase, kStrip, kReplace, kPrepend };
  struct Step {
    Kind kind = Kind::kUnicode;
    UnicodeForm form = UnicodeForm::kNfc;
    bool left = false, right = false;
    std::vector<TextPattern> pattern;  // one element for kReplace
    std::string content;
  };
  absl::Status Add(const nlohmann::json& config, const std::string& where,
                   int depth);
  std::vector<Step> steps_;
};

enum class PrependScheme { kAlways, kFirst, kNever };

// Metaspace's "prepend_scheme", or for older files its "add_prefix_space"
// (true: always, false: never).
absl::StatusOr<PrependScheme> PrependSchemeFromJson(
    const nlohmann::json& config, const std::string& where);

class PreTokenizerChain {
 public:
  static absl::StatusOr<PreTokenizerChain> FromJson(
      const nlohmann::json& config, const std::string& where);
  // Splits each piece further, in place.
  absl::Status PreTokenize(std::vector<NormalizedText>* pieces) const;

 private:
  enum class Kind { kByteLevel, kSplit, kMetaspace };
  struct Step {
    Kind kind = Kind::kSplit;
    std::vector<TextPattern> pattern;  // kSplit
    SplitBehavior behavior = SplitBehavior::kIsolated;
    bool add_prefix_space = false;  // kByteLevel
    std::string replacement;        // kMetaspace
    PrependScheme prepend = PrependScheme::kAlways;
    bool split = true;
  };
  absl::Status Add(const nlohmann::json& config, const std::string& where,
                   int depth);
  std::vector<Step> steps_;
};

class DecoderChain {
 public:
  static absl::StatusOr<DecoderChain> FromJson(const nlohmann::json& config,
                                               const std::string& where);
  // The text of `tokens` (token strings); HF joins them with spaces when a
  // tokenizer has no decoder.
  absl::StatusOr<std::string> Decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind {
    kByteLevel,
    kByteFallback,
    kMetaspace,
    kFuse,
    kStrip,
    kReplace
  };
  struct Step {
    Kind kind = Kind::kFuse;
    char32_t content = 0;  // kStrip; kMetaspace's replacement
    size_t start = 0, stop = 0;
    std::vector<TextPattern> pattern;  // kReplace
    std::string replacement;
    PrependScheme prepend = PrependScheme::kAlways;
  };
  absl::Status Add(const nlohmann::json& config, const std::string& where,
                   int depth);
  absl::Status Apply(const Step& step, std::vector<std::string>* tokens) const;
  std::vector<Step> steps_;
  bool present_ = false;
};

// A {"String": s} or {"Regex": r} pattern of a Split, Replace, ... step.
absl::StatusOr<TextPattern> PatternFromJson(const nlohmann::json& config,
                                            const std::string& where);

// A Replace step (normalizer or decoder): appends its pattern to `pattern`
// and sets its "content".
absl::Status ReplaceFromJson(const nlohmann::json& config,
                             const std::string& where,
                             std::vector<TextPattern>* pattern,
                             std::string* content);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_TEXT_PIPELINE_H_
