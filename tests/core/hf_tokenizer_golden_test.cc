// tokenizer.json against HF tokenizers: for every configuration made by
// tools/golden/make_tokenizer_golden.py, every corpus line must give HF's
// ids token for token, HF's decode, HF's offsets (UTF-8 bytes) and HF's
// post-processed ids, also on strings where HF's Unicode tables are older or
// newer than utf8proc's and PCRE2's (hf_unicode_tables.h).
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/hf_tokenizer.h"
#include "core/tokenizer/load_tokenizer.h"
#include "tests/common/golden_files.h"

namespace loraplex {
namespace {

using json = nlohmann::ordered_json;

const std::string kFixtures = GoldenPath("tokenizers");

std::string Shown(const std::string& text) {
  std::string shown = json(text).dump();
  if (shown.size() > 120) shown = shown.substr(0, 117) + "...";
  return shown;
}

class HfTokenizerGoldenTest : public ::testing::TestWithParam<std::string> {};

TEST_P(HfTokenizerGoldenTest, MatchesHfTokenizers) {
  const std::string dir = absl::StrCat(kFixtures, "/", GetParam());
  absl::StatusOr<std::unique_ptr<HfTokenizer>> tokenizer = LoadHfTokenizer(dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<json> corpus = ReadGoldenLines(kFixtures + "/corpus.jsonl");
  const std::vector<json> expected = ReadGoldenLines(dir + "/expected.jsonl");
  ASSERT_EQ(corpus.size(), expected.size());
  ASSERT_GE(corpus.size(), 2000u);

  int mismatches = 0;
  size_t checked_offsets = 0, checked_specials = 0;
  const auto report = [&](size_t line, const std::string& what,
                          const std::string& got, const std::string& want) {
    if (++mismatches <= 8) {
      ADD_FAILURE() << GetParam() << " corpus line " << line + 1 << " "
                    << Shown(corpus[line]["text"].get<std::string>()) << ": "
                    << what << "\n  got  " << got << "\n  want " << want;
    }
  };
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i]["text"].get<std::string>();
    absl::StatusOr<TokenizerEncoding> encoding =
        (*tokenizer)->EncodeWithOffsets(text, false);
    ASSERT_TRUE(encoding.ok()) << "line " << i + 1 << ": " << encoding.status();
    const std::vector<int64_t> want_ids =
        expected[i]["ids"].get<std::vector<int64_t>>();
    if (encoding->ids != want_ids) {
      report(i, "ids", json(encoding->ids).dump(), json(want_ids).dump());
      continue;
    }
    absl::StatusOr<std::string> decoded = (*tokenizer)->Decode(want_ids);
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    const std::string want_text = expected[i]["decoded"].get<std::string>();
    if (*decoded != want_text) {
      report(i, "decode", Shown(*decoded), Shown(want_text));
    }
    if (expected[i].contains("offsets")) {
      ++checked_offsets;
      json got = json::array();
      for (const TextSpan& span : encoding->offsets) {
        got.push_back({span.start, span.end});
      }
      if (got != expected[i]["offsets"]) {
        report(i, "offsets", got.dump(), expected[i]["offsets"].dump());
      }
    }
    if (expected[i].contains("with_specials")) {
      ++checked_specials;
      absl::StatusOr<TokenizerEncoding> with_specials =
          (*tokenizer)->EncodeWithOffsets(text, true);
      ASSERT_TRUE(with_specials.ok()) << with_specials.status();
      if (json(with_specials->ids) != expected[i]["with_specials"]) {
        report(i, "ids with special tokens", json(with_specials->ids).dump(),
               expected[i]["with_specials"].dump());
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << GetParam() << ": " << mismatches
                           << " corpus lines differ from HF tokenizers";
  EXPECT_GT(checked_offsets, 500u);
  EXPECT_GT(checked_specials, 50u);
}

INSTANTIATE_TEST_SUITE_P(Configurations, HfTokenizerGoldenTest,
                         ::testing::Values("llama3_like", "qwen2_like", "gpt2",
                                           "llama2_like", "metaspace_digits",
                                           "nfkc_lowercase", "han_split"));

}  // namespace
}  // namespace loraplex
