#include "core/tokenizer/load_tokenizer.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/common/json_parse.h"
#include "core/common/status_macros.h"
#include "core/tokenizer/hf_tokenizer.h"
#include "core/tokenizer/sentencepiece_tokenizer.h"

namespace loraplex {
namespace {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadByteTokenizer(
    const std::string& path) {
  LORAPLEX_ASSIGN_OR_RETURN(nlohmann::json description,
                            ReadUntrustedJsonFile(path));
  if (!description.is_object() || !description.contains("type") ||
      description["type"] != "byte") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"type\" must be \"byte\""));
  }
  // The layout is fixed; a description that disagrees with it would make the
  // model and the tokenizer silently disagree on ids.
  const nlohmann::json expected =
      nlohmann::json::parse(ByteTokenizer::DescriptionJson());
  for (const auto& [key, value] : expected.items()) {
    if (!description.contains(key) || description[key] != value) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": \"", key, "\" must be ", value.dump()));
    }
  }
  return std::make_unique<ByteTokenizer>();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& model_dir) {
  namespace fs = std::filesystem;
  // transformers' order: tokenizer.json first.
  if (fs::exists(fs::path(model_dir) / kHfTokenizerFile)) {
    LORAPLEX_ASSIGN_OR_RETURN(std::unique_ptr<HfTokenizer> tokenizer,
                              LoadHfTokenizer(model_dir));
    return std::unique_ptr<Tokenizer>(std::move(tokenizer));
  }
  const fs::path sentencepiece = fs::path(model_dir) / "tokenizer.model";
  if (fs::exists(sentencepiece)) {
    return LoadSentencePieceTokenizer(sentencepiece.string());
  }
  const fs::path bytes = fs::path(model_dir) / kByteTokenizerFile;
  if (fs::exists(bytes)) return LoadByteTokenizer(bytes.string());
  return absl::NotFoundError(absl::StrCat(
      model_dir,
      ": no tokenizer found (expected tokenizer.json, tokenizer.model or ",
      std::string(kByteTokenizerFile), ")"));
}

}  // namespace loraplex
