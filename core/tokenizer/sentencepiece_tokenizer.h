// SentencePiece tokenizers (`tokenizer.model`, as shipped with Llama 2 and
// Mistral checkpoints), reached through the libloraplex_spm.so shim (see
// sentencepiece_shim.h for why it is loaded at run time).
//
//   LORAPLEX_ASSIGN_OR_RETURN(auto tokenizer,
//                             LoadSentencePieceTokenizer(dir +
//                             "/tokenizer.model"));
#ifndef LORAPLEX_CORE_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
#define LORAPLEX_CORE_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/tokenizer/tokenizer.h"

namespace loraplex {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& model_path);

// Trains a SentencePiece model; `args` in the trainer's command-line syntax
// ("--input=... --model_prefix=... --vocab_size=...").
absl::Status TrainSentencePieceModel(const std::string& args);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_TOKENIZER_SENTENCEPIECE_TOKENIZER_H_
