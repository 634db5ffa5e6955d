#include "core/tokenizer/bpe_model.h"

#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/common/json_parse.h"
#include "core/tokenizer/config_json.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

using nlohmann::json;

// An optional string option: absent and null both mean "none".
absl::StatusOr<std::string> OptionalString(const json& model, const char* key,
                                           const std::string& where) {
  if (!model.contains(key) || model[key].is_null()) return std::string();
  if (!model[key].is_string()) {
    return ConfigError(where, absl::StrCat("\"", key,
                                           "\" must be a string or null, "
                                           "got ",
                                           DescribeJson(model[key])));
  }
  return model[key].get<std::string>();
}

struct Symbol {
  int32_t id;
  int prev;
  int next;
  uint32_t start;
  uint32_t length;  // 0 once merged into the symbol before it
};

struct QueuedMerge {
  uint32_t rank;
  int position;
  int32_t new_id;
  // std::priority_queue pops the largest: lowest rank first, then leftmost.
  bool operator<(const QueuedMerge& other) const {
    if (rank != other.rank) return rank > other.rank;
    return position > other.position;
  }
};

}  // namespace

absl::StatusOr<BpeModel> BpeModel::FromJson(const json& model,
                                            const std::string& where) {
  if (!model.is_object()) {
    return ConfigError(
        where, absl::StrCat("must be an object, got ", DescribeJson(model)));
  }
  const std::string type = model.contains("type") && model["type"].is_string()
                               ? model["type"].get<std::string>()
                               : std::string();
  if (type != "BPE") {
    return ConfigError(
        where,
        absl::StrCat("model type ",
                     type.empty() ? DescribeJson(model.value("type", json()))
                                  : absl::StrCat("\"", type, "\""),
                     " is not supported (supported: BPE)"));
  }
  BpeModel bpe;
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0)) {
    return ConfigError(where,
                       "BPE dropout is not supported (it makes encoding "
                       "random); set \"dropout\" to null");
  }
  absl::StatusOr<std::string> text =
      OptionalString(model, "continuing_subword_prefix", where);
  if (!text.ok()) return text.status();
  bpe.continuing_subword_prefix_ = *text;
  text = OptionalString(model, "end_of_word_suffix", where);
  if (!text.ok()) return text.status();
  bpe.end_of_word_suffix_ = *text;
  for (auto [key, field] : {std::pair{"fuse_unk", &bpe.fuse_unk_},
                            std::pair{"byte_fallback", &bpe.byte_fallback_},
                            std::pair{"ignore_merges", &bpe.ignore_merges_}}) {
    absl::StatusOr<bool> value = BoolField(model, key, false, where);
    if (!value.ok()) return value.status();
    *field = *value;
  }

  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return ConfigError(where, "\"vocab\" must be an object of token: id");
  }
  const json& vocab = model["vocab"];
  bpe.vocab_.reserve(vocab.size());
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    if (!it.value().is_number_unsigned() ||
        it.value().get<uint64_t>() > 0x7FFFFFFF) {
      return ConfigError(where,
                         absl::StrCat("vocab[", DescribeJson(it.key()),
                                      "] must be an id in [0, 2^31), got ",
                                      DescribeJson(it.value())));
    }
    const int32_t id = static_cast<int32_t>(it.value().get<uint64_t>());
    bpe.vocab_[it.key()] = id;
    bpe.tokens_[id] = it.key();
    bpe.id_limit_ = std::max<int64_t>(bpe.id_limit_, int64_t{id} + 1);
  }
  text = OptionalString(model, "unk_token", where);
  if (!text.ok()) return text.status();
  if (!text->empty()) {
    std::optional<int32_t> unk = bpe.TokenToId(*text);
    if (!unk.has_value()) {
      return ConfigError(where, absl::StrCat("unk_token \"", *text,
                                             "\" is not in the vocabulary"));
    }
    bpe.unk_id_ = unk;
  }
  for (int byte = 0; byte < 256; ++byte) {
    bpe.byte_ids_[byte] = bpe.TokenToId(absl::StrFormat("<0x%02X>", byte));
  }

  if (!model.contains("merges") || !model["merges"].is_array()) {
    return ConfigError(where, "\"merges\" must be a list");
  }
  const json& merges = model["merges"];
  bpe.merges_.reserve(merges.size());
  const size_t prefix_length = bpe.continuing_subword_prefix_.size();
  for (size_t rank = 0; rank < merges.size(); ++rank) {
    const json& merge = merges[rank];
    std::string left, right;
    if (merge.is_string()) {
      const std::string& pair = merge.get_ref<const std::string&>();
      const size_t space = pair.find(' ');
      if (space == std::string::npos) {
        return ConfigError(where, absl::StrCat("merges[", rank,
                                               "] must be \"a b\", "
                                               "got ",
                                               DescribeJson(merge)));
      }
      left = pair.substr(0, space);
      right = pair.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      return ConfigError(where, absl::StrCat("merges[", rank,
                                             "] must be \"a b\" or "
                                             "[a, b], got ",
                                             DescribeJson(merge)));
    }
    const std::optional<int32_t> left_id = bpe.TokenToId(left);
    const std::optional<int32_t> right_id = bpe.TokenToId(right);
    const std::string merged =
        left +
        (right.size() >= prefix_length ? right.substr(prefix_length) : right);
    const std::optional<int32_t> merged_id = bpe.TokenToId(merged);
    if (!left_id || !right_id || !merged_id) {
      const std::string& missing = !left_id ? left : !right_id ? right : merged;
      return ConfigError(where,
                         absl::StrCat("merges[", rank, "] uses \"", missing,
                                      "\", which is not in the vocabulary"));
    }
    // As HF: a repeated pair keeps its last rank.
    bpe.merges_[PairKey(*left_id, *right_id)] =
        Merge{static_cast<uint32_t>(rank), *merged_id};
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(absl::string_view(token.data(), token.size()));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::IdToToken(int32_t id) const {
  auto it = tokens_.find(id);
  return it == tokens_.end() ? nullptr : &it->second;
}

const BpeModel::Merge* BpeModel::FindMerge(int32_t left, int32_t right) const {
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

void BpeModel::Tokenize(std::string_view piece,
                        std::vector<BpeToken>* out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    if (std::optional<int32_t> id = TokenToId(piece)) {
      out->push_back({*id, 0, static_cast<uint32_t>(piece.size())});
      return;
    }
  }
  std::vector<Symbol> symbols;
  symbols.reserve(piece.size());
  const auto add = [&](int32_t id, uint32_t start, uint32_t length) {
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({id, index - 1, index + 1, start, length});
  };
  std::optional<Symbol> unk;  // a pending (possibly fused) unknown run
  const auto flush_unk = [&] {
    if (unk) add(unk->id, unk->start, unk->length);
    unk.reset();
  };
  std::string lookup;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t start = pos;
    NextCodePoint(piece, &pos);
    const std::string_view character = piece.substr(start, pos - start);
    lookup.clear();
    if (start != 0) lookup += continuing_subword_prefix_;
    lookup.append(character);
    if (pos == piece.size()) lookup += end_of_word_suffix_;
    const auto length = static_cast<uint32_t>(pos - start);
    if (std::optional<int32_t> id = TokenToId(lookup)) {
      flush_unk();
      add(*id, static_cast<uint32_t>(start), length);
      continue;
    }
    if (byte_fallback_) {
      bool all_bytes = true;
      for (char byte : lookup) {
        all_bytes = all_bytes && byte_ids_[static_cast<unsigned char>(byte)];
      }
      if (all_bytes) {
        // HF keeps a pending unknown run open across byte tokens.
        for (size_t i = 0; i < lookup.size(); ++i) {
          add(*byte_ids_[static_cast<unsigned char>(lookup[i])],
              static_cast<uint32_t>(start + std::min(i, character.size() - 1)),
              1);
        }
        continue;
      }
    }
    if (!unk_id_) continue;  // HF drops the character
    if (unk && fuse_unk_) {
      unk->length = static_cast<uint32_t>(pos) - unk->start;
    } else {
      flush_unk();
      unk = Symbol{*unk_id_, 0, 0, static_cast<uint32_t>(start), length};
    }
  }
  flush_unk();
  if (!symbols.empty()) symbols.back().next = -1;

  std::priority_queue<QueuedMerge> queue;
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    if (const Merge* merge = FindMerge(symbols[i].id, symbols[i + 1].id)) {
      queue.push({merge->rank, static_cast<int>(i), merge->new_id});
    }
  }
  while (!queue.empty()) {
    const QueuedMerge top = queue.top();
    queue.pop();
    Symbol& left = symbols[top.position];
    if (left.length == 0 || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    const Merge* current = FindMerge(left.id, right.id);
    if (current == nullptr || current->new_id != top.new_id) continue;
    left.id = top.new_id;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = top.position;
    if (left.prev >= 0) {
      if (const Merge* merge = FindMerge(symbols[left.prev].id, left.id)) {
        queue.push({merge->rank, left.prev, merge->new_id});
      }
    }
    if (left.next >= 0) {
      if (const Merge* merge = FindMerge(left.id, symbols[left.next].id)) {
        queue.push({merge->rank, top.position, merge->new_id});
      }
    }
  }
  for (const Symbol& symbol : symbols) {
    if (symbol.length == 0) continue;
    out->push_back({symbol.id, symbol.start, symbol.start + symbol.length});
  }
}

}  // namespace loraplex
