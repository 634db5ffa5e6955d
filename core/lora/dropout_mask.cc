#include "core/lora/dropout_mask.h"

#include <torch/torch.h>

#include <cmath>

namespace loraplex {
namespace {

constexpr uint64_t kMultiplier = 0x45d9f3b;  // < 2^27: products fit int64.
constexpr int64_t kLow32 = 0xffffffff;

// Mix on int64 tensors holding values in [0, 2^32).
torch::Tensor Mix(torch::Tensor x) {
  for (int round = 0; round < 2; ++round) {
    x = torch::bitwise_xor(torch::bitwise_right_shift(x, 16), x)
            .mul_(static_cast<int64_t>(kMultiplier))
            .bitwise_and_(kLow32);
  }
  return torch::bitwise_xor(torch::bitwise_right_shift(x, 16), x);
}

}  // namespace

torch::Tensor ScaledDropoutMask(const std::vector<uint64_t>& row_seeds,
                                int64_t seq, int64_t width, double keep,
                                const torch::Device& device) {
  TORCH_CHECK(keep > 0.0 && keep <= 1.0, "keep must be in (0, 1], got ", keep);
  TORCH_CHECK(seq * width <= kLow32, "a dropout mask row of ", seq * width,
              " elements is past 2^32");
  const int64_t rows = static_cast<int64_t>(row_seeds.size());
  std::vector<int64_t> low(rows);
  std::vector<int64_t> high(rows);
  for (int64_t r = 0; r < rows; ++r) {
    low[r] = static_cast<int64_t>(row_seeds[r] & 0xffffffffu);
    high[r] = static_cast<int64_t>(row_seeds[r] >> 32);
  }
  auto per_row = [&](const std::vector<int64_t>& values) {
    return torch::tensor(values, torch::kInt64).to(device).view({rows, 1, 1});
  };
  const torch::Tensor index =
      torch::arange(seq * width,
                    torch::TensorOptions().dtype(torch::kInt64).device(device))
          .view({1, seq, width});
  torch::Tensor x = Mix(torch::bitwise_xor(index, per_row(low)));
  x = Mix(torch::bitwise_xor(x, per_row(high)));
  // keep · 2^32 (2^32 itself for keep = 1: every 32-bit value is below it).
  const auto threshold = static_cast<int64_t>(std::ldexp(keep, 32));
  return x.lt(threshold).to(torch::kFloat32).mul_(1.0 / keep);
}

}  // namespace loraplex
