// Rotary position embeddings in the Hugging Face "rotate_half" convention.
//
// Frequencies follow the checkpoint's rope settings (plain, linear position
// interpolation, or Llama 3.1 band-wise scaling) and are computed in fp32
// like the reference implementation, then cast to the compute dtype.
#ifndef LORAPLEX_CORE_MODEL_ROPE_H_
#define LORAPLEX_CORE_MODEL_ROPE_H_

#include <torch/types.h>

#include <cstdint>

#include "core/model/model_config.h"

namespace loraplex {

// Inverse frequencies [head_dim / 2], fp32, after the configured scaling.
torch::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim);

// cos and sin tables of shape [seq_len, head_dim] for positions 0..seq_len-1,
// or [batch, 1, seq_len, head_dim] for positions given per row. The sin
// table's first half is negated (rotate_half's sign, moved into the table).
struct RopeTables {
  torch::Tensor cos;
  torch::Tensor signed_sin;
};

class RotaryEmbedding {
 public:
  RotaryEmbedding(const RopeConfig& rope, int64_t head_dim);

  // Tables for positions [0, seq_len), in `dtype` on `device`.
  RopeTables Tables(int64_t seq_len, torch::ScalarType dtype,
                    torch::Device device) const;
  // Tables for the positions int64 [batch, seq] (each >= 0).
  RopeTables TablesAt(const torch::Tensor& positions, torch::ScalarType dtype,
                      torch::Device device) const;

  // x: [batch, heads, seq, head_dim]. Returns x rotated by position:
  // x·cos + rotate_half(x)·sin, rotate_half(x) = cat(−x₂, x₁) (the halves of
  // the last dimension), computed as x·cos + roll(x, head_dim / 2)·signed_sin
  // (the same products: (−a)·b is −(a·b) exactly). Four operators, where the
  // textbook form takes seven and its two slices cost a full-size zero
  // gradient each in backward.
  static torch::Tensor Apply(const torch::Tensor& x, const RopeTables& tables);

 private:
  torch::Tensor inv_freq_;  // fp32 on the CPU.
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_MODEL_ROPE_H_
