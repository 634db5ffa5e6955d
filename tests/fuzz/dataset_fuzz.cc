// libFuzzer target: JSONL dataset text (every line kind, bad lines, line
// numbers) through the parser a dataset upload runs.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "core/data/dataset.h"
#include "core/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const loraplex::ByteTokenizer* tokenizer =
      new loraplex::ByteTokenizer();
  loraplex::DatasetParseOptions options;
  options.vocab_size = 300;
  loraplex::ParseJsonlDataset(
      absl::string_view(reinterpret_cast<const char*>(data), size), *tokenizer,
      options)
      .IgnoreError();
  return 0;
}
