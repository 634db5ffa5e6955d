// Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms",
// arXiv:2302.06675) as NVIDIA Emerging-Optimizers defines it
// (emerging_optimizers.scalar_optimizers.Lion, decoupled weight decay).
// Per parameter p with gradient g and state exp_avg m (zeros at first):
//   1. p ← p − lr·wd·p                 (decoupled weight decay)
//   2. u = sign(lerp(m, g, 1 − β1))     = sign(β1·m + (1 − β1)·g)
//   3. m ← lerp(m, g, 1 − β2)           = β2·m + (1 − β2)·g
//   4. p ← p − lr·u
// Every update has the same magnitude lr per element, so Lion wants a
// learning rate about 3-10× smaller than AdamW's (the paper's advice).
// A step runs multi-tensor (_foreach) ops over a group's parameters.
//
//   Lion lion(params, LionOptions(1e-4).beta1(0.9).beta2(0.99));
//   loss.backward();
//   lion.step();
#ifndef LORAPLEX_CORE_OPTIM_LION_H_
#define LORAPLEX_CORE_OPTIM_LION_H_

#include <torch/torch.h>

#include <string>
#include <vector>

namespace loraplex {

// Defaults are Emerging-Optimizers'.
struct LionOptions
    : public torch::optim::OptimizerCloneableOptions<LionOptions> {
  LionOptions(double lr = 1e-4);  // NOLINT(runtime/explicit): as LibTorch's.
  TORCH_ARG(double, lr);
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.99;
  TORCH_ARG(double, weight_decay) = 0.01;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

// Empty when the options are valid, else "<field> must be ..., got <value>".
std::string LionOptionsError(const LionOptions& options);

struct LionParamState
    : public torch::optim::OptimizerCloneableParamState<LionParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Lion : public torch::optim::Optimizer {
 public:
  // Throws c10::Error naming the bad option: every group's options are
  // validated.
  explicit Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                LionOptions defaults = {});
  explicit Lion(std::vector<torch::Tensor> params, LionOptions defaults = {});
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // Creates every parameter's state (zero exp_avg, step 0) now rather than
  // at its first gradient, so a checkpoint can be saved or loaded at once.
  void InitState();
  // Zeroes every exp_avg and step counter in place (no reallocation);
  // afterwards the optimizer behaves as a fresh one.
  void ZeroState();
  // The state of `param`, which must belong to this optimizer; nullptr
  // before InitState or its first step.
  LionParamState* StateOf(const torch::Tensor& param);

 private:
  LionParamState& EnsureState(const torch::Tensor& param);
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_LION_H_
