// Hugging Face `tokenizer.json` tokenizers (the format of Llama 3, Qwen2/2.5/
// 3, SmolLM, Mistral, GPT-2 and transformers' converted SentencePiece
// models), read and run natively: added tokens, normalizer, pre-tokenizer,
// BPE model, post-processor and decoder as HF tokenizers defines them, so
// ids and decoded text equal HF's. Special token names come from the
// directory's tokenizer_config.json / special_tokens_map.json, as in
// transformers.
//
//   LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tokenizer,
//                             LoadHfTokenizer(model_dir));
//   LORAPLEX_ASSIGN_OR_RETURN(TokenizerEncoding encoding,
//       tokenizer->EncodeWithOffsets(text, /*add_special_tokens=*/false));
#ifndef LORAPLEX_CORE_TOKENIZER_HF_TOKENIZER_H_
#define LORAPLEX_CORE_TOKENIZER_HF_TOKENIZER_H_

#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "core/tokenizer/added_vocabulary.h"
#include "core/tokenizer/bpe_model.h"
#include "core/tokenizer/normalized_text.h"
#include "core/tokenizer/text_pipeline.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {

inline constexpr std::string_view kHfTokenizerFile = "tokenizer.json";

// The special tokens a tokenizer.json does not name itself.
struct SpecialTokenNames {
  std::optional<std::string> bos, eos, pad;
  // tokenizer_config.json's add_bos_token: BOS is `bos` when the
  // tokenizer.json has no template to add one (GPT-2 names a bos_token it
  // never adds).
  bool add_bos = false;
  std::optional<int64_t> eos_id;  // config.json's, when eos is not named
};

class HfTokenizer : public Tokenizer {
 public:
  // `root` is the parsed tokenizer.json; `label` names it in errors.
  static absl::StatusOr<std::unique_ptr<HfTokenizer>> FromJson(
      const nlohmann::json& root, const std::string& label,
      const SpecialTokenNames& names);

  absl::StatusOr<TokenizerEncoding> EncodeWithOffsets(
      std::string_view text, bool add_special_tokens) const;
  absl::StatusOr<TokenizerEncoding> EncodeWithOffsets(
      std::string_view text) const override {
    return EncodeWithOffsets(text, /*add_special_tokens=*/false);
  }
  absl::StatusOr<std::string> DecodeIds(const std::vector<int64_t>& ids,
                                        bool skip_special_tokens) const;

  absl::StatusOr<std::vector<int64_t>> Encode(
      std::string_view text) const override;
  absl::StatusOr<std::string> Decode(
      const std::vector<int64_t>& ids) const override;
  int64_t vocab_size() const override { return vocab_size_; }
  std::optional<int64_t> bos_id() const override { return bos_id_; }
  int64_t eos_id() const override { return eos_id_; }
  int64_t pad_id() const override { return pad_id_; }

  // The id of a token (added or in the model's vocabulary).
  std::optional<int64_t> TokenToId(std::string_view token) const;

 private:
  HfTokenizer() = default;
  absl::Status ParsePostProcessor(const nlohmann::json& config,
                                  const std::string& where, int depth);
  absl::StatusOr<std::optional<int64_t>> ResolveName(
      const std::optional<std::string>& name, const char* what) const;
  void TrimByteLevelOffsets(TokenizerEncoding* encoding,
                            const std::vector<std::string>& tokens) const;

  NormalizerChain normalizer_;
  PreTokenizerChain pre_tokenizer_;
  BpeModel model_;
  AddedVocabulary added_;
  DecoderChain decoder_;
  absl::flat_hash_set<std::string> special_contents_;
  // Post-processing: ByteLevel offset trimming and TemplateProcessing's
  // single-sequence template (nullopt = the sequence itself).
  bool trim_offsets_ = false;
  bool trim_add_prefix_space_ = false;
  std::vector<std::optional<std::vector<int64_t>>> template_;
  int64_t vocab_size_ = 0;
  std::optional<int64_t> bos_id_;
  int64_t eos_id_ = 0;
  int64_t pad_id_ = 0;
};

// The special tokens a model directory's tokenizer_config.json (over
// special_tokens_map.json) names, as transformers' special_tokens_map:
// "bos_token" -> "<s>", for those of bos, eos, unk, sep, pad, cls and mask
// that are named.
absl::StatusOr<std::map<std::string, std::string>> ReadSpecialTokenStrings(
    const std::string& model_dir);

// Reads `model_dir`/tokenizer.json and the special token names next to it.
absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadHfTokenizer(
    const std::string& model_dir);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_HF_TOKENIZER_H_
