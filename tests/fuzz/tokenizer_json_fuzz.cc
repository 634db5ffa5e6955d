// libFuzzer target: a tokenizer.json (normalizers, pre-tokenizers, BPE
// model, added tokens, decoders, post-processors), then encoding and
// decoding with what loaded.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/common/json_parse.h"
#include "core/tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nlohmann::json> json =
      loraplex::ParseUntrustedJson(text, "tokenizer.json", {.max_depth = 32});
  if (!json.ok()) return 0;
  absl::StatusOr<std::unique_ptr<loraplex::HfTokenizer>> tokenizer =
      loraplex::HfTokenizer::FromJson(*json, "tokenizer.json", {});
  if (!tokenizer.ok()) return 0;
  for (const char* sample :
       {"Hello, world! 123 \xC3\xA9t\xC3\xA9  tabs\tand\nlines",
        "<s> special </s> \xF0\x9F\x98\x80", ""}) {
    absl::StatusOr<std::vector<int64_t>> ids = (*tokenizer)->Encode(sample);
    if (ids.ok()) (*tokenizer)->Decode(*ids).IgnoreError();
  }
  return 0;
}
