// Adam and AdamW whose step runs LibTorch's own arithmetic with multi-tensor
// (_foreach) ops: a fixed handful of kernels for all of a slot's parameters
// (on a GPU, one launch per op and chunk of tensors) instead of eight or so
// per parameter. A slot of a Llama-3-8B-shaped model has 448 LoRA matrices,
// so the per-parameter step cost thousands of launches per slot and step.
//
// The state, options and archive are torch::optim::Adam's / AdamW's, so
// checkpoints and everything reading the state are unchanged; on the CPU
// each _foreach op runs the per-tensor op, so a step is bit for bit the
// per-parameter one (tests/core/multi_tensor_adam_test.cc).
//
//   MultiTensorAdamW optimizer(params, torch::optim::AdamWOptions(1e-3));
//   optimizer.step();
#ifndef LORAPLEX_CORE_OPTIM_MULTI_TENSOR_ADAM_H_
#define LORAPLEX_CORE_OPTIM_MULTI_TENSOR_ADAM_H_

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <utility>

#include "core/runtime/torch_compat.h"

namespace loraplex {

// The Adam-family state (torch::optim::AdamParamState or AdamWParamState)
// `optimizer` keeps for `param`, created first (step 0, zero moments) when
// it has none.
template <typename State>
State& EnsureAdamFamilyState(torch::optim::Optimizer& optimizer,
                             const torch::Tensor& param) {
  if (State* state = FindOptimizerState<State>(optimizer, param)) {
    return *state;
  }
  auto fresh = std::make_unique<State>();
  fresh->step(0);
  fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
  fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
  State& ref = *fresh;
  optimizer.state()[OptimizerStateKeyOf(param)] = std::move(fresh);
  return ref;
}

class MultiTensorAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

class MultiTensorAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;
  torch::Tensor step(LossClosure closure = nullptr) override;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_MULTI_TENSOR_ADAM_H_
