#include "core/optim/lion.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/optim/archive_fields.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {

LionOptions::LionOptions(double lr) : lr_(lr) {}

double LionOptions::get_lr() const { return lr(); }

void LionOptions::set_lr(const double lr) { this->lr(lr); }

void LionOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("beta1", c10::IValue(beta1()));
  archive.write("beta2", c10::IValue(beta2()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
}

void LionOptions::serialize(torch::serialize::InputArchive& archive) {
  lr(ReadArchiveScalar<double>(archive, "lr"));
  beta1(ReadArchiveScalar<double>(archive, "beta1"));
  beta2(ReadArchiveScalar<double>(archive, "beta2"));
  weight_decay(ReadArchiveScalar<double>(archive, "weight_decay"));
}

std::string LionOptionsError(const LionOptions& options) {
  // As Emerging-Optimizers checks them; NaN fails every comparison.
  if (!(options.lr() >= 0.0)) {
    return absl::StrCat("lr must be >= 0, got ", options.lr());
  }
  if (!(options.beta1() >= 0.0 && options.beta1() < 1.0)) {
    return absl::StrCat("beta1 must be in [0, 1), got ", options.beta1());
  }
  if (!(options.beta2() >= 0.0 && options.beta2() < 1.0)) {
    return absl::StrCat("beta2 must be in [0, 1), got ", options.beta2());
  }
  if (!(options.weight_decay() >= 0.0)) {
    return absl::StrCat("weight_decay must be >= 0, got ",
                        options.weight_decay());
  }
  return "";
}

void LionParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step()));
  archive.write("exp_avg", exp_avg(), /*is_buffer=*/true);
}

void LionParamState::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  archive.read("step", value);
  step(value.toInt());
  torch::Tensor buffer;
  archive.read("exp_avg", buffer, /*is_buffer=*/true);
  exp_avg(buffer);
}

Lion::Lion(std::vector<torch::optim::OptimizerParamGroup> param_groups,
           LionOptions defaults)
    : torch::optim::Optimizer(std::move(param_groups),
                              std::make_unique<LionOptions>(defaults)) {
  const std::string default_error = LionOptionsError(defaults);
  TORCH_CHECK(default_error.empty(), "Lion: ", default_error);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const std::string error = LionOptionsError(
        static_cast<const LionOptions&>(param_groups_[g].options()));
    TORCH_CHECK(error.empty(), "Lion: param group ", g, ": ", error);
  }
}

Lion::Lion(std::vector<torch::Tensor> params, LionOptions defaults)
    : Lion({torch::optim::OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

LionParamState* Lion::StateOf(const torch::Tensor& param) {
  return FindOptimizerState<LionParamState>(*this, param);
}

LionParamState& Lion::EnsureState(const torch::Tensor& param) {
  if (LionParamState* state = StateOf(param)) return *state;
  auto state = std::make_unique<LionParamState>();
  state->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
  LionParamState& ref = *state;
  state_[OptimizerStateKeyOf(param)] = std::move(state);
  return ref;
}

void Lion::InitState() {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) EnsureState(param);
  }
}

void Lion::ZeroState() {
  torch::NoGradGuard no_grad;
  for (auto& entry : state_) {
    auto& state = static_cast<LionParamState&>(*entry.second);
    state.step(0);
    if (state.exp_avg().defined()) state.exp_avg().zero_();
  }
}

torch::Tensor Lion::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const LionOptions&>(group.options());
    std::vector<torch::Tensor> params, grads, exp_avgs;
    for (const torch::Tensor& param : group.params()) {
      if (!param.grad().defined()) continue;
      LionParamState& state = EnsureState(param);
      state.step(state.step() + 1);
      params.push_back(param);
      grads.push_back(param.grad());
      exp_avgs.push_back(state.exp_avg());
    }
    if (params.empty()) continue;
    const double lr = options.lr();
    const double wd = options.weight_decay();
    // The same operations as the reference, in its order: p + (−lr·wd)·p,
    // the two interpolations, then p + (−lr)·sign(u).
    if (wd != 0.0) at::_foreach_add_(params, params, -wd * lr);
    std::vector<torch::Tensor> updates =
        at::_foreach_lerp(exp_avgs, grads, c10::Scalar(1.0 - options.beta1()));
    at::_foreach_lerp_(exp_avgs, grads, c10::Scalar(1.0 - options.beta2()));
    at::_foreach_sign_(updates);
    at::_foreach_add_(params, updates, -lr);
  }
  return loss;
}

void Lion::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<LionParamState, LionOptions>(archive, *this);
}

void Lion::load(torch::serialize::InputArchive& archive) {
  LoadOptimizerKeepingValidOptions<LionParamState, LionOptions>(
      *this, archive, &LionOptionsError, "Lion");
}

}  // namespace loraplex
