// The multi-tensor Adam and AdamW step exactly as LibTorch's own
// per-parameter ones: on the CPU bit for bit (parameters, moments and step
// counts, with and without weight decay, in fp32 and fp64, with parameters
// at different step counts); on a GPU within fp32 rounding of the CPU.
#include "core/optim/multi_tensor_adam.h"

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <memory>
#include <string>
#include <vector>

#include "core/runtime/torch_compat.h"
#include "tests/common/optim_fixture.h"
#include "tests/common/tiny_model.h"

namespace loraplex {
namespace {

// LoRA-like shapes plus a vector.
std::vector<torch::Tensor> Parameters(torch::ScalarType dtype,
                                      const torch::Device& device) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (const auto& shape : std::vector<std::vector<int64_t>>{
           {4, 24}, {24, 4}, {8, 40}, {40, 8}, {24}}) {
    params.push_back(
        Leaf(torch::randn(shape, torch::kFloat64).to(device, dtype)));
  }
  return params;
}

// Gradients of step `step`; parameter 1 gets none on even steps, so the
// parameters reach different step counts (and bias corrections).
void SetGrads(const std::vector<torch::Tensor>& params, int step) {
  torch::manual_seed(100 + step);
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor grad = torch::randn(params[i].sizes(), torch::kFloat64)
                             .to(params[i].device(), params[i].scalar_type());
    params[i].mutable_grad() =
        (i == 1 && step % 2 == 0) ? torch::Tensor() : grad;
  }
}

std::vector<torch::Tensor> Copies(const std::vector<torch::Tensor>& params,
                                  const torch::Device& device) {
  std::vector<torch::Tensor> out;
  for (const torch::Tensor& p : params) out.push_back(Leaf(p.to(device)));
  return out;
}

template <typename State>
void ExpectSameState(torch::optim::Optimizer& a, torch::optim::Optimizer& b,
                     const std::vector<torch::Tensor>& params_a,
                     const std::vector<torch::Tensor>& params_b,
                     double tolerance) {
  auto same = [&](const torch::Tensor& x, const torch::Tensor& y) {
    if (tolerance == 0) return torch::equal(x.cpu(), y.cpu());
    return MaxRelativeDiff(x.cpu(), y.cpu()) <= tolerance;
  };
  for (size_t i = 0; i < params_a.size(); ++i) {
    EXPECT_TRUE(same(params_a[i].detach(), params_b[i].detach()))
        << "parameter " << i;
    State* sa = FindOptimizerState<State>(a, params_a[i]);
    State* sb = FindOptimizerState<State>(b, params_b[i]);
    ASSERT_NE(sa, nullptr);
    ASSERT_NE(sb, nullptr);
    EXPECT_EQ(sa->step(), sb->step()) << "parameter " << i;
    EXPECT_TRUE(same(sa->exp_avg(), sb->exp_avg())) << "exp_avg " << i;
    EXPECT_TRUE(same(sa->exp_avg_sq(), sb->exp_avg_sq())) << "exp_avg_sq " << i;
  }
}

// Steps `Ours` on `device` and LibTorch's `Theirs` on the CPU side by side.
template <typename Ours, typename Theirs, typename State, typename Options>
void ExpectStepsLikeLibTorch(torch::ScalarType dtype, double weight_decay,
                             const torch::Device& device, double tolerance) {
  const std::vector<torch::Tensor> reference = Parameters(dtype, torch::kCPU);
  const std::vector<torch::Tensor> ours_params = Copies(reference, device);
  Options options(2e-2);
  options.betas({0.8, 0.95}).eps(1e-6).weight_decay(weight_decay);
  Theirs theirs(reference, options);
  Ours ours(ours_params, options);
  for (int step = 0; step < 7; ++step) {
    SetGrads(reference, step);
    for (size_t i = 0; i < reference.size(); ++i) {
      ours_params[i].mutable_grad() = reference[i].grad().defined()
                                          ? reference[i].grad().to(device)
                                          : torch::Tensor();
    }
    theirs.step();
    ours.step();
  }
  ExpectSameState<State>(ours, theirs, ours_params, reference, tolerance);
  // Parameter 1 skipped its even steps.
  EXPECT_EQ(FindOptimizerState<State>(ours, ours_params[1])->step(), 3);
  EXPECT_EQ(FindOptimizerState<State>(ours, ours_params[0])->step(), 7);
}

// Adam and AdamW, each with and without weight decay.
void ExpectBothLikeLibTorch(torch::ScalarType dtype,
                            const torch::Device& device, double tolerance) {
  for (double weight_decay : {0.0, 0.1}) {
    SCOPED_TRACE(testing::Message() << dtype << " wd " << weight_decay);
    {
      SCOPED_TRACE("AdamW");
      ExpectStepsLikeLibTorch<MultiTensorAdamW, torch::optim::AdamW,
                              torch::optim::AdamWParamState,
                              torch::optim::AdamWOptions>(dtype, weight_decay,
                                                          device, tolerance);
    }
    {
      SCOPED_TRACE("Adam");
      ExpectStepsLikeLibTorch<MultiTensorAdam, torch::optim::Adam,
                              torch::optim::AdamParamState,
                              torch::optim::AdamOptions>(dtype, weight_decay,
                                                         device, tolerance);
    }
  }
}

TEST(MultiTensorAdamTest, AdamAndAdamWAreLibTorchsBitForBit) {
  ExpectBothLikeLibTorch(torch::kFloat32, torch::kCPU, 0.0);
  ExpectBothLikeLibTorch(torch::kFloat64, torch::kCPU, 0.0);
}

// On a GPU the _foreach ops are fused kernels: the same arithmetic, fp64
// to its rounding.
TEST(MultiTensorAdamTest, StepsOnCudaAsLibTorchOnTheCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  ExpectBothLikeLibTorch(torch::kFloat64, CudaDevice(), 1e-12);
}

}  // namespace
}  // namespace loraplex
