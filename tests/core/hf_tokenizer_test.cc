// tokenizer.json pieces against closed forms (HF tokenizers' documented
// behaviours, the Unicode standard's examples) and its error messages. The
// golden test checks whole tokenizers against HF itself.
#include "core/tokenizer/hf_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/hf_unicode_tables.h"
#include "core/tokenizer/load_tokenizer.h"
#include "core/tokenizer/normalized_text.h"
#include "core/tokenizer/text_pattern.h"
#include "core/tokenizer/text_pipeline.h"
#include "core/tokenizer/unicode_text.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

const fs::path kFixtures =
    fs::path(LORAPLEX_SOURCE_DIR) / "tests/fixtures/golden/tokenizers";

std::vector<std::string> Texts(const std::vector<NormalizedText>& pieces) {
  std::vector<std::string> texts;
  for (const NormalizedText& piece : pieces) texts.push_back(piece.text());
  return texts;
}

// HF's documented example for SplitDelimiterBehavior.
TEST(NormalizedTextTest, SplitBehavioursAsDocumentedByHf) {
  const NormalizedText text("the-final--countdown", 0);
  const TextPattern dash = TextPattern::Literal("-").value();
  const auto split = [&](SplitBehavior behavior) {
    return Texts(text.Split(dash, behavior).value());
  };
  EXPECT_THAT(split(SplitBehavior::kRemoved),
              ElementsAre("the", "final", "countdown"));
  EXPECT_THAT(split(SplitBehavior::kIsolated),
              ElementsAre("the", "-", "final", "-", "-", "countdown"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithPrevious),
              ElementsAre("the-", "final-", "-", "countdown"));
  EXPECT_THAT(split(SplitBehavior::kMergedWithNext),
              ElementsAre("the", "-final", "-", "-countdown"));
  EXPECT_THAT(split(SplitBehavior::kContiguous),
              ElementsAre("the", "-", "final", "--", "countdown"));
  // Inverted: the non-dashes are the matches, removed; each dash is a
  // match of its own, so they stay apart.
  EXPECT_THAT(
      Texts(text.Split(dash.Inverted(), SplitBehavior::kRemoved).value()),
      ElementsAre("-", "-", "-"));
}

TEST(NormalizedTextTest, ReplaceAndPrependKeepOriginalSpans) {
  NormalizedText text("ab c", 10);
  text.Prepend("\xe2\x96\x81");
  ASSERT_TRUE(
      text.Replace(TextPattern::Literal(" ").value(), "\xe2\x96\x81").ok());
  EXPECT_EQ(text.text(),
            "\xe2\x96\x81"
            "ab\xe2\x96\x81"
            "c");
  // "▁" before "a" maps to "a"; the one for the space to the space.
  EXPECT_EQ(text.OriginalSpan(0, 3), (TextSpan{10, 11}));
  EXPECT_EQ(text.OriginalSpan(5, 8), (TextSpan{12, 13}));
  EXPECT_EQ(text.OriginalSpan(), (TextSpan{10, 14}));
}

TEST(UnicodeTextTest, NormalizationFormsAndOrigins) {
  std::vector<size_t> origin;
  // Composition keeps the starter's origin.
  EXPECT_EQ(NormalizeCodePoints(U"e\u0301x", UnicodeForm::kNfc, &origin),
            U"\u00e9x");
  EXPECT_THAT(origin, ElementsAre(0, 2));
  // Decomposition: every piece from its source.
  EXPECT_EQ(NormalizeCodePoints(U"\u00e9", UnicodeForm::kNfd, &origin),
            U"e\u0301");
  EXPECT_THAT(origin, ElementsAre(0, 0));
  // Canonical ordering (dot below, class 220, before acute, 230), then the
  // dot composes with the starter.
  EXPECT_EQ(NormalizeCodePoints(U"a\u0301\u0323", UnicodeForm::kNfc, &origin),
            U"\u1ea1\u0301");
  EXPECT_THAT(origin, ElementsAre(0, 1));
  // A mark of a lower class that does not compose (grave below, 220) does
  // not block the acute (230) from composing with the starter.
  EXPECT_EQ(NormalizeCodePoints(U"a\u0316\u0301", UnicodeForm::kNfc, &origin),
            U"\u00e1\u0316");
  EXPECT_THAT(origin, ElementsAre(0, 1));
  // Hangul jamo L V T compose into one syllable.
  EXPECT_EQ(
      NormalizeCodePoints(U"\u1100\u1161\u11a8", UnicodeForm::kNfc, &origin),
      U"\uac01");
  EXPECT_EQ(NormalizeCodePoints(U"\ufb01\u2460", UnicodeForm::kNfkc, &origin),
            U"fi1");
  EXPECT_THAT(origin, ElementsAre(0, 0, 1));
  EXPECT_EQ(NormalizeUnicode("\xef\xac\x81", UnicodeForm::kNfkd).value(), "fi");
}

TEST(UnicodeTextTest, LowercaseIncludesTheUnconditionalSpecialCase) {
  std::u32string out;
  for (char32_t c : std::u32string(U"A\u0130\u0391")) AppendLowercase(c, &out);
  EXPECT_EQ(out, U"ai\u0307\u03b1");
}

// The Unicode standard's examples of replacing maximal subparts (Table 3-8).
TEST(UnicodeTextTest, LossyDecodingReplacesMaximalSubparts) {
  const std::string fffd = "\xef\xbf\xbd";
  EXPECT_EQ(Utf8Lossy("\xf0\x9f\x98"
                      "A"),
            fffd + "A");
  EXPECT_EQ(Utf8Lossy("\xc0\x80"), fffd + fffd);
  EXPECT_EQ(Utf8Lossy("\xed\xa0\x80"), fffd + fffd + fffd);
  EXPECT_EQ(Utf8Lossy("a\xe2\x82"), "a" + fffd);
  EXPECT_EQ(Utf8Lossy("\xe2\x82\xac"), "\xe2\x82\xac");
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_TRUE(IsValidUtf8("\xf4\x8f\xbf\xbf"));
}

TEST(TextPatternTest, OnigurumaEscapesKeepTheirMeaning) {
  EXPECT_EQ(OnigurumaToPcre2("\\s+(?!\\S)").value(),
            "\\p{White_Space}+(?!\\P{White_Space})");
  EXPECT_THAT(OnigurumaToPcre2("[^\\s\\p{L}]").value(),
              ::testing::StartsWith("[^\\p{White_Space}\\p{L}\\x{1c89}"));
  EXPECT_EQ(OnigurumaToPcre2("\\p{Alphabetic}[\\P{Greek}]").value(),
            "\\p{Alphabetic}[\\P{Greek}]");
  EXPECT_EQ(OnigurumaToPcre2("\\h[\\h]").value(), "[0-9a-fA-F][0-9a-fA-F]");
  // U+180E is not White_Space (PCRE2's own \s would take it); U+3000 is.
  const TextPattern space = TextPattern::Regex("\\s").value();
  EXPECT_FALSE(space.FindMatches("\xe1\xa0\x8e").value()[0].is_match);
  EXPECT_TRUE(space.FindMatches("\xe3\x80\x80").value()[0].is_match);
  EXPECT_EQ(TextPattern::Regex("(").status().code(),
            absl::StatusCode::kInvalidArgument);
}

// HF's regexes (Oniguruma) know Unicode 16.0's categories, PCRE2 10.42 only
// 14.0's: U+1C89 (Lu, 16.0) is a letter, U+10D40 (Nd, 16.0) a digit, and
// U+1171E moved from Mn to Mc; U+11DE0 (Nd, 17.0) is unassigned to both.
TEST(TextPatternTest, CategoriesAreOnigurumas) {
  const auto matches = [](std::string_view pattern, std::string_view text) {
    return TextPattern::Regex(pattern)
        .value()
        .FindMatches(text)
        .value()[0]
        .is_match;
  };
  EXPECT_TRUE(matches("\\p{L}", "\u1c89"));
  EXPECT_TRUE(matches("\\p{Lu}", "\u1c89"));
  EXPECT_FALSE(matches("\\P{L}", "\u1c89"));
  EXPECT_FALSE(matches("[^\\p{L}\\p{N}]", "\u1c89"));
  EXPECT_TRUE(matches("\\p{^L}", "1"));
  EXPECT_TRUE(matches("\\p{N}", "\U00010D40"));
  EXPECT_TRUE(matches("\\d", "\U00010D40"));
  EXPECT_TRUE(matches("\\w", "\U00010D40"));
  EXPECT_FALSE(matches("\\p{N}", "\U00011DE0"));
  EXPECT_FALSE(matches("\\p{Mn}", "\U0001171E"));
  EXPECT_TRUE(matches("\\p{Mc}", "\U0001171E"));
  EXPECT_TRUE(matches("\\p{M}", "\U0001171E"));
  EXPECT_TRUE(matches("\\p{Mn}", "\u0301"));
  // Oniguruma's \p{Han} is the Script property (U+3001 is Common), PCRE2's
  // Script_Extensions; CJK extension H (Unicode 15) is Han; Garay (16) is a
  // script PCRE2 10.42 does not know.
  EXPECT_FALSE(matches("\\p{Han}", "\u3001"));
  EXPECT_TRUE(matches("\\P{Han}", "\u3001"));
  EXPECT_TRUE(matches("\\p{Han}", "\u4e00"));
  EXPECT_TRUE(matches("\\p{Han}", "\U00031350"));
  EXPECT_TRUE(matches("[\\p{Garay}]", "\U00010D50"));
  EXPECT_FALSE(matches("\\p{Garay}", "a"));
}

// The tables were measured against these library versions; another version
// of either needs tools/golden/make_hf_unicode_tables.py run again.
TEST(UnicodeTextTest, HfTablesMatchTheLinkedLibraries) {
  EXPECT_THAT(
      std::string(utf8proc_version()),
      ::testing::StartsWith(absl::StrCat(hf_unicode::kUtf8procMajor, ".",
                                         hf_unicode::kUtf8procMinor, ".")));
  char pcre2[64] = {};
  pcre2_config(PCRE2_CONFIG_VERSION, pcre2);
  EXPECT_THAT(std::string(pcre2),
              ::testing::StartsWith(absl::StrCat(
                  hf_unicode::kPcre2Major, ".", hf_unicode::kPcre2Minor, " ")));
}

// HF's normalizers know Unicode 9.0: U+1DF6 (class 232, Unicode 10) is not
// reordered before U+0316 (220), U+07FD (Unicode 11) blocks nothing and
// composes nothing, U+11935 U+11930 do not compose (Unicode 13), U+32FF
// (12.1) has no compatibility decomposition; older marks behave as ever.
TEST(UnicodeTextTest, NormalizationUsesHfsUnicodeVersion) {
  std::vector<size_t> origin;
  EXPECT_EQ(NormalizeCodePoints(U"a\u1df6\u0316", UnicodeForm::kNfd, &origin),
            U"a\u1df6\u0316");
  EXPECT_EQ(NormalizeCodePoints(U"e\u07fd\u0301", UnicodeForm::kNfc, &origin),
            U"e\u07fd\u0301");
  EXPECT_EQ(
      NormalizeCodePoints(U"\U00011935\U00011930", UnicodeForm::kNfc, &origin),
      U"\U00011935\U00011930");
  EXPECT_EQ(NormalizeUnicode("\u32ff", UnicodeForm::kNfkc).value(), "\u32ff");
  EXPECT_EQ(NormalizeUnicode("e\u07fd\u0301", UnicodeForm::kNfc).value(),
            "e\u07fd\u0301");
  EXPECT_EQ(NormalizeUnicode("a\u0316\u0301", UnicodeForm::kNfd).value(),
            "a\u0316\u0301");
  EXPECT_EQ(NormalizeUnicode("a\u0301\u0316", UnicodeForm::kNfd).value(),
            "a\u0316\u0301");
}

// Rust's char methods (Unicode 16 and later) and the older table of HF's
// Punctuation pre-tokenizer.
TEST(UnicodeTextTest, CharacterClassesAreHfs) {
  EXPECT_TRUE(IsNumeric(0x10D40));  // GARAY DIGIT ZERO, Unicode 16
  EXPECT_TRUE(IsNumeric(0x0661));
  EXPECT_TRUE(IsPunctuation(0x166D));   // Po before Unicode 12, now So
  EXPECT_FALSE(IsPunctuation(0x2E43));  // Po since Unicode 10
  EXPECT_TRUE(IsPunctuation(0x2E3A));
  std::u32string lower;
  AppendLowercase(0x1C89, &lower);  // CYRILLIC CAPITAL LETTER TJE, Unicode 16
  AppendLowercase(0x0041, &lower);
  EXPECT_EQ(lower, U"\u1c8aa");
}

TEST(TextPatternTest, LiteralsAreNotRegexes) {
  const TextPattern dot = TextPattern::Literal(".*\\E").value();
  const std::vector<PatternPiece> pieces = dot.FindMatches("a.*\\Eb").value();
  ASSERT_EQ(pieces.size(), 3u);
  EXPECT_TRUE(pieces[1].is_match);
  EXPECT_EQ(pieces[1].start, 1u);
  EXPECT_EQ(pieces[1].end, 5u);
}

// A character-level BPE with HF's WordPiece-like options.
json SubwordTokenizer() {
  return json::parse(R"({
    "added_tokens": [{"id": 0, "content": "[UNK]", "special": true}],
    "normalizer": {"type": "Sequence", "normalizers": [
        {"type": "Lowercase"}, {"type": "Strip"}]},
    "pre_tokenizer": {"type": "WhitespaceSplit"},
    "model": {"type": "BPE", "unk_token": "[UNK]", "fuse_unk": true,
              "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
              "vocab": {"[UNK]": 0, "a": 1, "##b": 2, "##c</w>": 3, "ab": 4,
                        "abc</w>": 5, "c</w>": 6, "##b</w>": 7},
              "merges": [["a", "##b"]]},
    "decoder": {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "</w>"}, "content": " "},
        {"type": "Strip", "content": " ", "start": 0, "stop": 1}]}
  })");
}

TEST(HfTokenizerTest, SubwordPrefixSuffixAndFusedUnknowns) {
  SpecialTokenNames names;
  names.eos = "[UNK]";
  auto tokenizer = HfTokenizer::FromJson(SubwordTokenizer(), "test", names);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  // "  ABC c XYZ " -> lowercase, strip -> words "abc", "c", "xyz".
  const TokenizerEncoding encoding =
      (*tokenizer)->EncodeWithOffsets("  ABC c XYZ ", false).value();
  // a + ##b merge to "ab"; "##c</w>" stays; "xyz" is one fused [UNK].
  EXPECT_THAT(encoding.ids, ElementsAre(4, 3, 6, 0));
  EXPECT_EQ(encoding.offsets[0], (TextSpan{2, 4}));
  EXPECT_EQ(encoding.offsets[3], (TextSpan{8, 11}));
  // Replace turns "</w>" into a space, then Strip drops each token's
  // trailing space (decoders work token by token).
  EXPECT_EQ((*tokenizer)->DecodeIds({4, 3, 6}, true).value(), "ab##cc");
}

// Llama 3's ignore_merges: a word in the vocabulary is one token even when
// the merges would build it otherwise.
TEST(HfTokenizerTest, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json config = json::parse(R"({
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "bc": 3,
                                       "abc": 4},
              "merges": [["b", "c"]]}})");
  SpecialTokenNames names;
  names.eos = "a";
  for (bool ignore : {false, true}) {
    config["model"]["ignore_merges"] = ignore;
    auto tokenizer = HfTokenizer::FromJson(config, "test", names);
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const std::vector<int64_t> want =
        ignore ? std::vector<int64_t>{4} : std::vector<int64_t>{0, 3};
    EXPECT_EQ((*tokenizer)->Encode("abc").value(), want);
  }
}

TEST(HfTokenizerTest, BosComesFromTheTemplateAndEosFromTheConfig) {
  auto llama3 = LoadHfTokenizer((kFixtures / "llama3_like").string());
  ASSERT_TRUE(llama3.ok()) << llama3.status();
  EXPECT_EQ((*llama3)->bos_id(), (*llama3)->TokenToId("<|begin_of_text|>"));
  EXPECT_EQ((*llama3)->eos_id(), (*llama3)->TokenToId("<|eot_id|>"));
  auto qwen2 = LoadHfTokenizer((kFixtures / "qwen2_like").string());
  ASSERT_TRUE(qwen2.ok()) << qwen2.status();
  EXPECT_FALSE((*qwen2)->bos_id().has_value());
  EXPECT_EQ((*qwen2)->eos_id(), (*qwen2)->TokenToId("<|im_end|>"));
  EXPECT_EQ((*qwen2)->pad_id(), (*qwen2)->TokenToId("<|endoftext|>"));
  EXPECT_EQ((*qwen2)->vocab_size(), 1406);
  // GPT-2 names a bos_token but never adds it.
  auto gpt2 = LoadHfTokenizer((kFixtures / "gpt2").string());
  ASSERT_TRUE(gpt2.ok()) << gpt2.status();
  EXPECT_FALSE((*gpt2)->bos_id().has_value());
}

TEST(HfTokenizerTest, AddBosTokenWithoutATemplateAddsTheNamedBos) {
  json config = SubwordTokenizer();
  SpecialTokenNames names;
  names.eos = "[UNK]";
  names.bos = "a";
  auto without = HfTokenizer::FromJson(config, "test", names);
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_FALSE((*without)->bos_id().has_value());
  names.add_bos = true;
  auto with = HfTokenizer::FromJson(config, "test", names);
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ((*with)->bos_id(), 1);
}

TEST(HfTokenizerTest, TokenizerJsonWinsOverTokenizerModel) {
  const fs::path dir = FreshTestDir();
  fs::copy_file(kFixtures / "gpt2/tokenizer.json", dir / "tokenizer.json");
  std::ofstream(dir / "tokenizer.model") << "not a SentencePiece model";
  std::ofstream(dir / "config.json") << R"({"eos_token_id": [0, 5]})";
  auto tokenizer = LoadTokenizer(dir.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->eos_id(), 0);  // config.json's first eos id
  EXPECT_EQ(
      (*tokenizer)->Decode((*tokenizer)->Encode("hi there").value()).value(),
      "hi there");
  EXPECT_EQ((*tokenizer)->Encode("bad \xff byte").status().code(),
            absl::StatusCode::kInvalidArgument);

  fs::remove(dir / "config.json");
  auto no_eos = LoadTokenizer(dir.string());
  EXPECT_THAT(std::string(no_eos.status().message()),
              HasSubstr("no end-of-sequence token"));
}

TEST(HfTokenizerTest, UnsupportedComponentsAreNamedWithTheirPlace) {
  struct Case {
    const char* pointer;
    json value;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"/model/type", "Unigram", "model type \"Unigram\" is not supported"},
      {"/normalizer",
       {{"type", "Precompiled"}},
       "normalizer: normalizer type \"Precompiled\" is not supported"},
      {"/pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         {{{"type", "WhitespaceSplit"}}, {{"type", "BertPreTokenizer"}}}}},
       "pre_tokenizer.pretokenizers[1]: pre_tokenizer type "
       "\"BertPreTokenizer\""},
      {"/decoder", {{"type", "WordPiece"}}, "decoder type \"WordPiece\""},
      {"/decoder",
       {{"type", "Metaspace"},
        {"replacement", "\xe2\x96\x81"},
        {"prepend_scheme", "sometimes"}},
       "decoder: \"prepend_scheme\" must be \"always\", \"first\" or "
       "\"never\""},
      {"/decoder",
       {{"type", "Strip"}, {"content", " "}, {"start", 1}},
       "\"stop\" must be a non-negative integer, got nothing"},
      {"/post_processor",
       {{"type", "RobertaProcessing"}},
       "post_processor type \"RobertaProcessing\""},
      {"/model/merges", json::array({json::array({"a", "##q"})}),
       "\"##q\", which is not in the vocab"},
      {"/model/unk_token", "<unk>", "unk_token \"<unk>\" is not in the vocab"},
      {"/model/dropout", 0.1, "BPE dropout is not supported"},
      {"/pre_tokenizer",
       {{"type", "Split"},
        {"pattern", {{"Regex", "(unclosed"}}},
        {"behavior", "Isolated"}},
       "does not compile"},
  };
  SpecialTokenNames names;
  names.eos = "[UNK]";
  for (const Case& c : cases) {
    json config = SubwordTokenizer();
    config[json::json_pointer(c.pointer)] = c.value;
    auto tokenizer = HfTokenizer::FromJson(config, "tok.json", names);
    ASSERT_FALSE(tokenizer.ok()) << c.pointer;
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(tokenizer.status().message()), HasSubstr(c.message))
        << c.pointer;
  }
  names.eos = "<|missing|>";
  EXPECT_THAT(
      std::string(HfTokenizer::FromJson(SubwordTokenizer(), "tok.json", names)
                      .status()
                      .message()),
      HasSubstr("eos_token \"<|missing|>\" is not a token"));
}

}  // namespace
}  // namespace loraplex
