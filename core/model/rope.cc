#include "core/model/rope.h"

#include <torch/torch.h>

#include <cmath>

namespace loraplex {

torch::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim) {
  auto exponents =
      torch::arange(0, head_dim, 2, torch::kInt64).to(torch::kFloat32) /
      static_cast<float>(head_dim);
  torch::Tensor inv_freq =
      1.0 /
      torch::pow(torch::scalar_tensor(rope.theta, torch::kFloat32), exponents);
  switch (rope.type) {
    case RopeType::kDefault:
      return inv_freq;
    case RopeType::kLinear:
      return inv_freq / rope.factor;
    case RopeType::kLlama3: {
      // Llama 3.1: long wavelengths are slowed by `factor`, short ones kept,
      // and the band between is interpolated smoothly.
      const double old_context =
          static_cast<double>(rope.original_max_position_embeddings);
      const double low_freq_wavelen = old_context / rope.low_freq_factor;
      const double high_freq_wavelen = old_context / rope.high_freq_factor;
      torch::Tensor wavelen = 2 * M_PI / inv_freq;
      torch::Tensor scaled = torch::where(wavelen > low_freq_wavelen,
                                          inv_freq / rope.factor, inv_freq);
      torch::Tensor smooth = (old_context / wavelen - rope.low_freq_factor) /
                             (rope.high_freq_factor - rope.low_freq_factor);
      torch::Tensor smoothed =
          (1 - smooth) * scaled / rope.factor + smooth * scaled;
      torch::Tensor medium =
          (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen);
      return torch::where(medium, smoothed, scaled);
    }
  }
  return inv_freq;
}

namespace {

// The tables of the angles `emb` (fp32; its last dimension two equal
// halves), in `dtype` on `device`: cos, and sin with its first half negated.
RopeTables TablesOf(const torch::Tensor& emb, torch::ScalarType dtype,
                    torch::Device device) {
  torch::Tensor signed_sin = emb.sin();
  signed_sin.narrow(-1, 0, signed_sin.size(-1) / 2).neg_();
  return {emb.cos().to(device, dtype), signed_sin.to(device, dtype)};
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const RopeConfig& rope, int64_t head_dim)
    : inv_freq_(RopeInverseFrequencies(rope, head_dim)) {}

RopeTables RotaryEmbedding::Tables(int64_t seq_len, torch::ScalarType dtype,
                                   torch::Device device) const {
  torch::Tensor positions = torch::arange(seq_len, torch::kFloat32);
  torch::Tensor freqs = torch::outer(positions, inv_freq_);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return TablesOf(emb, dtype, device);
}

RopeTables RotaryEmbedding::TablesAt(const torch::Tensor& positions,
                                     torch::ScalarType dtype,
                                     torch::Device device) const {
  // positions · inv_freq is one product per element, as in the reference's
  // fp32 matmul of inverse frequencies by position ids.
  torch::Tensor freqs = positions.to(torch::kCPU, torch::kFloat32)
                            .unsqueeze(-1)
                            .mul(inv_freq_.view({1, 1, -1}));
  torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);
  return TablesOf(emb, dtype, device);
}

torch::Tensor RotaryEmbedding::Apply(const torch::Tensor& x,
                                     const RopeTables& tables) {
  // roll by half: cat(x₂, x₁); the table carries rotate_half's minus.
  return x * tables.cos + x.roll(x.size(-1) / 2, -1) * tables.signed_sin;
}

}  // namespace loraplex
