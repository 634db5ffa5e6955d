#include "core/tokenizer/text_pipeline.h"

#include <array>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/config_json.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

using nlohmann::json;

// GPT-2's byte-level pre-tokenizer regex.
constexpr std::string_view kByteLevelRegex =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|"
    "\\s+(?!\\S)|\\s+";
// The Whitespace pre-tokenizer's \w+|[^\w\s]+ with the Rust regex crate's
// Unicode \w.
constexpr std::string_view kWhitespaceRegex =
    "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]+|"
    "[^\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}\\s]+";

absl::StatusOr<SplitBehavior> BehaviorField(const json& config,
                                            const std::string& where,
                                            SplitBehavior fallback) {
  if (!config.contains("behavior")) return fallback;
  static constexpr std::array<std::pair<std::string_view, SplitBehavior>, 5>
      kNames = {{{"Removed", SplitBehavior::kRemoved},
                 {"Isolated", SplitBehavior::kIsolated},
                 {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
                 {"MergedWithNext", SplitBehavior::kMergedWithNext},
                 {"Contiguous", SplitBehavior::kContiguous}}};
  const json& value = config["behavior"];
  for (const auto& [name, behavior] : kNames) {
    if (value.is_string() && value.get<std::string>() == name) return behavior;
  }
  return ConfigError(where, absl::StrCat("\"behavior\" must be one of Removed, "
                                         "Isolated, MergedWithPrevious, "
                                         "MergedWithNext, Contiguous; got ",
                                         DescribeJson(value)));
}

absl::Status Unsupported(const std::string& where, const std::string& kind,
                         const std::string& type, absl::string_view supported) {
  return ConfigError(
      where, absl::StrCat(kind, " type \"", type,
                          "\" is not supported (supported: ", supported, ")"));
}

struct ByteLevelTables {
  std::string alphabet[256];
  std::array<int, 512> byte_of{};  // indexed by code point; -1 elsewhere
  ByteLevelTables() {
    byte_of.fill(-1);
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable =
          (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const char32_t c = printable ? b : next++;
      AppendUtf8(c, &alphabet[b]);
      byte_of[c] = b;
    }
  }
};

const ByteLevelTables& Tables() {
  static const ByteLevelTables* const tables = new ByteLevelTables();
  return *tables;
}

}  // namespace

const std::string (&ByteLevelAlphabet())[256] { return Tables().alphabet; }

int ByteLevelByte(char32_t c) {
  return c < Tables().byte_of.size() ? Tables().byte_of[c] : -1;
}

absl::StatusOr<PrependScheme> PrependSchemeFromJson(const json& config,
                                                    const std::string& where) {
  if (config.contains("prepend_scheme")) {
    const json& value = config["prepend_scheme"];
    if (value == "always") return PrependScheme::kAlways;
    if (value == "first") return PrependScheme::kFirst;
    if (value == "never") return PrependScheme::kNever;
    return ConfigError(where,
                       absl::StrCat("\"prepend_scheme\" must be \"always\", "
                                    "\"first\" or \"never\", got ",
                                    DescribeJson(value)));
  }
  // Files written before prepend_scheme existed.
  LORAPLEX_ASSIGN_OR_RETURN(bool add_prefix_space,
                            BoolField(config, "add_prefix_space", true, where));
  return add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
}

absl::StatusOr<TextPattern> PatternFromJson(const json& config,
                                            const std::string& where) {
  if (config.is_object() && config.size() == 1) {
    if (config.contains("String") && config["String"].is_string()) {
      return TextPattern::Literal(config["String"].get<std::string>());
    }
    if (config.contains("Regex") && config["Regex"].is_string()) {
      absl::StatusOr<TextPattern> pattern =
          TextPattern::Regex(config["Regex"].get<std::string>());
      if (!pattern.ok()) return ConfigError(where, pattern.status().message());
      return pattern;
    }
  }
  return ConfigError(where,
                     absl::StrCat("\"pattern\" must be {\"String\": ...} or "
                                  "{\"Regex\": ...}, got ",
                                  DescribeJson(config)));
}

absl::Status ReplaceFromJson(const json& config, const std::string& where,
                             std::vector<TextPattern>* pattern,
                             std::string* content) {
  if (!config.contains("pattern")) {
    return ConfigError(where, "Replace has no pattern");
  }
  LORAPLEX_ASSIGN_OR_RETURN(TextPattern parsed,
                            PatternFromJson(config["pattern"], where));
  LORAPLEX_ASSIGN_OR_RETURN(*content, StringField(config, "content", where));
  pattern->push_back(std::move(parsed));
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Normalizers

absl::StatusOr<NormalizerChain> NormalizerChain::FromJson(
    const json& config, const std::string& where) {
  NormalizerChain chain;
  if (!config.is_null()) {
    LORAPLEX_RETURN_IF_ERROR(chain.Add(config, where, 0));
  }
  return chain;
}

absl::Status NormalizerChain::Add(const json& config, const std::string& where,
                                  int depth) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string type, ComponentType(config, where));
  Step step;
  step.kind = Kind::kUnicode;
  if (type == "Sequence") {
    return ForEachInSequence(
        config, "normalizers", where, depth,
        [this](const json& item, const std::string& item_where, int next) {
          return Add(item, item_where, next);
        });
  }
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    step.form = type == "NFC"    ? UnicodeForm::kNfc
                : type == "NFD"  ? UnicodeForm::kNfd
                : type == "NFKC" ? UnicodeForm::kNfkc
                                 : UnicodeForm::kNfkd;
  } else if (type == "Lowercase") {
    step.kind = Kind::kLowercase;
  } else if (type == "Strip") {
    step.kind = Kind::kStrip;
    LORAPLEX_ASSIGN_OR_RETURN(step.left,
                              BoolField(config, "strip_left", true, where));
    LORAPLEX_ASSIGN_OR_RETURN(step.right,
                              BoolField(config, "strip_right", true, where));
  } else if (type == "Replace") {
    step.kind = Kind::kReplace;
    LORAPLEX_RETURN_IF_ERROR(
        ReplaceFromJson(config, where, &step.pattern, &step.content));
  } else if (type == "Prepend") {
    step.kind = Kind::kPrepend;
    LORAPLEX_ASSIGN_OR_RETURN(step.content,
                              StringField(config, "prepend", where));
  } else {
    return Unsupported(where, "normalizer", type,
                       "NFC, NFD, NFKC, NFKD, Lowercase, Strip, Replace, "
                       "Prepend, Sequence");
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status NormalizerChain::Normalize(NormalizedText* text) const {
  for (const Step& step : steps_) {
    switch (step.kind) {
      case Kind::kUnicode:
        LORAPLEX_RETURN_IF_ERROR(text->Normalize(step.form));
        break;
      case Kind::kLowercase:
        text->MapCodePoints(AppendLowercase);
        break;
      case Kind::kStrip:
        text->Strip(step.left, step.right);
        break;
      case Kind::kReplace:
        LORAPLEX_RETURN_IF_ERROR(text->Replace(step.pattern[0], step.content));
        break;
      case Kind::kPrepend:
        text->Prepend(step.content);
        break;
    }
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Pre-tokenizers

absl::StatusOr<PreTokenizerChain> PreTokenizerChain::FromJson(
    const json& config, const std::string& where) {
  PreTokenizerChain chain;
  if (!config.is_null()) {
    LORAPLEX_RETURN_IF_ERROR(chain.Add(config, where, 0));
  }
  return chain;
}

absl::Status PreTokenizerChain::Add(const json& config,
                                    const std::string& where, int depth) {
  LORAPLEX_ASSIGN_OR_RETURN(std::string type, ComponentType(config, where));
  Step step;
  step.kind = Kind::kSplit;
  if (type == "Sequence") {
    return ForEachInSequence(
        config, "pretokenizers", where, depth,
        [this](const json& item, const std::string& item_where, int next) {
          return Add(item, item_where, next);
        });
  }
  if (type == "ByteLevel") {
    step.kind = Kind::kByteLevel;
    LORAPLEX_ASSIGN_OR_RETURN(
        step.add_prefix_space,
        BoolField(config, "add_prefix_space", true, where));
    LORAPLEX_ASSIGN_OR_RETURN(bool use_regex,
                              BoolField(config, "use_regex", true, where));
    if (use_regex) {
      LORAPLEX_ASSIGN_OR_RETURN(TextPattern pattern,
                                TextPattern::Regex(kByteLevelRegex));
      step.pattern.push_back(std::move(pattern));
    }
  } else if (type == "Split") {
    if (!config.contains("pattern"))
      return ConfigError(where, "Split has no pattern");
    LORAPLEX_ASSIGN_OR_RETURN(TextPattern pattern,
                              PatternFromJson(config["pattern"], where));
    LORAPLEX_ASSIGN_OR_RETURN(bool invert,
                              BoolField(config, "invert", false, where));
    step.pattern.push_back(invert ? pattern.Inverted() : std::move(pattern));
    LORAPLEX_ASSIGN_OR_RETURN(
        step.behavior, BehaviorField(config, where, SplitBehavior::kIsolated));
    if (!config.contains("behavior")) {
      return ConfigError(where, "Split has no \"behavior\"");
    }
  } else if (type == "Digits") {
    LORAPLEX_ASSIGN_OR_RETURN(
        bool individual, BoolField(config, "individual_digits", false, where));
    step.pattern.push_back(TextPattern::CodePoints(IsNumeric));
    step.behavior =
        individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else if (type == "Metaspace") {
    step.kind = Kind::kMetaspace;
    LORAPLEX_ASSIGN_OR_RETURN(char32_t replacement,
                              CharField(config, "replacement", where));
    AppendUtf8(replacement, &step.replacement);
    LORAPLEX_ASSIGN_OR_RETURN(step.prepend,
                              PrependSchemeFromJson(config, where));
    LORAPLEX_ASSIGN_OR_RETURN(step.split,
                              BoolField(config, "split", true, where));
    LORAPLEX_ASSIGN_OR_RETURN(TextPattern space, TextPattern::Literal(" "));
    step.pattern.push_back(std::move(space));
    LORAPLEX_ASSIGN_OR_RETURN(TextPattern marker,
                              TextPattern::Literal(step.replacement));
    step.pattern.push_back(std::move(marker));
  } else if (type == "Whitespace") {
    LORAPLEX_ASSIGN_OR_RETURN(TextPattern words,
                              TextPattern::Regex(kWhitespaceRegex));
    step.pattern.push_back(words.Inverted());
    step.behavior = SplitBehavior::kRemoved;
  } else if (type == "WhitespaceSplit") {
    step.pattern.push_back(TextPattern::CodePoints(IsWhitespace));
    step.behavior = SplitBehavior::kRemoved;
  } else if (type == "Punctuation") {
    step.pattern.push_back(TextPattern::CodePoints(IsPunctuation));
    LORAPLEX_ASSIGN_OR_RETURN(
        step.behavior, BehaviorField(config, where, SplitBehavior::kIsolated));
  } else {
    return Unsupported(where, "pre_tokenizer", type,
                       "ByteLevel, Split, Digits, Metaspace, Whitespace, "
                       "WhitespaceSplit, Punctuation, Sequence");
  }
  steps_.push_back(std::move(step));
  return absl::OkStatus();
}

absl::Status PreTokenizerChain::PreTokenize(
    std::vector<NormalizedText>* pieces) const {
  std::vector<NormalizedText> next;
  for (const Step& step : steps_) {
    next.clear();
    for (NormalizedText& piece : *pieces) {
      switch (step.kind) {
        case Kind::kSplit: {
          LORAPLEX_ASSIGN_OR_RETURN(
              std::vector<NormalizedText> parts,
              piece.Split(step.pattern[0], step.behavior));
          for (NormalizedText& part : parts) next.push_back(std::move(part));
          break;
        }
        case Kind::kByteLevel: {
          if (step.add_prefix_space && piece.text()[0] != ' ') {
            piece.Prepend(" ");
          }
          std::vector<NormalizedText> parts;
          if (step.pattern.empty()) {
            parts.push_back(std::move(piece));
          } else {
            LORAPLEX_ASSIGN_OR_RETURN(
                parts, piece.Split(step.pattern[0], SplitBehavior::kIsolated));
          }
          for (NormalizedText& part : parts) {
            part.MapBytes(ByteLevelAlphabet());
            next.push_back(std::move(part));
          }
          break;
        }
        case Kind::kMetaspace: {
          LORAPLEX_RETURN_IF_ERROR(
              piece.Replace(step.pattern[0], step.replacement));
          const bool starts_with_marker =
              piece.text().compare(0, step.replacement.size(),
                                   step.replacement) == 0;
          if (!starts_with_marker && (step.prepend == PrependScheme::kAlways ||
                                      (step.prepend == PrependScheme::kFirst &&
                                       piece.OriginalSpan().start == 0))) {
            piece.Prepend(step.replacement);
          }
          if (!step.split) {
            next.push_back(std::move(piece));
            break;
          }
          LORAPLEX_ASSIGN_OR_RETURN(
              std::vector<NormalizedText> parts,
              piece.Split(step.pattern[1], SplitBehavior::kMergedWithNext));
          for (NormalizedText& part : parts) next.push_back(std::move(part));
          break;
        }
      }
    }
    pieces->swap(next);
  }
  return absl::OkStatus();
}

}  // namespace loraplex
