// Closed-form checks of the rotary embedding.
#include "core/model/rope.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

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

}  // namespace
}  // namespace loraplex
