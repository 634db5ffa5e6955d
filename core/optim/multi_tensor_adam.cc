#include "core/optim/multi_tensor_adam.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/utils.h>

#include <cmath>
#include <map>
#include <vector>

namespace loraplex {
namespace {

// The parameters of one group that share a step count (so their bias
// corrections), with their gradients and moments.
struct SameStep {
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> exp_avgs;
  std::vector<torch::Tensor> exp_avg_sqs;
};

// One step of every parameter with a gradient, as torch::optim::Adam
// (decoupled == false: weight decay added to the gradient) or AdamW
// (decoupled: parameters shrunk by lr * weight_decay first) steps them, op
// for op.
template <typename State, typename Options>
void StepAdamFamily(torch::optim::Optimizer& optimizer, bool decoupled) {
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    const auto& options = static_cast<const Options&>(group.options());
    TORCH_CHECK(!options.amsgrad(),
                "the multi-tensor Adam step has no AMSGrad");
    std::map<int64_t, SameStep> by_step;
    for (const torch::Tensor& param : group.params()) {
      if (!param.grad().defined()) continue;
      TORCH_CHECK(!param.grad().is_sparse(),
                  "Adam does not support sparse gradients");
      State& state = EnsureAdamFamilyState<State>(optimizer, param);
      state.step(state.step() + 1);
      SameStep& same = by_step[state.step()];
      same.params.push_back(param);
      same.grads.push_back(param.grad());
      same.exp_avgs.push_back(state.exp_avg());
      same.exp_avg_sqs.push_back(state.exp_avg_sq());
    }
    const double lr = options.lr();
    const double weight_decay = options.weight_decay();
    const auto [beta1, beta2] = options.betas();
    for (auto& [step, same] : by_step) {
      std::vector<torch::Tensor> grads = same.grads;
      if (weight_decay != 0) {
        if (decoupled) {
          at::_foreach_mul_(same.params, 1 - lr * weight_decay);
        } else {
          grads = at::_foreach_add(same.grads, same.params, weight_decay);
        }
      }
      const double bias_correction1 = 1 - std::pow(beta1, step);
      const double bias_correction2 = 1 - std::pow(beta2, step);
      at::_foreach_mul_(same.exp_avgs, beta1);
      at::_foreach_add_(same.exp_avgs, grads, 1 - beta1);
      at::_foreach_mul_(same.exp_avg_sqs, beta2);
      at::_foreach_addcmul_(same.exp_avg_sqs, grads, grads, 1 - beta2);
      std::vector<torch::Tensor> denom = at::_foreach_sqrt(same.exp_avg_sqs);
      at::_foreach_div_(denom, std::sqrt(bias_correction2));
      at::_foreach_add_(denom, options.eps());
      at::_foreach_addcdiv_(same.params, same.exp_avgs, denom,
                            -(lr / bias_correction1));
    }
  }
}

torch::Tensor StepWith(torch::optim::Optimizer::LossClosure& closure) {
  if (closure == nullptr) return {};
  at::AutoGradMode enable_grad(true);
  return closure();
}

}  // namespace

torch::Tensor MultiTensorAdam::step(LossClosure closure) {
  torch::Tensor loss = StepWith(closure);
  StepAdamFamily<torch::optim::AdamParamState, torch::optim::AdamOptions>(
      *this, /*decoupled=*/false);
  return loss;
}

torch::Tensor MultiTensorAdamW::step(LossClosure closure) {
  torch::Tensor loss = StepWith(closure);
  StepAdamFamily<torch::optim::AdamWParamState, torch::optim::AdamWOptions>(
      *this, /*decoupled=*/true);
  return loss;
}

}  // namespace loraplex
