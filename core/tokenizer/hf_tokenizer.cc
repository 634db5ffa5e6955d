#include "core/tokenizer/hf_tokenizer.h"

#include <filesystem>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/config_json.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

using nlohmann::json;

constexpr JsonParseOptions kTokenizerJsonOptions{.max_depth = 32};
constexpr char32_t kByteLevelSpace = 0x120;  // 'Ġ', the ByteLevel space

// A piece on its way through encoding: text still to tokenize, or an added
// token already found.
struct Piece {
  NormalizedText text;
  std::optional<int32_t> added_id;
};

// transformers writes a special token as a string or as an AddedToken
// object {"content": ..., ...}.
std::optional<std::string> TokenName(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& value = config[key];
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() && value.contains("content") &&
      value["content"].is_string()) {
    return value["content"].get<std::string>();
  }
  return std::nullopt;
}

// config.json / generation_config.json eos_token_id: an id or a list.
std::optional<int64_t> FirstId(const json& config, const char* key) {
  if (!config.is_object() || !config.contains(key)) return std::nullopt;
  const json& value = config[key];
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_array() && !value.empty() && value[0].is_number_integer()) {
    return value[0].get<int64_t>();
  }
  return std::nullopt;
}

size_t CountSpaces(const std::u32string& chars, bool from_end) {
  size_t count = 0;
  for (size_t i = 0; i < chars.size(); ++i) {
    const char32_t c = chars[from_end ? chars.size() - 1 - i : i];
    if (c != kByteLevelSpace && !IsWhitespace(c)) break;
    ++count;
  }
  return count;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HfTokenizer>> HfTokenizer::FromJson(
    const json& root, const std::string& label,
    const SpecialTokenNames& names) {
  if (!root.is_object()) return ConfigError(label, "must be a JSON object");
  std::unique_ptr<HfTokenizer> tokenizer(new HfTokenizer());
  const json absent;  // null: the component is not configured
  const auto field = [&](const char* key) -> const json& {
    return root.contains(key) ? root[key] : absent;
  };
  const auto where = [&](const char* key) {
    return absl::StrCat(label, ": ", key);
  };
  LORAPLEX_ASSIGN_OR_RETURN(
      tokenizer->normalizer_,
      NormalizerChain::FromJson(field("normalizer"), where("normalizer")));
  LORAPLEX_ASSIGN_OR_RETURN(
      tokenizer->pre_tokenizer_,
      PreTokenizerChain::FromJson(field("pre_tokenizer"),
                                  where("pre_tokenizer")));
  LORAPLEX_ASSIGN_OR_RETURN(tokenizer->model_,
                            BpeModel::FromJson(field("model"), where("model")));
  absl::StatusOr<AddedVocabulary> added =
      AddedVocabulary::FromJson(field("added_tokens"), tokenizer->normalizer_);
  if (!added.ok()) return ConfigError(label, added.status().message());
  tokenizer->added_ = *std::move(added);
  LORAPLEX_ASSIGN_OR_RETURN(
      tokenizer->decoder_,
      DecoderChain::FromJson(field("decoder"), where("decoder")));
  if (!field("post_processor").is_null()) {
    LORAPLEX_RETURN_IF_ERROR(tokenizer->ParsePostProcessor(
        field("post_processor"), where("post_processor"), 0));
  }

  tokenizer->vocab_size_ = tokenizer->model_.id_limit();
  for (const AddedToken& token : tokenizer->added_.tokens()) {
    tokenizer->vocab_size_ =
        std::max<int64_t>(tokenizer->vocab_size_, int64_t{token.id} + 1);
    if (token.special) tokenizer->special_contents_.insert(token.content);
  }

  // BOS: the one special token the single-sequence template puts first.
  const auto& items = tokenizer->template_;
  if (items.size() >= 2 && items[0].has_value() && items[0]->size() == 1 &&
      !items[1].has_value()) {
    tokenizer->bos_id_ = (*items[0])[0];
  } else if (items.empty() && names.add_bos && names.bos.has_value()) {
    LORAPLEX_ASSIGN_OR_RETURN(tokenizer->bos_id_,
                              tokenizer->ResolveName(names.bos, "bos_token"));
  }
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<int64_t> eos,
                            tokenizer->ResolveName(names.eos, "eos_token"));
  if (!eos.has_value()) eos = names.eos_id;
  if (!eos.has_value() || *eos < 0 || *eos >= tokenizer->vocab_size_) {
    return ConfigError(label,
                       "no end-of-sequence token: tokenizer_config.json names "
                       "no eos_token and config.json has no eos_token_id in "
                       "the vocabulary");
  }
  tokenizer->eos_id_ = *eos;
  LORAPLEX_ASSIGN_OR_RETURN(std::optional<int64_t> pad,
                            tokenizer->ResolveName(names.pad, "pad_token"));
  tokenizer->pad_id_ = pad.value_or(tokenizer->eos_id_);
  return tokenizer;
}

absl::Status HfTokenizer::ParsePostProcessor(const json& config,
                                             const std::string& where,
                                             int depth) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string type, ComponentType(config, where));
  if (type == "Sequence") {
    return ForEachInSequence(
        config, "processors", where, depth,
        [this](const json& item, const std::string& item_where, int next) {
          return ParsePostProcessor(item, item_where, next);
        });
  }
  if (type == "ByteLevel") {
    LORAPLEX_ASSIGN_OR_RETURN(trim_offsets_,
                              BoolField(config, "trim_offsets", true, where));
    LORAPLEX_ASSIGN_OR_RETURN(
        trim_add_prefix_space_,
        BoolField(config, "add_prefix_space", true, where));
    return absl::OkStatus();
  }
  if (type != "TemplateProcessing") {
    return ConfigError(where, absl::StrCat("post_processor type \"", type,
                                           "\" is not supported (supported: "
                                           "TemplateProcessing, ByteLevel, "
                                           "Sequence)"));
  }
  if (!config.contains("single") || !config["single"].is_array() ||
      !config.contains("special_tokens") ||
      !config["special_tokens"].is_object()) {
    return ConfigError(where,
                       "TemplateProcessing needs \"single\" and "
                       "\"special_tokens\"");
  }
  const json& specials = config["special_tokens"];
  template_.clear();
  for (const json& item : config["single"]) {
    if (item.is_object() && item.contains("Sequence")) {
      template_.push_back(std::nullopt);
      continue;
    }
    const json* special = item.is_object() && item.contains("SpecialToken")
                              ? &item["SpecialToken"]
                              : nullptr;
    if (special == nullptr || !special->contains("id") ||
        !(*special)["id"].is_string() ||
        !specials.contains((*special)["id"].get<std::string>())) {
      return ConfigError(where,
                         absl::StrCat("template item ", DescribeJson(item),
                                      " names no entry of special_tokens"));
    }
    const json& entry = specials[(*special)["id"].get<std::string>()];
    std::vector<int64_t> ids;
    if (entry.contains("ids") && entry["ids"].is_array()) {
      for (const json& id : entry["ids"]) {
        if (!id.is_number_unsigned()) break;
        ids.push_back(id.get<int64_t>());
      }
    }
    if (ids.empty() || ids.size() != entry.value("ids", json::array()).size()) {
      return ConfigError(where, absl::StrCat("special_tokens entry ",
                                             DescribeJson((*special)["id"]),
                                             " needs a list of ids"));
    }
    template_.push_back(std::move(ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::optional<int64_t>> HfTokenizer::ResolveName(
    const std::optional<std::string>& name, const char* what) const {
  if (!name.has_value()) return std::optional<int64_t>();
  std::optional<int64_t> id = TokenToId(*name);
  if (!id.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " \"", *name, "\" is not a token of tokenizer.json"));
  }
  return id;
}

std::optional<int64_t> HfTokenizer::TokenToId(std::string_view token) const {
  if (std::optional<int32_t> id = added_.TokenToId(token)) return *id;
  if (std::optional<int32_t> id = model_.TokenToId(token)) return *id;
  return std::nullopt;
}

absl::StatusOr<TokenizerEncoding> HfTokenizer::EncodeWithOffsets(
    std::string_view text, bool add_special_tokens) const {
  if (!IsValidUtf8(text)) {
    return absl::InvalidArgumentError("text is not valid UTF-8");
  }
  if (text.size() > 0xFFFFFFF0u) {
    return absl::InvalidArgumentError("text is longer than 4 GiB");
  }
  // 1. Added tokens matched in the raw text, 2. the rest normalized and
  // searched for normalized added tokens.
  const NormalizedText whole(text, 0);
  std::vector<Piece> raw;
  for (const AddedMatch& match : added_.Split(whole.text(), false)) {
    if (match.start == match.end) continue;
    raw.push_back({whole.Slice(match.start, match.end), match.id});
  }
  std::vector<Piece> pieces;
  for (Piece& piece : raw) {
    if (piece.added_id.has_value()) {
      pieces.push_back(std::move(piece));
      continue;
    }
    LORAPLEX_RETURN_IF_ERROR(normalizer_.Normalize(&piece.text));
    for (const AddedMatch& match : added_.Split(piece.text.text(), true)) {
      if (match.start == match.end) continue;
      pieces.push_back({piece.text.Slice(match.start, match.end), match.id});
    }
  }
  // 3. Pre-tokenize and run the model on the text pieces.
  TokenizerEncoding encoding;
  std::vector<std::string> token_strings;
  std::vector<NormalizedText> words;
  std::vector<BpeToken> tokens;
  for (Piece& piece : pieces) {
    if (piece.added_id.has_value()) {
      encoding.ids.push_back(*piece.added_id);
      encoding.offsets.push_back(piece.text.OriginalSpan());
      if (trim_offsets_) token_strings.push_back(piece.text.text());
      continue;
    }
    words.clear();
    words.push_back(std::move(piece.text));
    LORAPLEX_RETURN_IF_ERROR(pre_tokenizer_.PreTokenize(&words));
    for (const NormalizedText& word : words) {
      tokens.clear();
      model_.Tokenize(word.text(), &tokens);
      for (const BpeToken& token : tokens) {
        encoding.ids.push_back(token.id);
        encoding.offsets.push_back(word.OriginalSpan(token.start, token.end));
        if (trim_offsets_) {
          const std::string* value = model_.IdToToken(token.id);
          token_strings.push_back(value != nullptr ? *value : std::string());
        }
      }
    }
  }
  // 4. Post-processing.
  if (trim_offsets_) TrimByteLevelOffsets(&encoding, token_strings);
  if (add_special_tokens && !template_.empty()) {
    TokenizerEncoding templated;
    for (const auto& item : template_) {
      if (!item.has_value()) {
        templated.ids.insert(templated.ids.end(), encoding.ids.begin(),
                             encoding.ids.end());
        templated.offsets.insert(templated.offsets.end(),
                                 encoding.offsets.begin(),
                                 encoding.offsets.end());
        continue;
      }
      templated.ids.insert(templated.ids.end(), item->begin(), item->end());
      templated.offsets.insert(templated.offsets.end(), item->size(),
                               TextSpan{0, 0});
    }
    encoding = std::move(templated);
  }
  return encoding;
}

void HfTokenizer::TrimByteLevelOffsets(
    TokenizerEncoding* encoding, const std::vector<std::string>& tokens) const {
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::u32string chars;
    size_t pos = 0;
    while (pos < tokens[i].size()) {
      chars.push_back(NextCodePoint(tokens[i], &pos));
    }
    size_t leading = CountSpaces(chars, false);
    const size_t trailing = CountSpaces(chars, true);
    TextSpan& span = encoding->offsets[i];
    if (leading > 0) {
      const bool first = i == 0 || span.start == 0;
      if (first && trim_add_prefix_space_ && leading == 1) leading = 0;
      span.start = static_cast<uint32_t>(
          std::min<size_t>(span.start + leading, span.end));
    }
    if (trailing > 0 && span.end >= trailing) {
      span.end = static_cast<uint32_t>(
          std::max<size_t>(span.end - trailing, span.start));
    }
  }
}

absl::StatusOr<std::string> HfTokenizer::DecodeIds(
    const std::vector<int64_t>& ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id > 0x7FFFFFFF) continue;  // HF skips unknown ids
    const std::string* token = nullptr;
    if (const AddedToken* added = added_.Find(static_cast<int32_t>(id))) {
      token = &added->content;
    } else {
      token = model_.IdToToken(static_cast<int32_t>(id));
    }
    if (token == nullptr) continue;
    if (skip_special_tokens && special_contents_.contains(*token)) continue;
    tokens.push_back(*token);
  }
  return decoder_.Decode(std::move(tokens));
}

absl::StatusOr<std::vector<int64_t>> HfTokenizer::Encode(
    std::string_view text) const {
  LORAPLEX_ASSIGN_OR_RETURN(TokenizerEncoding encoding,
                            EncodeWithOffsets(text, false));
  return std::move(encoding.ids);
}

absl::StatusOr<std::string> HfTokenizer::Decode(
    const std::vector<int64_t>& ids) const {
  return DecodeIds(ids, /*skip_special_tokens=*/true);
}

namespace {

// What a directory's tokenizer_config.json (over special_tokens_map.json)
// says of special tokens, read once.
struct TokenizerConfigTokens {
  std::map<std::string, std::string> strings;
  bool add_bos = false;
};

absl::StatusOr<TokenizerConfigTokens> ReadTokenizerConfigTokens(
    const std::string& model_dir) {
  namespace fs = std::filesystem;
  TokenizerConfigTokens tokens;
  // tokenizer_config.json wins over special_tokens_map.json, as in
  // transformers (a null there unsets the token).
  for (const char* file :
       {"special_tokens_map.json", "tokenizer_config.json"}) {
    const fs::path config_path = fs::path(model_dir) / file;
    if (!fs::exists(config_path)) continue;
    LORAPLEX_ASSIGN_OR_RETURN(json config,
                              ReadUntrustedJsonFile(config_path.string()));
    if (!config.is_object()) continue;
    for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token",
                            "pad_token", "cls_token", "mask_token"}) {
      if (!config.contains(key)) continue;
      if (std::optional<std::string> name = TokenName(config, key)) {
        tokens.strings[key] = *std::move(name);
      } else {
        tokens.strings.erase(key);
      }
    }
    if (config.contains("add_bos_token")) {
      tokens.add_bos = config["add_bos_token"] == true;
    }
  }
  return tokens;
}

}  // namespace

absl::StatusOr<std::map<std::string, std::string>> ReadSpecialTokenStrings(
    const std::string& model_dir) {
  LORAPLEX_ASSIGN_OR_RETURN(TokenizerConfigTokens tokens,
                            ReadTokenizerConfigTokens(model_dir));
  return std::move(tokens.strings);
}

absl::StatusOr<std::unique_ptr<HfTokenizer>> LoadHfTokenizer(
    const std::string& model_dir) {
  namespace fs = std::filesystem;
  const std::string path = (fs::path(model_dir) / kHfTokenizerFile).string();
  LORAPLEX_ASSIGN_OR_RETURN(json root,
                            ReadUntrustedJsonFile(path, kTokenizerJsonOptions));
  SpecialTokenNames names;
  LORAPLEX_ASSIGN_OR_RETURN(TokenizerConfigTokens tokens,
                            ReadTokenizerConfigTokens(model_dir));
  for (auto [key, field] :
       {std::pair{"bos_token", &names.bos}, std::pair{"eos_token", &names.eos},
        std::pair{"pad_token", &names.pad}}) {
    if (auto it = tokens.strings.find(key); it != tokens.strings.end()) {
      *field = it->second;
    }
  }
  names.add_bos = tokens.add_bos;
  for (const char* file : {"generation_config.json", "config.json"}) {
    const fs::path config_path = fs::path(model_dir) / file;
    if (names.eos_id.has_value() || !fs::exists(config_path)) continue;
    absl::StatusOr<json> config = ReadUntrustedJsonFile(config_path.string());
    if (config.ok()) names.eos_id = FirstId(*config, "eos_token_id");
  }
  return HfTokenizer::FromJson(root, path, names);
}

}  // namespace loraplex
