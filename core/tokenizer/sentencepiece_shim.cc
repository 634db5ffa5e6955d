// Built into libloraplex_spm.so only (see sentencepiece_shim.h).
#include "core/tokenizer/sentencepiece_shim.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <cstring>
#include <string>
#include <vector>

namespace {

void CopyError(const std::string& message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  std::strncpy(error, message.c_str(), error_size - 1);
  error[error_size - 1] = '\0';
}

sentencepiece::SentencePieceProcessor* Processor(void* model) {
  return static_cast<sentencepiece::SentencePieceProcessor*>(model);
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) void* loraplex_spm_open(
    const char* path, char* error, size_t error_size) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const auto status = processor->Load(path);
  if (!status.ok()) {
    CopyError(status.ToString(), error, error_size);
    delete processor;
    return nullptr;
  }
  return processor;
}

__attribute__((visibility("default"))) void loraplex_spm_close(void* model) {
  delete Processor(model);
}

__attribute__((visibility("default"))) void loraplex_spm_info(
    void* model, int32_t* vocab_size, int32_t* bos, int32_t* eos,
    int32_t* pad) {
  *vocab_size = Processor(model)->GetPieceSize();
  *bos = Processor(model)->bos_id();
  *eos = Processor(model)->eos_id();
  *pad = Processor(model)->pad_id();
}

__attribute__((visibility("default"))) int32_t loraplex_spm_is_control(
    void* model, int32_t id) {
  return Processor(model)->IsControl(id) ? 1 : 0;
}

__attribute__((visibility("default"))) size_t loraplex_spm_encode(
    void* model, const char* text, size_t text_size, int32_t* ids,
    size_t capacity) {
  std::vector<int> pieces;
  Processor(model)
      ->Encode(std::string_view(text, text_size), &pieces)
      .IgnoreError();
  for (size_t i = 0; i < pieces.size() && i < capacity; ++i) ids[i] = pieces[i];
  return pieces.size();
}

__attribute__((visibility("default"))) size_t loraplex_spm_encode_offsets(
    void* model, const char* text, size_t text_size, int32_t* ids,
    uint32_t* begins, uint32_t* ends, size_t capacity) {
  const sentencepiece::ImmutableSentencePieceText pieces =
      Processor(model)->EncodeAsImmutableProto(
          std::string_view(text, text_size));
  size_t n = 0;
  for (const auto& piece : pieces.pieces()) {
    if (n < capacity) {
      ids[n] = static_cast<int32_t>(piece.id());
      begins[n] = piece.begin();
      ends[n] = piece.end();
    }
    ++n;
  }
  return n;
}

__attribute__((visibility("default"))) size_t loraplex_spm_decode(
    void* model, const int32_t* ids, size_t count, char* text,
    size_t capacity) {
  std::vector<int> pieces(ids, ids + count);
  std::string decoded;
  Processor(model)->Decode(pieces, &decoded).IgnoreError();
  std::memcpy(text, decoded.data(), std::min(capacity, decoded.size()));
  return decoded.size();
}

__attribute__((visibility("default"))) int32_t loraplex_spm_train(
    const char* args, char* error, size_t error_size) {
  const auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (status.ok()) return 0;
  CopyError(status.ToString(), error, error_size);
  return 1;
}

}  // extern "C"
