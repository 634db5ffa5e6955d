#include "core/lora/dropout_mask.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace loraplex {
namespace {

// The header's definition, element by element in 32-bit unsigned
// arithmetic: the reference the tensor code is checked against.
uint32_t Mix(uint32_t x) {
  for (int round = 0; round < 2; ++round) x = ((x >> 16) ^ x) * 0x45d9f3bu;
  return (x >> 16) ^ x;
}

uint32_t Hash(uint64_t seed, uint32_t index) {
  return Mix(Mix(index ^ static_cast<uint32_t>(seed)) ^
             static_cast<uint32_t>(seed >> 32));
}

TEST(DropoutMaskTest, IsTheDefinedHashOfSeedAndPosition) {
  const std::vector<uint64_t> seeds = {0x0123456789abcdefULL, 7,
                                       0xffffffffffffffffULL};
  const double keep = 0.75;
  const torch::Tensor mask = ScaledDropoutMask(seeds, 6, 7, keep, torch::kCPU);
  ASSERT_EQ(mask.sizes(), (std::vector<int64_t>{3, 6, 7}));
  const auto values = mask.accessor<float, 3>();
  int dropped = 0;
  for (int r = 0; r < 3; ++r) {
    for (int t = 0; t < 6; ++t) {
      for (int c = 0; c < 7; ++c) {
        const bool kept = Hash(seeds[r], static_cast<uint32_t>(t * 7 + c)) <
                          static_cast<uint64_t>(std::ldexp(keep, 32));
        EXPECT_EQ(values[r][t][c], kept ? static_cast<float>(1.0 / keep) : 0.f)
            << "row " << r << " position " << t << " column " << c;
        dropped += kept ? 0 : 1;
      }
    }
  }
  EXPECT_GT(dropped, 0);
}

TEST(DropoutMaskTest, KeepsTheAskedShare) {
  const std::vector<uint64_t> seeds = {1, 2, 3, 4};
  const double keep = 0.9;
  const torch::Tensor mask =
      ScaledDropoutMask(seeds, 256, 256, keep, torch::kCPU);
  const double kept = mask.gt(0).to(torch::kFloat64).mean().item<double>();
  // 262,144 draws: 5 standard deviations are 0.003.
  EXPECT_NEAR(kept, keep, 5 * std::sqrt(keep * (1 - keep) / 262144.0));
  EXPECT_EQ(
      ScaledDropoutMask(seeds, 4, 8, 1.0, torch::kCPU).min().item<float>(),
      1.f);
}

// A row's mask does not depend on the padding its batch gives it, and each
// 32-bit half of the seed changes it.
TEST(DropoutMaskTest, DependsOnSeedAndPositionOnly) {
  const torch::Tensor short_rows =
      ScaledDropoutMask({5, 6}, 3, 16, 0.5, torch::kCPU);
  const torch::Tensor long_rows =
      ScaledDropoutMask({5, 6}, 9, 16, 0.5, torch::kCPU);
  EXPECT_TRUE(torch::equal(long_rows.narrow(1, 0, 3), short_rows));
  const torch::Tensor low = ScaledDropoutMask({5}, 9, 16, 0.5, torch::kCPU);
  const torch::Tensor high =
      ScaledDropoutMask({5 + (uint64_t{1} << 32)}, 9, 16, 0.5, torch::kCPU);
  EXPECT_TRUE(torch::equal(low, long_rows.narrow(0, 0, 1)));
  EXPECT_FALSE(torch::equal(low, high));
  EXPECT_FALSE(torch::equal(long_rows[0], long_rows[1]));
}

TEST(DropoutMaskTest, MasksAreBitIdenticalOnCuda) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  const std::vector<uint64_t> seeds = {11, 0xdeadbeefcafef00dULL, 3};
  const torch::Tensor cpu = ScaledDropoutMask(seeds, 64, 96, 0.8, torch::kCPU);
  const torch::Tensor cuda =
      ScaledDropoutMask(seeds, 64, 96, 0.8, torch::Device(torch::kCUDA, 0));
  EXPECT_EQ(cuda.device().type(), torch::kCUDA);
  EXPECT_TRUE(torch::equal(cuda.cpu(), cpu));
}

}  // namespace
}  // namespace loraplex
