// The experts' grouped GEMM (core/model/experts.h): LibTorch's grouped
// GEMM, which GroupedLinear takes on GPUs that have it, equals one GEMM per
// expert in values and gradients, with biases and experts given no tokens.
#include "core/model/experts.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <vector>

namespace loraplex {
namespace {

TEST(ExpertsTest, GroupedGemmEqualsOneGemmPerExpert) {
  torch::manual_seed(7);
  const std::vector<int64_t> counts = {3, 0, 5, 2, 0, 4};
  int64_t pairs = 0;
  for (int64_t c : counts) pairs += c;
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias);
    const torch::Tensor x0 = torch::randn({pairs, 16});
    const torch::Tensor w0 = torch::randn({6, 24, 16});
    const torch::Tensor b0 = torch::randn({6, 24});
    const torch::Tensor upstream = torch::randn({pairs, 24});
    std::vector<torch::Tensor> outputs, grads;
    for (ExpertGemm gemm : {ExpertGemm::kLoop, ExpertGemm::kGroupedMm}) {
      torch::Tensor x = x0.clone().requires_grad_(true);
      LinearWeights experts;
      experts.weight = w0.clone().requires_grad_(true);
      if (bias) experts.bias = b0.clone().requires_grad_(true);
      torch::Tensor y = GroupedLinear(x, counts, experts, gemm);
      (y * upstream).sum().backward();
      outputs.push_back(y.detach());
      grads.push_back(x.grad());
      grads.push_back(experts.weight.grad());
      if (bias) grads.push_back(experts.bias.grad());
    }
    // The loop is the reference: linear per expert.
    const torch::Tensor reference =
        torch::cat({torch::matmul(x0.narrow(0, 0, 3), w0[0].t()),
                    torch::matmul(x0.narrow(0, 3, 5), w0[2].t()),
                    torch::matmul(x0.narrow(0, 8, 2), w0[3].t()),
                    torch::matmul(x0.narrow(0, 10, 4), w0[5].t())}) +
        (bias ? torch::cat({b0[0].expand({3, 24}), b0[2].expand({5, 24}),
                            b0[3].expand({2, 24}), b0[5].expand({4, 24})})
              : torch::zeros({pairs, 24}));
    EXPECT_TRUE(torch::allclose(outputs[0], reference, 1e-5, 1e-5));
    EXPECT_TRUE(torch::allclose(outputs[1], outputs[0], 1e-5, 1e-5));
    const size_t half = grads.size() / 2;
    for (size_t i = 0; i < half; ++i) {
      EXPECT_TRUE(torch::allclose(grads[half + i], grads[i], 1e-5, 1e-5))
          << "gradient " << i;
    }
    // Experts without tokens get zero weight gradients either way.
    EXPECT_EQ(grads[half + 1][1].abs().max().item<float>(), 0.0f);
  }
}

// With no pairs at all (every count 0), the loop gives an empty output.
TEST(ExpertsTest, NoPairsGiveAnEmptyOutput) {
  LinearWeights experts;
  experts.weight = torch::randn({2, 4, 3});
  const torch::Tensor y =
      GroupedLinear(torch::zeros({0, 3}), {0, 0}, experts, ExpertGemm::kLoop);
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{0, 4}));
}

}  // namespace
}  // namespace loraplex
