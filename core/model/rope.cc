#include "core/model/rope.h"

#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace loraplex {
namespace {

// transformers' find_correction_dim: the (fractional) rotary dimension
// whose wavelength turns `rotations` times in the original context, in
// double as Python computes it.
double YarnCorrectionDim(double rotations, int64_t dim, double theta,
                         int64_t original_context) {
  return (static_cast<double>(dim) *
          std::log(static_cast<double>(original_context) /
                   (rotations * 2 * M_PI))) /
         (2 * std::log(theta));
}

// YaRN: frequencies faster than beta_fast turns in the original context are
// kept, those slower than beta_slow interpolated (÷ factor), a linear ramp
// over the dimensions between. The same operators on the same fp32 tensors
// as transformers' _compute_yarn_parameters, so the result matches bit for
// bit.
torch::Tensor YarnInverseFrequencies(const RopeConfig& rope, int64_t dim,
                                     const torch::Tensor& powers) {
  const torch::Tensor extrapolation = powers.reciprocal();
  const torch::Tensor interpolation = (rope.factor * powers).reciprocal();
  double low = YarnCorrectionDim(rope.beta_fast, dim, rope.theta,
                                 rope.original_max_position_embeddings);
  double high = YarnCorrectionDim(rope.beta_slow, dim, rope.theta,
                                  rope.original_max_position_embeddings);
  if (rope.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;  // transformers' guard against 0 / 0.
  const torch::Tensor ramp = torch::clamp(
      (torch::arange(dim / 2, torch::kFloat32) - low) / (high - low), 0, 1);
  const torch::Tensor extrapolation_share = 1 - ramp;
  return interpolation * (1 - extrapolation_share) +
         extrapolation * extrapolation_share;
}

}  // namespace

torch::Tensor RopeInverseFrequencies(const RopeConfig& rope, int64_t head_dim,
                                     bool long_context) {
  const int64_t dim = RotaryDim(rope, head_dim);
  auto exponents = torch::arange(0, dim, 2, torch::kInt64).to(torch::kFloat32) /
                   static_cast<float>(dim);
  const torch::Tensor powers =
      torch::pow(torch::scalar_tensor(rope.theta, torch::kFloat32), exponents);
  if (rope.type == RopeType::kLongRope) {
    // 1 / (factor · θ^(2i/d)), the product in fp32 as transformers forms it.
    const std::vector<double>& factors =
        long_context ? rope.long_factor : rope.short_factor;
    return 1.0 / (torch::tensor(factors, torch::kFloat64).to(torch::kFloat32) *
                  powers);
  }
  if (rope.type == RopeType::kYarn) {
    return YarnInverseFrequencies(rope, dim, powers);
  }
  torch::Tensor inv_freq = 1.0 / powers;
  switch (rope.type) {
    case RopeType::kDefault:
    case RopeType::kLongRope:
    case RopeType::kYarn:
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
// halves), scaled by `attention_factor` unless it is 1, in `dtype` on
// `device`: cos, and sin with its first half negated.
RopeTables TablesOf(const torch::Tensor& emb, double attention_factor,
                    torch::ScalarType dtype, torch::Device device) {
  torch::Tensor cos = emb.cos();
  torch::Tensor signed_sin = emb.sin();
  if (attention_factor != 1.0) {
    cos = cos * attention_factor;
    signed_sin = signed_sin * attention_factor;
  }
  signed_sin.narrow(-1, 0, signed_sin.size(-1) / 2).neg_();
  return {cos.to(device, dtype), signed_sin.to(device, dtype)};
}

// Per row of `reach` (int64 [batch]: one past the furthest position each
// row reaches), whether it runs past the original context.
torch::Tensor LongRows(const torch::Tensor& reach, int64_t original) {
  return reach.to(torch::kCPU, torch::kInt64) > original;
}

}  // namespace

RotaryEmbedding::RotaryEmbedding(const RopeConfig& rope, int64_t head_dim)
    : inv_freq_(RopeInverseFrequencies(rope, head_dim)),
      attention_factor_(rope.type == RopeType::kLongRope ||
                                rope.type == RopeType::kYarn
                            ? rope.attention_factor
                            : 1.0),
      original_context_(rope.original_max_position_embeddings) {
  if (rope.type == RopeType::kLongRope) {
    long_inv_freq_ = RopeInverseFrequencies(rope, head_dim, true);
  }
}

RopeTables RotaryEmbedding::TablesWith(const torch::Tensor& inv_freq,
                                       int64_t seq_len, torch::ScalarType dtype,
                                       torch::Device device) const {
  torch::Tensor positions = torch::arange(seq_len, torch::kFloat32);
  torch::Tensor freqs = torch::outer(positions, inv_freq);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1);
  return TablesOf(emb, attention_factor_, dtype, device);
}

RopeTables RotaryEmbedding::Tables(int64_t seq_len, torch::ScalarType dtype,
                                   torch::Device device) const {
  return TablesWith(inv_freq_, seq_len, dtype, device);
}

RopeTables RotaryEmbedding::Tables(const torch::Tensor& lengths,
                                   int64_t seq_len, torch::ScalarType dtype,
                                   torch::Device device) const {
  if (!long_inv_freq_.defined()) return Tables(seq_len, dtype, device);
  const torch::Tensor long_rows = LongRows(lengths, original_context_);
  const int64_t count = long_rows.sum().item<int64_t>();
  if (count == 0) return Tables(seq_len, dtype, device);
  if (count == long_rows.numel()) {
    return TablesWith(long_inv_freq_, seq_len, dtype, device);
  }
  // Rows on both sides of the original context: tables per row.
  const RopeTables short_tables = Tables(seq_len, dtype, device);
  const RopeTables long_tables =
      TablesWith(long_inv_freq_, seq_len, dtype, device);
  const torch::Tensor pick = long_rows.to(device).view({-1, 1, 1, 1});
  return {torch::where(pick, long_tables.cos, short_tables.cos),
          torch::where(pick, long_tables.signed_sin, short_tables.signed_sin)};
}

RopeTables RotaryEmbedding::TablesAt(const torch::Tensor& positions,
                                     torch::ScalarType dtype,
                                     torch::Device device,
                                     const torch::Tensor& extents) const {
  // positions · inv_freq is one product per element, as in the reference's
  // fp32 matmul of inverse frequencies by position ids.
  const torch::Tensor cpu_positions = positions.to(torch::kCPU);
  torch::Tensor inv_freq = inv_freq_.view({1, 1, -1});
  if (long_inv_freq_.defined() && extents.defined()) {
    const torch::Tensor long_tokens =
        LongRows(extents.to(torch::kCPU).flatten(), original_context_)
            .view({positions.size(0), positions.size(1), 1});
    inv_freq =
        torch::where(long_tokens, long_inv_freq_.view({1, 1, -1}), inv_freq);
  } else if (long_inv_freq_.defined()) {
    // Each row by the furthest position it reaches in this pass.
    const torch::Tensor long_rows =
        LongRows(std::get<0>(cpu_positions.max(1)) + 1, original_context_);
    inv_freq = torch::where(long_rows.view({-1, 1, 1}),
                            long_inv_freq_.view({1, 1, -1}), inv_freq);
  }
  torch::Tensor freqs =
      cpu_positions.to(torch::kFloat32).unsqueeze(-1).mul(inv_freq);
  torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);
  return TablesOf(emb, attention_factor_, dtype, device);
}

torch::Tensor RotaryEmbedding::Apply(const torch::Tensor& x,
                                     const RopeTables& tables) {
  // roll by half: cat(x₂, x₁); the table carries rotate_half's minus.
  const int64_t rotary_dim = tables.cos.size(-1);
  auto rotate = [&](const torch::Tensor& t) {
    return t * tables.cos + t.roll(rotary_dim / 2, -1) * tables.signed_sin;
  };
  if (rotary_dim == x.size(-1)) return rotate(x);
  // Partial rotation: the leading rotary_dim values turn, the rest pass.
  const std::vector<torch::Tensor> parts =
      x.split_with_sizes({rotary_dim, x.size(-1) - rotary_dim}, -1);
  return torch::cat({rotate(parts[0]), parts[1]}, -1);
}

}  // namespace loraplex
