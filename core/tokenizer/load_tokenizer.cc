#include "core/tokenizer/load_tokenizer.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "core/tokenizer/sentencepiece_tokenizer.h"

namespace loraplex {
namespace {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadByteTokenizer(
    const std::string& path) {
  std::ifstream in(path);
  nlohmann::json description;
  try {
    in >> description;
  } catch (const nlohmann::json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not valid JSON: ", e.what()));
  }
  if (!description.is_object() || description.value("type", "") != "byte") {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": \"type\" must be \"byte\""));
  }
  // The layout is fixed; a description that disagrees with it would make the
  // model and the tokenizer silently disagree on ids.
  const nlohmann::json expected =
      nlohmann::json::parse(ByteTokenizer::DescriptionJson());
  for (const auto& [key, value] : expected.items()) {
    if (description.value(key, nlohmann::json()) != value) {
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
  const fs::path sentencepiece = fs::path(model_dir) / "tokenizer.model";
  if (fs::exists(sentencepiece)) {
    return LoadSentencePieceTokenizer(sentencepiece.string());
  }
  const fs::path bytes = fs::path(model_dir) / kByteTokenizerFile;
  if (fs::exists(bytes)) return LoadByteTokenizer(bytes.string());
  return absl::NotFoundError(absl::StrCat(
      model_dir, ": no tokenizer found (expected tokenizer.model or ",
      std::string(kByteTokenizerFile), ")"));
}

}  // namespace loraplex
