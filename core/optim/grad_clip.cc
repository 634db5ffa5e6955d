#include "core/optim/grad_clip.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <cmath>

namespace loraplex {

std::vector<GradNorm> ClipGradNorms(
    const std::vector<std::vector<torch::Tensor>>& params,
    const std::vector<double>& max_norms) {
  TORCH_CHECK(params.size() == max_norms.size(),
              "ClipGradNorms: ", params.size(), " parameter sets, ",
              max_norms.size(), " max norms");
  torch::NoGradGuard no_grad;
  std::vector<std::vector<torch::Tensor>> grads(params.size());
  std::vector<torch::Tensor> totals;  // Of the sets with gradients.
  for (size_t i = 0; i < params.size(); ++i) {
    for (const torch::Tensor& param : params[i]) {
      if (param.grad().defined()) grads[i].push_back(param.grad());
    }
    if (grads[i].empty()) continue;
    // Each gradient's norm in fp64, then the norm of those: one kernel per
    // op for all of a set's gradients where the device fuses _foreach ops.
    const std::vector<torch::Tensor> norms =
        at::_foreach_norm(grads[i], 2, torch::kFloat64);
    totals.push_back(at::linalg_vector_norm(at::stack(norms), 2));
  }
  std::vector<GradNorm> results(params.size());
  if (totals.empty()) return results;
  // One transfer for every set on the device of the first; sets elsewhere
  // (never in one step of the engine) are read one by one.
  const torch::Device device = totals.front().device();
  std::vector<double> values;
  bool one_device = true;
  for (const torch::Tensor& total : totals) {
    one_device = one_device && total.device() == device;
  }
  if (one_device) {
    const torch::Tensor read = at::stack(totals).cpu().contiguous();
    values.assign(read.data_ptr<double>(),
                  read.data_ptr<double>() + read.numel());
  } else {
    for (const torch::Tensor& total : totals) {
      values.push_back(total.item<double>());
    }
  }
  size_t next = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    if (grads[i].empty()) continue;
    GradNorm& result = results[i];
    result.norm = values[next++];
    result.finite = std::isfinite(result.norm);
    if (!result.finite || max_norms[i] <= 0.0) continue;
    // The same epsilon as PyTorch's clip_grad_norm_, so a norm equal to
    // max_norm is (almost) not scaled and the result matches PyTorch's.
    const double coefficient = max_norms[i] / (result.norm + 1e-6);
    if (coefficient < 1.0) {
      at::_foreach_mul_(grads[i], coefficient);
      result.clipped = true;
    }
  }
  return results;
}

GradNorm ClipGradNorm(const std::vector<torch::Tensor>& params,
                      double max_norm) {
  return ClipGradNorms({params}, {max_norm}).front();
}

}  // namespace loraplex
