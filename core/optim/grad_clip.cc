#include "core/optim/grad_clip.h"

#include <ATen/ATen.h>
#include <torch/utils.h>

#include <cmath>

namespace loraplex {

GradNorm ClipGradNorm(const std::vector<torch::Tensor>& params,
                      double max_norm) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> norms;
  for (const torch::Tensor& param : params) {
    if (param.grad().defined()) {
      norms.push_back(at::linalg_vector_norm(param.grad(), 2, c10::nullopt,
                                             false, torch::kFloat64));
    }
  }
  GradNorm result;
  if (norms.empty()) return result;
  result.norm = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  result.finite = std::isfinite(result.norm);
  if (!result.finite || max_norm <= 0.0) return result;
  // The same epsilon as PyTorch's clip_grad_norm_, so a norm equal to
  // max_norm is (almost) not scaled and the result matches PyTorch's.
  const double coefficient = max_norm / (result.norm + 1e-6);
  if (coefficient < 1.0) {
    for (const torch::Tensor& param : params) {
      if (param.grad().defined()) param.grad().mul_(coefficient);
    }
    result.clipped = true;
  }
  return result;
}

}  // namespace loraplex
