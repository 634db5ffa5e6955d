// DecoderChain: HF tokenizers' decoders, applied in order to token strings.
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/config_json.h"
#include "core/tokenizer/text_pipeline.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

using nlohmann::json;

constexpr std::string_view kReplacementCharacter = "\xEF\xBF\xBD";

std::u32string CodePoints(std::string_view text) {
  std::u32string out;
  size_t pos = 0;
  while (pos < text.size()) out.push_back(NextCodePoint(text, &pos));
  return out;
}

std::string Utf8(const std::u32string& text) {
  std::string out;
  for (char32_t c : text) AppendUtf8(c, &out);
  return out;
}

// ByteFallback: the byte of a "<0xNN>" token.
std::optional<unsigned char> FallbackByte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') {
    return std::nullopt;
  }
  int value = 0;
  for (int i = 3; i < 5; ++i) {
    const char c = token[i];
    int digit = -1;
    if (c >= '0' && c <= '9') digit = c - '0';
    if (c >= 'a' && c <= 'f') digit = c - 'a' + 10;
    if (c >= 'A' && c <= 'F') digit = c - 'A' + 10;
    if (digit < 0) return std::nullopt;
    value = value * 16 + digit;
  }
  return static_cast<unsigned char>(value);
}

// Strict UTF-8 of the collected bytes, else one U+FFFD per byte (HF).
void FlushFallbackBytes(std::string* bytes, std::vector<std::string>* out) {
  if (bytes->empty()) return;
  if (IsValidUtf8(*bytes)) {
    out->push_back(*bytes);
  } else {
    for (size_t i = 0; i < bytes->size(); ++i) {
      out->emplace_back(kReplacementCharacter);
    }
  }
  bytes->clear();
}

}  // namespace

absl::StatusOr<DecoderChain> DecoderChain::FromJson(const json& config,
                                                    const std::string& where) {
  DecoderChain chain;
  if (!config.is_null()) {
    chain.present_ = true;
    LORAPLEX_RETURN_IF_ERROR(chain.Add(config, where, 0));
  }
  return chain;
}

absl::Status DecoderChain::Add(const json& config, const std::string& where,
                               int depth) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string type, ComponentType(config, where));
  Step step;
  step.kind = Kind::kFuse;
  if (type == "Sequence") {
    return ForEachInSequence(
        config, "decoders", where, depth,
        [this](const json& item, const std::string& item_where, int next) {
          return Add(item, item_where, next);
        });
  }
  if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = Kind::kFuse;
  } else if (type == "Metaspace" || type == "Strip") {
    step.kind = type == "Metaspace" ? Kind::kMetaspace : Kind::kStrip;
    LORAPLEX_ASSIGN_OR_RETURN(
        step.content,
        CharField(config, type == "Metaspace" ? "replacement" : "content",
                  where));
    if (type == "Metaspace") {
      LORAPLEX_ASSIGN_OR_RETURN(step.prepend,
                                PrependSchemeFromJson(config, where));
    } else {
      LORAPLEX_ASSIGN_OR_RETURN(step.start, CountField(config, "start", where));
      LORAPLEX_ASSIGN_OR_RETURN(step.stop, CountField(config, "stop", where));
    }
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    LORAPLEX_RETURN_IF_ERROR(
        ReplaceFromJson(config, where, &step.pattern, &step.replacement));
  } else {
    return ConfigError(where,
                       absl::StrCat("decoder type \"", type,
                                    "\" is not supported (supported: "
                                    "ByteLevel, ByteFallback, Metaspace, Fuse, "
                                    "Strip, Replace, Sequence)"));
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status DecoderChain::Apply(const Step& step,
                                 std::vector<std::string>* tokens) const {
  std::vector<std::string> out;
  switch (step.kind) {
    case Kind::kByteLevel: {
      std::string bytes;
      for (const std::string& token : *tokens) {
        std::string mapped;
        bool all_mapped = true;
        size_t pos = 0;
        while (pos < token.size()) {
          const int byte = ByteLevelByte(NextCodePoint(token, &pos));
          if (byte < 0) {
            all_mapped = false;
            break;
          }
          mapped.push_back(static_cast<char>(byte));
        }
        bytes += all_mapped ? mapped : token;
      }
      out.push_back(Utf8Lossy(bytes));
      break;
    }
    case Kind::kByteFallback: {
      std::string bytes;
      for (std::string& token : *tokens) {
        if (std::optional<unsigned char> byte = FallbackByte(token)) {
          bytes.push_back(static_cast<char>(*byte));
          continue;
        }
        FlushFallbackBytes(&bytes, &out);
        out.push_back(std::move(token));
      }
      FlushFallbackBytes(&bytes, &out);
      break;
    }
    case Kind::kMetaspace:
      for (size_t i = 0; i < tokens->size(); ++i) {
        std::u32string text;
        for (char32_t c : CodePoints((*tokens)[i])) {
          if (c != step.content) {
            text.push_back(c);
          } else if (i != 0 || step.prepend == PrependScheme::kNever) {
            text.push_back(U' ');
          }
        }
        out.push_back(Utf8(text));
      }
      break;
    case Kind::kFuse:
      out.push_back(absl::StrJoin(*tokens, ""));
      break;
    case Kind::kStrip:
      for (const std::string& token : *tokens) {
        const std::u32string chars = CodePoints(token);
        size_t begin = 0;
        while (begin < step.start && begin < chars.size() &&
               chars[begin] == step.content) {
          ++begin;
        }
        size_t end = chars.size();
        for (size_t i = 0; i < step.stop && end > begin; ++i) {
          if (chars[end - 1] != step.content) break;
          --end;
        }
        out.push_back(Utf8(chars.substr(begin, end - begin)));
      }
      break;
    case Kind::kReplace:
      for (const std::string& token : *tokens) {
        LORAPLEX_ASSIGN_OR_RETURN(std::vector<PatternPiece> pieces,
                                  step.pattern[0].FindMatches(token));
        std::string text;
        for (const PatternPiece& piece : pieces) {
          if (piece.is_match) {
            text += step.replacement;
          } else {
            text.append(token, piece.start, piece.end - piece.start);
          }
        }
        out.push_back(std::move(text));
      }
      break;
  }
  tokens->swap(out);
  return absl::OkStatus();
}

absl::StatusOr<std::string> DecoderChain::Decode(
    std::vector<std::string> tokens) const {
  if (!present_) return absl::StrJoin(tokens, " ");
  for (const Step& step : steps_) {
    LORAPLEX_RETURN_IF_ERROR(Apply(step, &tokens));
  }
  return absl::StrJoin(tokens, "");
}

}  // namespace loraplex
