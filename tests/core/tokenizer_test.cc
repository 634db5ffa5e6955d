#include "core/tokenizer/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/tokenizer/load_tokenizer.h"
#include "core/tokenizer/sentencepiece_tokenizer.h"
#include "tests/common/test_dir.h"

namespace loraplex {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

fs::path FreshDir(const std::string& name) { return FreshTestDir(name); }

TEST(ByteTokenizerTest, IdsAreBytesAndSpecialsFollow) {
  ByteTokenizer tokenizer;
  const std::string text = "h\xc3\xa9!\n";  // "hé!\n" in UTF-8.
  const std::vector<int64_t> ids = tokenizer.Encode(text).value();
  EXPECT_EQ(ids, (std::vector<int64_t>{104, 0xc3, 0xa9, 33, 10}));
  EXPECT_EQ(tokenizer.Decode(ids).value(), text);
  std::vector<int64_t> with_specials = {
      ByteTokenizer::kBos, 104, ByteTokenizer::kEos, ByteTokenizer::kPad};
  EXPECT_EQ(tokenizer.Decode(with_specials).value(), "h");
  EXPECT_EQ(tokenizer.vocab_size(), 259);
  const TokenizerEncoding encoding = tokenizer.EncodeWithOffsets(text).value();
  EXPECT_EQ(encoding.ids, ids);
  ASSERT_EQ(encoding.offsets.size(), ids.size());
  for (uint32_t i = 0; i < encoding.offsets.size(); ++i) {
    EXPECT_EQ(encoding.offsets[i], (TextSpan{i, i + 1}));
  }
}

TEST(LoadTokenizerTest, PicksByteTokenizerFromDescription) {
  const fs::path dir = FreshDir("byte");
  std::ofstream(dir / std::string(kByteTokenizerFile))
      << ByteTokenizer::DescriptionJson();
  auto tokenizer = LoadTokenizer(dir.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->bos_id(), ByteTokenizer::kBos);
}

TEST(LoadTokenizerTest, RejectsDescriptionThatDisagreesWithLayout) {
  const fs::path dir = FreshDir("bad_byte");
  std::ofstream(dir / std::string(kByteTokenizerFile))
      << R"({"type":"byte","vocab_size":259,"bos_id":1,"eos_id":257,"pad_id":258})";
  auto tokenizer = LoadTokenizer(dir.string());
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(std::string(tokenizer.status().message()),
              HasSubstr("\"bos_id\" must be 256"));
}

TEST(LoadTokenizerTest, RejectsMistypedDescription) {
  const fs::path dir = FreshDir("typed");
  for (const char* text : {R"({"type": 1})", R"([1, 2])", "{"}) {
    std::ofstream(dir / std::string(kByteTokenizerFile)) << text;
    auto tokenizer = LoadTokenizer(dir.string());
    EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument)
        << text;
  }
}

TEST(LoadTokenizerTest, MissingTokenizerIsNotFound) {
  auto tokenizer = LoadTokenizer(FreshDir("none").string());
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
}

TEST(LoadTokenizerTest, CorruptSentencePieceModelIsRejected) {
  const fs::path dir = FreshDir("corrupt_sp");
  std::ofstream(dir / "tokenizer.model") << "definitely not a protobuf";
  auto tokenizer = LoadTokenizer(dir.string());
  ASSERT_FALSE(tokenizer.ok());
  EXPECT_THAT(std::string(tokenizer.status().message()),
              HasSubstr("not a SentencePiece model"));
}

// Trains a real (tiny) SentencePiece model with the library's own trainer
// and checks our wrapper against the library's processor.
TEST(LoadTokenizerTest, SentencePieceModelRoundTrips) {
  const fs::path dir = FreshDir("sp");
  const fs::path corpus = dir / "corpus.txt";
  {
    std::ofstream out(corpus);
    for (int i = 0; i < 200; ++i) {
      out << "the quick brown fox jumps over the lazy dog " << i << "\n"
          << "low rank adapters train on a frozen base model\n";
    }
  }
  const absl::Status trained = TrainSentencePieceModel(
      "--input=" + corpus.string() +
      " --model_prefix=" + (dir / "tokenizer").string() +
      " --vocab_size=64 --model_type=unigram --bos_id=1 --eos_id=2 "
      "--unk_id=0 --pad_id=3 --minloglevel=2");
  ASSERT_TRUE(trained.ok()) << trained;
  auto tokenizer = LoadTokenizer(dir.string());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->vocab_size(), 64);
  EXPECT_EQ((*tokenizer)->bos_id(), 1);
  EXPECT_EQ((*tokenizer)->eos_id(), 2);
  EXPECT_EQ((*tokenizer)->pad_id(), 3);
  const std::string text = "the lazy fox trains adapters";
  std::vector<int64_t> ids = (*tokenizer)->Encode(text).value();
  ASSERT_FALSE(ids.empty());
  for (int64_t id : ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 64);
  }
  EXPECT_EQ((*tokenizer)->Decode(ids).value(), text);
  ids.insert(ids.begin(), 1);  // Specials are dropped on decode.
  ids.push_back(2);
  EXPECT_EQ((*tokenizer)->Decode(ids).value(), text);

  // Offsets: the library's own piece spans, which tile the text (the dummy
  // prefix space belongs to the piece after it).
  const TokenizerEncoding encoding =
      (*tokenizer)->EncodeWithOffsets(text).value();
  EXPECT_EQ(encoding.ids, (*tokenizer)->Encode(text).value());
  ASSERT_EQ(encoding.offsets.size(), encoding.ids.size());
  uint32_t covered = 0;
  for (const TextSpan& span : encoding.offsets) {
    EXPECT_EQ(span.start, covered);
    EXPECT_GE(span.end, span.start);
    covered = span.end;
  }
  EXPECT_EQ(covered, text.size());

  // A long-running server loads tokenizers again and again.
  for (int i = 0; i < 40; ++i) {
    auto again = LoadTokenizer(dir.string());
    ASSERT_TRUE(again.ok()) << "load " << i << ": " << again.status();
    EXPECT_EQ((*again)->Encode(text).value(),
              (*tokenizer)->Encode(text).value());
  }
}

}  // namespace
}  // namespace loraplex
