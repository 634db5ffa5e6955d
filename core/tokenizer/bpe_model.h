// The BPE model of a tokenizer.json ("model": {"type": "BPE", ...}): a
// vocabulary, merges applied by rank, and the options HF tokenizers has
// (unk_token, fuse_unk, byte_fallback to <0xNN> tokens, ignore_merges,
// continuing_subword_prefix, end_of_word_suffix).
//
//   LORAPLEX_ASSIGN_OR_RETURN(BpeModel bpe, BpeModel::FromJson(root["model"],
//                                                              "model"));
//   std::vector<BpeToken> tokens;
//   bpe.Tokenize(piece, &tokens);
#ifndef LORAPLEX_CORE_TOKENIZER_BPE_MODEL_H_
#define LORAPLEX_CORE_TOKENIZER_BPE_MODEL_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace loraplex {

struct BpeToken {
  int32_t id = 0;
  uint32_t start = 0;  // byte range within the tokenized piece
  uint32_t end = 0;
};

class BpeModel {
 public:
  static absl::StatusOr<BpeModel> FromJson(const nlohmann::json& model,
                                           const std::string& where);

  // Appends the tokens of one pre-tokenized piece.
  void Tokenize(std::string_view piece, std::vector<BpeToken>* out) const;

  std::optional<int32_t> TokenToId(std::string_view token) const;
  // nullptr for an id the vocabulary does not have.
  const std::string* IdToToken(int32_t id) const;
  // One past the largest id.
  int64_t id_limit() const { return id_limit_; }

 private:
  struct Merge {
    uint32_t rank;
    int32_t new_id;
  };
  static uint64_t PairKey(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }
  const Merge* FindMerge(int32_t left, int32_t right) const;

  absl::flat_hash_map<std::string, int32_t> vocab_;
  absl::flat_hash_map<int32_t, std::string> tokens_;
  absl::flat_hash_map<uint64_t, Merge> merges_;
  std::optional<int32_t> unk_id_;
  std::optional<int32_t> byte_ids_[256];
  bool has_byte_ids_ = false;
  std::string continuing_subword_prefix_;
  std::string end_of_word_suffix_;
  bool fuse_unk_ = false;
  bool byte_fallback_ = false;
  bool ignore_merges_ = false;
  int64_t id_limit_ = 0;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_BPE_MODEL_H_
