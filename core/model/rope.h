// Rotary position embeddings in the Hugging Face "rotate_half" convention.
//
// Frequencies follow the checkpoint's rope settings (plain, linear position
// interpolation, Llama 3.1 band-wise scaling, LongRoPE or YaRN) and are
// computed in fp32 like the reference implementation, then cast to the
// compute dtype; LongRoPE and YaRN also scale cos and sin by the attention
// factor.
#ifndef LORAPLEX_CORE_MODEL_ROPE_H_
#define LORAPLEX_CORE_MODEL_ROPE_H_

#include <torch/types.h>

#include <cstdint>

#include "core/model/model_config.h"

namespace loraplex {

// Inverse frequencies [RotaryDim / 2], fp32, after the configured scaling;
// for LongRoPE those of short or long contexts.
torch::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim,
                                     bool long_context = false);

// cos and sin tables of shape [seq_len, rotary_dim] for positions
// 0..seq_len-1, or [batch, 1, seq_len, rotary_dim] for positions given per
// row. The sin table's first half is negated (rotate_half's sign, moved into
// the table). rotary_dim is head_dim unless partial_rotary_factor is set.
struct RopeTables {
  torch::Tensor cos;
  torch::Tensor signed_sin;
};

class RotaryEmbedding {
 public:
  RotaryEmbedding(const RopeConfig& rope, int64_t head_dim);

  // Tables for positions [0, seq_len), in `dtype` on `device` (LongRoPE:
  // those of short contexts).
  RopeTables Tables(int64_t seq_len, torch::ScalarType dtype,
                    torch::Device device) const;
  // Tables for positions [0, seq_len) of rows of `lengths` (int64 [batch]).
  // LongRoPE takes a row's long factors when its length runs past the
  // original context, as transformers does for a sequence of that length
  // (per row, so a row's result does not depend on its co-batch).
  RopeTables Tables(const torch::Tensor& lengths, int64_t seq_len,
                    torch::ScalarType dtype, torch::Device device) const;
  // Tables for the positions int64 [batch, seq] (each >= 0); LongRoPE picks
  // a row's factors by the furthest position it reaches here, or with
  // `extents` (int64 [batch, seq]) each token's by the context length given
  // for it (packed examples: each by its own example's length).
  RopeTables TablesAt(const torch::Tensor& positions, torch::ScalarType dtype,
                      torch::Device device,
                      const torch::Tensor& extents = {}) const;

  // x: [batch, heads, seq, head_dim]. Returns x rotated by position (its
  // first rotary_dim values, the tables' width; the rest pass through):
  // x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x₂, x₁) (the halves of
  // the last dimension), computed as x·cos + roll(x, head_dim / 2)·signed_sin
  // (the same products: (−a)·b is −(a·b) exactly). Four operators, where the
  // textbook form takes seven and its two slices cost a full-size zero
  // gradient each in backward.
  static torch::Tensor Apply(const torch::Tensor& x, const RopeTables& tables);

 private:
  RopeTables TablesWith(const torch::Tensor& inv_freq, int64_t seq_len,
                        torch::ScalarType dtype, torch::Device device) const;

  torch::Tensor inv_freq_;       // fp32 on the CPU.
  torch::Tensor long_inv_freq_;  // LongRoPE's long contexts; else undefined.
  double attention_factor_ = 1.0;
  int64_t original_context_ = 0;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_ROPE_H_
