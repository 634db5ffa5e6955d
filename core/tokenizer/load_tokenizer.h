// Picks and opens the tokenizer that belongs to a model directory.
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto tokenizer, LoadTokenizer(model_dir));
//
// As in transformers, `tokenizer.json` wins, then a SentencePiece
// `tokenizer.model`; otherwise `loraplex_tokenizer.json` (written next to the
// built-in models) selects the byte-level tokenizer.
#ifndef LORAPLEX_CORE_TOKENIZER_LOAD_TOKENIZER_H_
#define LORAPLEX_CORE_TOKENIZER_LOAD_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(
    const std::string& model_dir);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_LOAD_TOKENIZER_H_
