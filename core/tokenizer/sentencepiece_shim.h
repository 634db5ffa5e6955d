// The C interface of libloraplex_spm.so, a small shim around libsentencepiece.
//
// Debian's libsentencepiece carries its own copy of protobuf-lite (3.14),
// whose symbols clash with the libprotobuf (3.21) that LibTorch and gRPC
// load: in one symbol scope, either library's start-up code calls into the
// other's copy and aborts. So sentencepiece is never linked into a loraplex
// program; the shim is opened on demand with dlmopen(LM_ID_NEWLM), which
// gives it a link-map namespace (and symbol scope) of its own. Only plain C
// types cross this boundary, and memory is never freed across it.
#ifndef LORAPLEX_CORE_TOKENIZER_SENTENCEPIECE_SHIM_H_
#define LORAPLEX_CORE_TOKENIZER_SENTENCEPIECE_SHIM_H_

#include <stddef.h>
#include <stdint.h>

extern "C" {

// File name of the shim; it is installed next to the loraplex programs.
#define LORAPLEX_SPM_SHIM_FILE "libloraplex_spm.so"

// Opens a .model file. Returns null and fills `error` on failure.
typedef void* (*LoraplexSpmOpenFn)(const char* path, char* error,
                                   size_t error_size);
typedef void (*LoraplexSpmCloseFn)(void* model);
// Writes the piece count and the BOS/EOS/PAD ids (-1 when absent).
typedef void (*LoraplexSpmInfoFn)(void* model, int32_t* vocab_size,
                                  int32_t* bos, int32_t* eos, int32_t* pad);
typedef int32_t (*LoraplexSpmIsControlFn)(void* model, int32_t id);
// Encodes `text`; writes up to `capacity` ids and returns how many there are.
typedef size_t (*LoraplexSpmEncodeFn)(void* model, const char* text,
                                      size_t text_size, int32_t* ids,
                                      size_t capacity);
// Decodes `ids`; writes up to `capacity` bytes, returns the full length.
// Like encode, also writing each piece's byte span of `text` to begins[i],
// ends[i].
typedef size_t (*LoraplexSpmEncodeOffsetsFn)(void* model, const char* text,
                                             size_t text_size, int32_t* ids,
                                             uint32_t* begins, uint32_t* ends,
                                             size_t capacity);
typedef size_t (*LoraplexSpmDecodeFn)(void* model, const int32_t* ids,
                                      size_t count, char* text,
                                      size_t capacity);
// Runs the SentencePiece trainer with command-line style `args`.
// Returns 0 on success, else fills `error`.
typedef int32_t (*LoraplexSpmTrainFn)(const char* args, char* error,
                                      size_t error_size);

}  // extern "C"

#endif  // LORAPLEX_CORE_TOKENIZER_SENTENCEPIECE_SHIM_H_
