#include <nlohmann/json.hpp>

#include "core/tokenizer/tokenizer.h"

namespace loraplex {

absl::StatusOr<std::vector<int64_t>> ByteTokenizer::Encode(
    std::string_view text) const {
  std::vector<int64_t> ids;
  ids.reserve(text.size());
  for (char c : text) ids.push_back(static_cast<unsigned char>(c));
  return ids;
}

absl::StatusOr<TokenizerEncoding> ByteTokenizer::EncodeWithOffsets(
    std::string_view text) const {
  TokenizerEncoding encoding;
  encoding.ids.reserve(text.size());
  encoding.offsets.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    encoding.ids.push_back(static_cast<unsigned char>(text[i]));
    encoding.offsets.push_back(
        {static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1)});
  }
  return encoding;
}

absl::StatusOr<std::string> ByteTokenizer::Decode(
    const std::vector<int64_t>& ids) const {
  std::string text;
  text.reserve(ids.size());
  for (int64_t id : ids) {
    if (id >= 0 && id < 256) text.push_back(static_cast<char>(id));
  }
  return text;
}

std::string ByteTokenizer::DescriptionJson() {
  nlohmann::json description = {{"type", "byte"},
                                {"vocab_size", kVocabSize},
                                {"bos_id", kBos},
                                {"eos_id", kEos},
                                {"pad_id", kPad}};
  return description.dump(2) + "\n";
}

}  // namespace loraplex
