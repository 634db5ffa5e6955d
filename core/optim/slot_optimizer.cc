#include "core/optim/slot_optimizer.h"

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/optim/muon.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

// Bumped when the archive layout written by SlotOptimizer::Save changes.
constexpr int64_t kArchiveVersion = 1;

template <typename State>
State* FindState(torch::optim::Optimizer& optimizer,
                 const torch::Tensor& param) {
  auto it = optimizer.state().find(OptimizerStateKeyOf(param));
  if (it == optimizer.state().end()) return nullptr;
  return static_cast<State*>(it->second.get());
}

// "" when `tensor` is defined and shaped like `param`, else the reason.
std::string StateTensorError(size_t index, const char* name,
                             const torch::Tensor& tensor,
                             const torch::Tensor& param) {
  if (!tensor.defined()) {
    return absl::StrCat("parameter ", index, ": ", name, " is missing");
  }
  if (tensor.sizes() != param.sizes()) {
    std::ostringstream out;
    out << "parameter " << index << ": " << name << " has shape "
        << tensor.sizes() << ", expected " << param.sizes();
    return out.str();
  }
  return "";
}

// Calls `check(index, param)` for every parameter of `optimizer` and returns
// the first error.
template <typename Check>
std::string FirstStateError(torch::optim::Optimizer& optimizer, Check check) {
  size_t index = 0;
  for (auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      std::string error = check(index++, param);
      if (!error.empty()) return error;
    }
  }
  return "";
}

// Adam and AdamW keep identical state (step, exp_avg, exp_avg_sq) in two
// distinct classes; these templates serve both.
template <typename State>
void InitAdamFamilyState(torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      if (FindState<State>(optimizer, param) != nullptr) continue;
      auto state = std::make_unique<State>();
      state->step(0);
      state->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
      state->exp_avg_sq(
          torch::zeros_like(param, torch::MemoryFormat::Preserve));
      optimizer.state()[OptimizerStateKeyOf(param)] = std::move(state);
    }
  }
}

template <typename State>
void ZeroAdamFamilyState(torch::optim::Optimizer& optimizer) {
  torch::NoGradGuard no_grad;
  for (auto& entry : optimizer.state()) {
    auto& state = static_cast<State&>(*entry.second);
    state.step(0);
    for (const torch::Tensor& moment :
         {state.exp_avg(), state.exp_avg_sq(), state.max_exp_avg_sq()}) {
      if (moment.defined()) moment.zero_();
    }
  }
}

template <typename State>
std::string AdamFamilyStateError(torch::optim::Optimizer& optimizer) {
  return FirstStateError(
      optimizer, [&](size_t index, const torch::Tensor& param) -> std::string {
        State* state = FindState<State>(optimizer, param);
        if (state == nullptr) {
          return absl::StrCat("parameter ", index, " has no state");
        }
        std::string error =
            StateTensorError(index, "exp_avg", state->exp_avg(), param);
        if (error.empty()) {
          error =
              StateTensorError(index, "exp_avg_sq", state->exp_avg_sq(), param);
        }
        return error;
      });
}

template <typename Optimizer, typename State, typename Options>
OptimizerChild MakeAdamFamilyChild(OptimizerChildKind kind,
                                   std::vector<torch::Tensor> params,
                                   const OptimizerConfig& config) {
  auto optimizer = std::make_unique<Optimizer>(
      std::move(params), Options(config.lr)
                             .betas({config.beta1, config.beta2})
                             .eps(config.eps)
                             .weight_decay(config.weight_decay));
  torch::optim::Optimizer* raw = optimizer.get();
  OptimizerChild child;
  child.kind = kind;
  child.optimizer = std::move(optimizer);
  child.init_state = [raw] { InitAdamFamilyState<State>(*raw); };
  child.zero_state = [raw] { ZeroAdamFamilyState<State>(*raw); };
  child.state_error = [raw] { return AdamFamilyStateError<State>(*raw); };
  return child;
}

OptimizerChild MakeAdamWChild(std::vector<torch::Tensor> params,
                              const OptimizerConfig& config) {
  return MakeAdamFamilyChild<torch::optim::AdamW, torch::optim::AdamWParamState,
                             torch::optim::AdamWOptions>(
      OptimizerChildKind::kAdamW, std::move(params), config);
}

OptimizerChild MakeMuonChild(std::vector<torch::Tensor> params,
                             const OptimizerConfig& config) {
  auto optimizer =
      std::make_unique<Muon>(std::move(params), MuonOptionsFromConfig(config));
  Muon* raw = optimizer.get();
  OptimizerChild child;
  child.kind = OptimizerChildKind::kMuon;
  child.optimizer = std::move(optimizer);
  child.init_state = [raw] { raw->InitState(); };
  child.zero_state = [raw] { raw->ZeroState(); };
  child.state_error = [raw] {
    return FirstStateError(
        *raw, [raw](size_t index, const torch::Tensor& param) -> std::string {
          MuonParamState* state = raw->StateOf(param);
          if (state == nullptr) {
            return absl::StrCat("parameter ", index, " has no state");
          }
          return StateTensorError(index, "momentum_buffer",
                                  state->momentum_buffer(), param);
        });
  };
  return child;
}

std::string ParameterError(size_t index, const torch::Tensor& param) {
  if (!param.defined())
    return absl::StrCat("parameter ", index, " is undefined");
  if (!param.is_floating_point()) {
    return absl::StrCat("parameter ", index, " is not a float tensor");
  }
  if (!param.requires_grad() || !param.is_leaf()) {
    return absl::StrCat("parameter ", index,
                        " must be a leaf tensor that requires grad");
  }
  return "";
}

}  // namespace

absl::string_view OptimizerChildKindName(OptimizerChildKind kind) {
  switch (kind) {
    case OptimizerChildKind::kMuon:
      return "muon";
    case OptimizerChildKind::kAdamW:
      return "adamw";
    case OptimizerChildKind::kAdam:
      return "adam";
  }
  return "unknown";
}

absl::StatusOr<SlotOptimizer> BuildSlotOptimizer(
    const OptimizerConfig& config, std::vector<torch::Tensor> parameters) {
  LORAPLEX_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  if (parameters.empty()) {
    return absl::InvalidArgumentError("optimizer needs at least one parameter");
  }
  for (size_t i = 0; i < parameters.size(); ++i) {
    const std::string error = ParameterError(i, parameters[i]);
    if (!error.empty()) return absl::InvalidArgumentError(error);
  }

  std::vector<OptimizerChild> children;
  try {
    switch (config.family) {
      case OptimizerFamily::kMuon: {
        std::vector<torch::Tensor> matrices;
        std::vector<torch::Tensor> others;
        for (const torch::Tensor& param : parameters) {
          (param.dim() == 2 ? matrices : others).push_back(param);
        }
        if (!matrices.empty()) {
          children.push_back(MakeMuonChild(std::move(matrices), config));
        }
        if (!others.empty()) {
          children.push_back(MakeAdamWChild(std::move(others), config));
        }
        break;
      }
      case OptimizerFamily::kAdamW:
        children.push_back(MakeAdamWChild(parameters, config));
        break;
      case OptimizerFamily::kAdam:
        children.push_back(MakeAdamFamilyChild<torch::optim::Adam,
                                               torch::optim::AdamParamState,
                                               torch::optim::AdamOptions>(
            OptimizerChildKind::kAdam, parameters, config));
        break;
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", e.what_without_backtrace()));
  }
  for (OptimizerChild& child : children) child.init_state();
  return SlotOptimizer(config, std::move(parameters), std::move(children));
}

SlotOptimizer::SlotOptimizer(OptimizerConfig config,
                             std::vector<torch::Tensor> parameters,
                             std::vector<OptimizerChild> children)
    : config_(std::move(config)),
      parameters_(std::move(parameters)),
      children_(std::move(children)) {}

void SlotOptimizer::Step() {
  for (OptimizerChild& child : children_) child.optimizer->step();
}

void SlotOptimizer::ZeroGrad() {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& param : parameters_) {
    if (param.grad().defined()) param.grad().zero_();
  }
}

void SlotOptimizer::ZeroState() {
  for (OptimizerChild& child : children_) child.zero_state();
}

void SlotOptimizer::SetLr(double lr) {
  for (OptimizerChild& child : children_) {
    for (auto& group : child.optimizer->param_groups()) {
      group.options().set_lr(lr);
    }
  }
}

double SlotOptimizer::lr() const {
  return children_.front().optimizer->param_groups().front().options().get_lr();
}

void SlotOptimizer::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("version", c10::IValue(kArchiveVersion));
  archive.write("family", c10::IValue(static_cast<int64_t>(config_.family)));
  archive.write("num_children",
                c10::IValue(static_cast<int64_t>(children_.size())));
  for (size_t i = 0; i < children_.size(); ++i) {
    torch::serialize::OutputArchive child(archive.compilation_unit());
    child.write("kind", c10::IValue(static_cast<int64_t>(children_[i].kind)));
    torch::serialize::OutputArchive state(archive.compilation_unit());
    children_[i].optimizer->save(state);
    child.write("optimizer", state);
    archive.write(absl::StrCat("child", i), child);
  }
}

void SlotOptimizer::LoadUnchecked(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  archive.read("version", value);
  TORCH_CHECK(value.toInt() == kArchiveVersion, "archive version ",
              value.toInt(), " is not supported (expected ", kArchiveVersion,
              ")");
  archive.read("family", value);
  const int64_t family = value.toInt();
  const bool known = family >= 0 && family < static_cast<int64_t>(
                                                 kAllOptimizerFamilies.size());
  TORCH_CHECK(
      family == static_cast<int64_t>(config_.family),
      "archive holds optimizer family ",
      known ? std::string(OptimizerFamilyName(kAllOptimizerFamilies[family]))
            : std::to_string(family),
      ", this slot uses ", std::string(OptimizerFamilyName(config_.family)));
  archive.read("num_children", value);
  TORCH_CHECK(value.toInt() == static_cast<int64_t>(children_.size()),
              "archive has ", value.toInt(), " optimizer children, this slot ",
              children_.size());
  for (size_t i = 0; i < children_.size(); ++i) {
    torch::serialize::InputArchive child;
    archive.read(absl::StrCat("child", i), child);
    child.read("kind", value);
    TORCH_CHECK(value.toInt() == static_cast<int64_t>(children_[i].kind),
                "optimizer child ", i, " has a different kind");
    torch::serialize::InputArchive state;
    child.read("optimizer", state);
    // The job's config, not the archive, decides hyperparameters (LibTorch
    // 2.x would otherwise take them from the archive and 1.13 would not).
    std::vector<std::unique_ptr<torch::optim::OptimizerOptions>> options;
    for (auto& group : children_[i].optimizer->param_groups()) {
      options.push_back(group.options().clone());
    }
    children_[i].optimizer->load(state);
    auto& groups = children_[i].optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      groups[g].set_options(std::move(options[g]));
    }
  }
}

absl::Status SlotOptimizer::Load(torch::serialize::InputArchive& archive) {
  std::ostringstream backup;
  {
    torch::serialize::OutputArchive snapshot;
    Save(snapshot);
    snapshot.save_to(backup);
  }
  std::string error;
  try {
    LoadUnchecked(archive);
    for (size_t i = 0; i < children_.size() && error.empty(); ++i) {
      // Archives from lazily-initialised optimizers may lack some entries.
      children_[i].init_state();
      const std::string child_error = children_[i].state_error();
      if (!child_error.empty()) {
        error = absl::StrCat(OptimizerChildKindName(children_[i].kind),
                             " child: ", child_error);
      }
    }
  } catch (const c10::Error& e) {
    error = e.what_without_backtrace();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (error.empty()) return absl::OkStatus();

  std::istringstream saved(backup.str());
  torch::serialize::InputArchive restore;
  restore.load_from(saved);
  LoadUnchecked(restore);
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer state does not fit this slot: ", error));
}

}  // namespace loraplex
