// Text <-> token id conversion for a base model.
//
// Implementations: Hugging Face `tokenizer.json` (hf_tokenizer.h),
// SentencePiece (`tokenizer.model`) and the byte-level tokenizer of the
// built-in models. Use LoadTokenizer() from load_tokenizer.h to pick one for
// a model directory. EOS and PAD ids come with every tokenizer; BOS only
// with those whose model starts sequences with one (Qwen2's does not).
#ifndef LORAPLEX_CORE_TOKENIZER_TOKENIZER_H_
#define LORAPLEX_CORE_TOKENIZER_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace loraplex {

// File naming the byte-level tokenizer in a model directory.
inline constexpr std::string_view kByteTokenizerFile =
    "loraplex_tokenizer.json";

// Byte offsets [start, end) into the original input.
struct TextSpan {
  uint32_t start = 0;
  uint32_t end = 0;
  bool operator==(const TextSpan& other) const {
    return start == other.start && end == other.end;
  }
};

// Ids and, for each, the byte span of the input it came from ([0, 0) for
// tokens a post-processor adds).
struct TokenizerEncoding {
  std::vector<int64_t> ids;
  std::vector<TextSpan> offsets;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Token ids of `text`, without BOS/EOS (callers add them where wanted).
  // INVALID_ARGUMENT for text that is not valid UTF-8 where the tokenizer
  // needs it.
  virtual absl::StatusOr<std::vector<int64_t>> Encode(
      std::string_view text) const = 0;
  // Encode(text) with each token's span of `text`, so masks can follow
  // character positions (a completion inside one tokenized text).
  virtual absl::StatusOr<TokenizerEncoding> EncodeWithOffsets(
      std::string_view text) const = 0;
  // Text of `ids`; special ids are skipped.
  virtual absl::StatusOr<std::string> Decode(
      const std::vector<int64_t>& ids) const = 0;

  // One past the largest id the tokenizer can produce.
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int64_t> bos_id() const = 0;
  virtual int64_t eos_id() const = 0;
  // The id used to pad batches (EOS when the vocabulary has no PAD).
  virtual int64_t pad_id() const = 0;
};

// 256 byte tokens (id = byte value) followed by BOS, EOS and PAD.
class ByteTokenizer : public Tokenizer {
 public:
  static constexpr int64_t kBos = 256;
  static constexpr int64_t kEos = 257;
  static constexpr int64_t kPad = 258;
  static constexpr int64_t kVocabSize = 259;

  absl::StatusOr<std::vector<int64_t>> Encode(
      std::string_view text) const override;
  absl::StatusOr<TokenizerEncoding> EncodeWithOffsets(
      std::string_view text) const override;
  absl::StatusOr<std::string> Decode(
      const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return kVocabSize; }
  std::optional<int64_t> bos_id() const override { return kBos; }
  int64_t eos_id() const override { return kEos; }
  int64_t pad_id() const override { return kPad; }

  // Contents of loraplex_tokenizer.json describing this tokenizer.
  static std::string DescriptionJson();
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_TOKENIZER_H_
