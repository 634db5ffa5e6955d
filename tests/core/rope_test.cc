// Closed-form checks of the rotary embedding.
#include "core/model/rope.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <vector>

#include "core/runtime/step_profile.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

TEST(RopeTest, DefaultFrequenciesAreThetaPowers) {
  RopeConfig rope;
  rope.theta = 10000.0;
  torch::Tensor inv_freq = RopeInverseFrequencies(rope, 8);
  ASSERT_EQ(inv_freq.size(0), 4);
  for (int i = 0; i < 4; ++i) {
    EXPECT_NEAR(inv_freq[i].item<double>(), std::pow(10000.0, -2.0 * i / 8),
                1e-7);
  }
}

TEST(RopeTest, LinearScalingDividesEveryFrequency) {
  RopeConfig rope;
  torch::Tensor plain = RopeInverseFrequencies(rope, 16);
  rope.type = RopeType::kLinear;
  rope.factor = 4.0;
  EXPECT_TRUE(torch::allclose(RopeInverseFrequencies(rope, 16), plain / 4.0));
}

TEST(RopeTest, Llama3ScalesOnlyLongWavelengths) {
  RopeConfig rope;
  rope.theta = 500000.0;
  const int64_t head_dim = 64;
  torch::Tensor plain = RopeInverseFrequencies(rope, head_dim);
  rope.type = RopeType::kLlama3;
  rope.factor = 8.0;
  rope.low_freq_factor = 1.0;
  rope.high_freq_factor = 4.0;
  rope.original_max_position_embeddings = 8192;
  torch::Tensor scaled = RopeInverseFrequencies(rope, head_dim);
  for (int64_t i = 0; i < plain.size(0); ++i) {
    const double f = plain[i].item<double>();
    const double wavelen = 2 * M_PI / f;
    const double s = scaled[i].item<double>();
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_NEAR(s, f, 1e-6 * f) << i;  // High frequency: untouched.
    } else if (wavelen > 8192.0 / 1.0) {
      EXPECT_NEAR(s, f / 8.0, 1e-6 * f) << i;  // Low frequency: / factor.
    } else {
      EXPECT_LT(s, f) << i;  // In between: interpolated.
      EXPECT_GT(s, f / 8.0) << i;
    }
  }
}

TEST(RopeTest, AttentionScoreDependsOnlyOnRelativePosition) {
  RopeConfig rope;
  RotaryEmbedding rotary(rope, 16);
  RopeTables tables = rotary.Tables(32, torch::kFloat64, torch::kCPU);
  torch::manual_seed(0);
  torch::Tensor q = torch::randn({16}, torch::kFloat64);
  torch::Tensor k = torch::randn({16}, torch::kFloat64);
  // Place q at every position and k at every position.
  torch::Tensor rq = RotaryEmbedding::Apply(
      q.expand({1, 1, 32, 16}).contiguous(), tables)[0][0];
  torch::Tensor rk = RotaryEmbedding::Apply(
      k.expand({1, 1, 32, 16}).contiguous(), tables)[0][0];
  const double d3 = rq[10].dot(rk[7]).item<double>();
  EXPECT_NEAR(rq[25].dot(rk[22]).item<double>(), d3, 1e-4);
  EXPECT_NEAR(rq[3].dot(rk[0]).item<double>(), d3, 1e-4);
  // Rotation preserves norms.
  EXPECT_NEAR(rq[17].norm().item<double>(), q.norm().item<double>(), 1e-5);
  // Position 0 is the identity.
  EXPECT_TRUE(torch::allclose(rq[0], q, 1e-6, 1e-6));
}

// The textbook rotation, x·cos + rotate_half(x)·sin with rotate_half(x) =
// cat(−x₂, x₁), from tables made here from the inverse frequencies.
torch::Tensor TextbookRope(const torch::Tensor& x,
                           const torch::Tensor& positions,
                           const torch::Tensor& inv_freq) {
  const torch::Tensor freqs =
      positions.to(torch::kFloat32).unsqueeze(-1) * inv_freq.view({1, 1, -1});
  const torch::Tensor emb = torch::cat({freqs, freqs}, -1).unsqueeze(1);
  const torch::Tensor cos = emb.cos().to(x.scalar_type());
  const torch::Tensor sin = emb.sin().to(x.scalar_type());
  const int64_t half = x.size(-1) / 2;
  const torch::Tensor rotated =
      torch::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  return x * cos + rotated * sin;
}

// Apply folds rotate_half's sign into the sin table and rolls x instead of
// slicing it: the same products, so the same bits as the textbook form, in
// the result and in the gradient.
TEST(RopeTest, ApplyIsTheTextbookRotationBitForBit) {
  RopeConfig rope;
  RotaryEmbedding rotary(rope, 16);
  const torch::Tensor inv_freq = RopeInverseFrequencies(rope, 16);
  torch::manual_seed(4);
  const torch::Tensor positions =
      torch::tensor({0, 1, 2, 3, 4, 7, 9, 100, 2000, 5}, torch::kInt64)
          .view({2, 5});
  for (torch::ScalarType dtype :
       {torch::kFloat32, torch::kBFloat16, torch::kFloat64}) {
    SCOPED_TRACE(c10::toString(dtype));
    const torch::Tensor x0 = torch::randn({2, 3, 5, 16}).to(dtype);
    const torch::Tensor weights = torch::randn({2, 3, 5, 16}).to(dtype);
    const torch::Tensor x = x0.clone().requires_grad_(true);
    const torch::Tensor y = RotaryEmbedding::Apply(
        x, rotary.TablesAt(positions, dtype, torch::kCPU));
    (y * weights).sum().backward();
    const torch::Tensor ref_x = x0.clone().requires_grad_(true);
    const torch::Tensor ref = TextbookRope(ref_x, positions, inv_freq);
    (ref * weights).sum().backward();
    EXPECT_TRUE(torch::equal(y, ref));
    EXPECT_TRUE(torch::equal(x.grad(), ref_x.grad()));
    // The tables for positions 0..4 give row 0's result.
    const torch::Tensor first = RotaryEmbedding::Apply(
        x0.narrow(0, 0, 1), rotary.Tables(5, dtype, torch::kCPU));
    EXPECT_TRUE(torch::equal(first, ref.detach().narrow(0, 0, 1)));
  }
}

// Four operators (each at least one kernel on a GPU, plus a node each in
// backward): roll, two products and their sum.
TEST(RopeTest, ApplyDispatchesFourOperators) {
  if (!kTorchIs2OrNewer) GTEST_SKIP() << "profiling needs LibTorch 2.x";
  RotaryEmbedding rotary(RopeConfig{}, 16);
  const RopeTables tables = rotary.Tables(5, torch::kFloat32, torch::kCPU);
  const torch::Tensor x = torch::randn({1, 2, 5, 16});
  const absl::StatusOr<std::vector<ProfiledEvent>> events = ProfileCall(
      [&] { RotaryEmbedding::Apply(x, tables); }, /*cuda=*/false, "");
  ASSERT_TRUE(events.ok()) << events.status();
  EXPECT_EQ(SummarizeProfile(*events).top_level_ops, 4);
}

}  // namespace
}  // namespace loraplex
