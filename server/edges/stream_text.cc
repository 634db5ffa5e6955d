#include "server/edges/stream_text.h"

#include <algorithm>
#include <utility>

#include "core/sample/sampling_params.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode_text.h"

namespace loraplex {
namespace {

constexpr char kReplacementCharacter[] = "\xEF\xBF\xBD";

}  // namespace

StreamText::StreamText(const Tokenizer* tokenizer,
                       std::vector<std::string> stops)
    : tokenizer_(tokenizer), stops_(std::move(stops)) {
  for (const std::string& stop : stops_) {
    if (!stop.empty()) holdback_ = std::max(holdback_, stop.size() - 1);
  }
}

std::string StreamText::Append(int64_t token) {
  tokens_.push_back(token);
  absl::StatusOr<std::string> text = tokenizer_->Decode(tokens_);
  if (!text.ok()) return "";
  *text = Utf8Lossy(*text);
  size_t stable = text->size();
  // A token that ends inside a character decodes to a replacement
  // character that the next token may complete.
  while (stable >= 3 &&
         text->compare(stable - 3, 3, kReplacementCharacter) == 0) {
    stable -= 3;
  }
  // A stop string already in the text ends it before the string; one still
  // to come can start only in the last holdback_ bytes. The same cut as
  // the final text's.
  const size_t match = StopStringCut(*text, stops_);
  if (match != std::string::npos) {
    stable = std::min(stable, match);
  } else {
    stable = stable > holdback_ ? stable - holdback_ : 0;
  }
  // Never inside a character.
  while (stable > 0 && stable < text->size() &&
         (static_cast<unsigned char>((*text)[stable]) & 0xC0) == 0x80) {
    --stable;
  }
  if (stable <= sent_bytes_) return "";
  std::string delta = text->substr(sent_bytes_, stable - sent_bytes_);
  sent_bytes_ = stable;
  return delta;
}

std::string StreamText::Finish(const std::string& final_text) const {
  const std::string text = Utf8Lossy(final_text);
  return text.substr(std::min(sent_bytes_, text.size()));
}

}  // namespace loraplex
