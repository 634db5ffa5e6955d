#include "core/optim/slot_optimizer.h"

#include <c10/util/Exception.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/utils.h>

#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/common/status_macros.h"
#include "core/optim/archive_fields.h"
#include "core/optim/lion.h"
#include "core/optim/multi_tensor_adam.h"
#include "core/optim/muon.h"
#include "core/optim/soap.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

// Bumped when the archive layout written by SlotOptimizer::Save changes.
constexpr int64_t kArchiveVersion = 2;

// Appended only: archives store a child's kind as its index here.
constexpr std::array<OptimizerChildKind, 5> kAllOptimizerChildKinds = {
    OptimizerChildKind::kMuon, OptimizerChildKind::kAdamW,
    OptimizerChildKind::kAdam, OptimizerChildKind::kLion,
    OptimizerChildKind::kSoap};

std::vector<torch::Tensor> ChildParameters(const OptimizerChild& child) {
  std::vector<torch::Tensor> params;
  for (const auto& group : child.optimizer->param_groups()) {
    params.insert(params.end(), group.params().begin(), group.params().end());
  }
  return params;
}

// The shape `ref`'s tensor `i` must have.
c10::IntArrayRef ExpectedShape(const ParamStateRef& ref, size_t i,
                               const torch::Tensor& param) {
  if (i < ref.shapes.size() && !ref.shapes[i].empty()) return ref.shapes[i];
  return param.sizes();
}

std::string ShapeString(c10::IntArrayRef shape) {
  std::ostringstream out;
  out << shape;
  return out.str();
}

// "" when `tensor` can stand in the state of `param` (with `shape`), else
// the reason.
std::string StateTensorError(size_t index, const char* name,
                             const torch::Tensor& tensor,
                             const torch::Tensor& param,
                             c10::IntArrayRef shape) {
  const std::string prefix = absl::StrCat("parameter ", index, ": ", name);
  if (!tensor.defined()) return absl::StrCat(prefix, " is missing");
  if (tensor.sizes() != shape) {
    return absl::StrCat(prefix, " has shape ", ShapeString(tensor.sizes()),
                        ", expected ", ShapeString(shape));
  }
  if (tensor.scalar_type() != param.scalar_type() ||
      tensor.device() != param.device()) {
    return absl::StrCat(prefix, " is ", tensor.toString(), " on ",
                        tensor.device().str(), ", expected ", param.toString(),
                        " on ", param.device().str());
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
      EnsureAdamFamilyState<State>(optimizer, param);
    }
  }
}

template <typename State>
std::vector<ParamStateRef> AdamFamilyStates(
    torch::optim::Optimizer& optimizer) {
  std::vector<ParamStateRef> states;
  for (auto& group : optimizer.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      ParamStateRef ref;
      if (State* state = FindOptimizerState<State>(optimizer, param)) {
        ref.step = &state->step();
        ref.tensors = {{"exp_avg", state->exp_avg()},
                       {"exp_avg_sq", state->exp_avg_sq()}};
      }
      states.push_back(std::move(ref));
    }
  }
  return states;
}

std::vector<ParamStateRef> MuonStates(Muon& muon) {
  std::vector<ParamStateRef> states;
  for (auto& group : muon.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      ParamStateRef ref;
      if (MuonParamState* state = muon.StateOf(param)) {
        ref.step = &state->step();
        ref.tensors = {{"momentum_buffer", state->momentum_buffer()}};
      }
      states.push_back(std::move(ref));
    }
  }
  return states;
}

std::vector<ParamStateRef> SoapStates(Soap& soap) {
  std::vector<ParamStateRef> states;
  for (auto& group : soap.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      ParamStateRef ref;
      if (SoapParamState* state = soap.StateOf(param)) {
        ref.step = &state->step();
        ref.tensors = {{"exp_avg", state->exp_avg()},
                       {"exp_avg_sq", state->exp_avg_sq()},
                       {"kronecker_left", state->kronecker_left()},
                       {"kronecker_right", state->kronecker_right()},
                       {"eigenbasis_left", state->eigenbasis_left()},
                       {"eigenbasis_right", state->eigenbasis_right()}};
        ref.shapes = soap.StateShapes(param);
      }
      states.push_back(std::move(ref));
    }
  }
  return states;
}

std::vector<ParamStateRef> LionStates(Lion& lion) {
  std::vector<ParamStateRef> states;
  for (auto& group : lion.param_groups()) {
    for (const torch::Tensor& param : group.params()) {
      ParamStateRef ref;
      if (LionParamState* state = lion.StateOf(param)) {
        ref.step = &state->step();
        ref.tensors = {{"exp_avg", state->exp_avg()}};
      }
      states.push_back(std::move(ref));
    }
  }
  return states;
}

// Zeroes, in place, whatever `states` returns.
std::function<void()> ZeroStates(
    std::function<std::vector<ParamStateRef>()> states) {
  return [states = std::move(states)] {
    torch::NoGradGuard no_grad;
    for (ParamStateRef& ref : states()) {
      if (ref.step != nullptr) *ref.step = 0;
      for (auto& [name, tensor] : ref.tensors) {
        if (tensor.defined()) tensor.zero_();
      }
    }
  };
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
  child.states = [raw] { return AdamFamilyStates<State>(*raw); };
  child.zero_state = ZeroStates(child.states);
  return child;
}

OptimizerChild MakeAdamWChild(std::vector<torch::Tensor> params,
                              const OptimizerConfig& config) {
  return MakeAdamFamilyChild<MultiTensorAdamW, torch::optim::AdamWParamState,
                             torch::optim::AdamWOptions>(
      OptimizerChildKind::kAdamW, std::move(params), config);
}

OptimizerChild MakeMuonChild(std::vector<torch::Tensor> params,
                             std::vector<ParamLayout> layouts,
                             const OptimizerConfig& config) {
  auto optimizer = std::make_unique<Muon>(std::move(params), std::move(layouts),
                                          MuonOptionsFromConfig(config));
  Muon* raw = optimizer.get();
  OptimizerChild child;
  child.kind = OptimizerChildKind::kMuon;
  child.optimizer = std::move(optimizer);
  child.init_state = [raw] { raw->InitState(); };
  child.states = [raw] { return MuonStates(*raw); };
  child.zero_state = ZeroStates(child.states);
  return child;
}

OptimizerChild MakeLionChild(std::vector<torch::Tensor> params,
                             const OptimizerConfig& config) {
  auto optimizer = std::make_unique<Lion>(
      std::move(params), LionOptions(config.lr)
                             .beta1(config.lion_beta1)
                             .beta2(config.lion_beta2)
                             .weight_decay(config.weight_decay));
  Lion* raw = optimizer.get();
  OptimizerChild child;
  child.kind = OptimizerChildKind::kLion;
  child.optimizer = std::move(optimizer);
  child.init_state = [raw] { raw->InitState(); };
  child.states = [raw] { return LionStates(*raw); };
  child.zero_state = ZeroStates(child.states);
  return child;
}

SoapOptions SoapOptionsFromConfig(const OptimizerConfig& config) {
  return SoapOptions(config.lr)
      .beta1(config.soap_beta1)
      .beta2(config.soap_beta2)
      .shampoo_beta(config.shampoo_beta)
      .eps(config.eps)
      .weight_decay(config.weight_decay)
      .use_eigh(config.use_eigh)
      .power_iter_steps(config.power_iter_steps)
      .max_update_rms(config.max_update_rms)
      .precondition_frequency(config.precondition_frequency)
      .max_precond_dim(config.max_precond_dim);
}

OptimizerChild MakeSoapChild(std::vector<torch::Tensor> params,
                             std::vector<ParamLayout> layouts,
                             const OptimizerConfig& config) {
  auto optimizer = std::make_unique<Soap>(std::move(params), std::move(layouts),
                                          SoapOptionsFromConfig(config));
  Soap* raw = optimizer.get();
  OptimizerChild child;
  child.kind = OptimizerChildKind::kSoap;
  child.optimizer = std::move(optimizer);
  child.init_state = [raw] { raw->InitState(); };
  child.states = [raw] { return SoapStates(*raw); };
  // Bases back to the identity, not zero.
  child.zero_state = [raw] { raw->ZeroState(); };
  return child;
}

// The child of the muon and soap families' parameters that are not
// matrices.
OptimizerChild MakeScalarChild(std::vector<torch::Tensor> params,
                               const OptimizerConfig& config) {
  switch (config.scalar_optimizer) {
    case ScalarOptimizer::kLion:
      return MakeLionChild(std::move(params), config);
    case ScalarOptimizer::kAdamW:
      break;
  }
  return MakeAdamWChild(std::move(params), config);
}

// The first problem with `parameters` (and their `layouts`, one each) as
// one slot's parameter list.
std::string ParametersError(const std::vector<torch::Tensor>& parameters,
                            const std::vector<ParamLayout>& layouts) {
  if (parameters.empty()) return "optimizer needs at least one parameter";
  if (layouts.size() != parameters.size()) {
    return absl::StrCat("optimizer has ", layouts.size(), " layouts for ",
                        parameters.size(), " parameters");
  }
  std::set<const void*> seen;
  for (size_t i = 0; i < parameters.size(); ++i) {
    const torch::Tensor& param = parameters[i];
    const std::string name = absl::StrCat("parameter ", i);
    if (!param.defined()) return absl::StrCat(name, " is undefined");
    if (!param.is_floating_point()) {
      return absl::StrCat(name, " is not a float tensor");
    }
    if (!param.requires_grad() || !param.is_leaf()) {
      return absl::StrCat(name, " must be a leaf tensor that requires grad");
    }
    if (!seen.insert(param.unsafeGetTensorImpl()).second) {
      return absl::StrCat(name, " appears twice");
    }
    if (param.device() != parameters.front().device()) {
      return absl::StrCat(name, " is on ", param.device().str(),
                          ", parameter 0 on ",
                          parameters.front().device().str());
    }
    const std::string layout = ParamLayoutError(layouts[i], param.sizes());
    if (!layout.empty()) return absl::StrCat(name, " ", layout);
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
    case OptimizerChildKind::kLion:
      return "lion";
    case OptimizerChildKind::kSoap:
      return "soap";
  }
  return "unknown";
}

std::string OptimizerChildStateError(const OptimizerChild& child) {
  const std::vector<torch::Tensor> params = ChildParameters(child);
  const std::vector<ParamStateRef> states = child.states();
  for (size_t i = 0; i < params.size(); ++i) {
    if (i >= states.size() || states[i].step == nullptr) {
      return absl::StrCat("parameter ", i, " has no state");
    }
    for (size_t t = 0; t < states[i].tensors.size(); ++t) {
      const auto& [name, tensor] = states[i].tensors[t];
      std::string error = StateTensorError(
          i, name, tensor, params[i], ExpectedShape(states[i], t, params[i]));
      if (!error.empty()) return error;
    }
  }
  return "";
}

absl::StatusOr<SlotOptimizer> BuildSlotOptimizer(
    const OptimizerConfig& config, std::vector<torch::Tensor> parameters,
    std::vector<ParamLayout> layouts) {
  LORAPLEX_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  if (layouts.empty()) layouts.resize(parameters.size());
  const std::string error = ParametersError(parameters, layouts);
  if (!error.empty()) return absl::InvalidArgumentError(error);

  std::vector<OptimizerChild> children;
  try {
    switch (config.family) {
      case OptimizerFamily::kMuon:
      case OptimizerFamily::kSoap: {
        // Expert-stacked parameters are 2-D (ParametersError), so they
        // stay on the matrix optimizer.
        std::vector<torch::Tensor> matrices;
        std::vector<ParamLayout> matrix_layouts;
        std::vector<torch::Tensor> others;
        for (size_t i = 0; i < parameters.size(); ++i) {
          if (parameters[i].dim() == 2) {
            matrices.push_back(parameters[i]);
            matrix_layouts.push_back(layouts[i]);
          } else {
            others.push_back(parameters[i]);
          }
        }
        if (!matrices.empty()) {
          children.push_back(
              config.family == OptimizerFamily::kSoap
                  ? MakeSoapChild(std::move(matrices),
                                  std::move(matrix_layouts), config)
                  : MakeMuonChild(std::move(matrices),
                                  std::move(matrix_layouts), config));
        }
        if (!others.empty()) {
          children.push_back(MakeScalarChild(std::move(others), config));
        }
        break;
      }
      case OptimizerFamily::kLion:
        children.push_back(MakeLionChild(parameters, config));
        break;
      case OptimizerFamily::kAdamW:
        children.push_back(MakeAdamWChild(parameters, config));
        break;
      case OptimizerFamily::kAdam:
        children.push_back(
            MakeAdamFamilyChild<MultiTensorAdam, torch::optim::AdamParamState,
                                torch::optim::AdamOptions>(
                OptimizerChildKind::kAdam, parameters, config));
        break;
    }
    for (OptimizerChild& child : children) child.init_state();
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", e.what_without_backtrace()));
  }
  return SlotOptimizer(config, std::move(parameters), std::move(layouts),
                       std::move(children));
}

SlotOptimizer::SlotOptimizer(OptimizerConfig config,
                             std::vector<torch::Tensor> parameters,
                             std::vector<ParamLayout> layouts,
                             std::vector<OptimizerChild> children)
    : config_(std::move(config)),
      parameters_(std::move(parameters)),
      layouts_(std::move(layouts)),
      children_(std::move(children)) {}

void SlotOptimizer::Step() {
  for (OptimizerChild& child : children_) child.optimizer->step();
}

std::vector<absl::Status> StepSlotOptimizers(
    const std::vector<SlotOptimizer*>& optimizers) {
  std::vector<absl::Status> statuses(optimizers.size());
  auto failed = [](const c10::Error& e) {
    return absl::InternalError(e.what_without_backtrace());
  };
  // Everything but Muon's orthogonalization, per optimizer.
  std::vector<std::vector<MuonPendingUpdate>> pending(optimizers.size());
  for (size_t i = 0; i < optimizers.size(); ++i) {
    try {
      for (OptimizerChild& child : optimizers[i]->children_) {
        if (child.kind == OptimizerChildKind::kMuon) {
          static_cast<Muon&>(*child.optimizer).PrepareStep(pending[i]);
        } else {
          child.optimizer->step();
        }
      }
    } catch (const c10::Error& e) {
      statuses[i] = failed(e);
      pending[i].clear();
    }
  }
  std::vector<MuonPendingUpdate> all;
  for (size_t i = 0; i < optimizers.size(); ++i) {
    for (MuonPendingUpdate& update : pending[i]) {
      update.owner = i;
      all.push_back(std::move(update));
    }
  }
  ApplyMuonUpdates(all, [&](size_t owner, const c10::Error& e) {
    if (statuses[owner].ok()) statuses[owner] = failed(e);
  });
  return statuses;
}

void SlotOptimizer::ZeroGrad() {
  torch::NoGradGuard no_grad;
  for (const torch::Tensor& param : parameters_) {
    if (param.grad().defined()) param.grad().zero_();
  }
}

void SlotOptimizer::ZeroState() {
  for (OptimizerChild& child : children_) child.zero_state();
  SetLr(config_.lr);
}

void SlotOptimizer::SetLr(double lr) {
  empty_lr_ = lr;
  for (OptimizerChild& child : children_) {
    for (auto& group : child.optimizer->param_groups()) {
      group.options().set_lr(lr);
    }
  }
}

absl::Status SlotOptimizer::SetHyperparameters(const OptimizerConfig& config) {
  LORAPLEX_RETURN_IF_ERROR(ValidateOptimizerConfig(config));
  if (config.family != config_.family) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.family: the slot's optimizer is ",
                     OptimizerFamilyName(config_.family), ", not ",
                     OptimizerFamilyName(config.family)));
  }
  if ((config.family == OptimizerFamily::kMuon ||
       config.family == OptimizerFamily::kSoap) &&
      config.scalar_optimizer != config_.scalar_optimizer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.scalar_optimizer: the slot's scalar optimizer is ",
        ScalarOptimizerName(config_.scalar_optimizer), ", not ",
        ScalarOptimizerName(config.scalar_optimizer)));
  }
  if (config.family == OptimizerFamily::kSoap &&
      config.max_precond_dim != config_.max_precond_dim) {
    // It decides the shapes of the state.
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.max_precond_dim: the slot's is ", config_.max_precond_dim,
        " (it shapes the optimizer state), not ", config.max_precond_dim));
  }
  for (OptimizerChild& child : children_) {
    for (auto& group : child.optimizer->param_groups()) {
      torch::optim::OptimizerOptions& options = group.options();
      if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
        adamw->betas({config.beta1, config.beta2})
            .eps(config.eps)
            .weight_decay(config.weight_decay);
      } else if (auto* adam =
                     dynamic_cast<torch::optim::AdamOptions*>(&options)) {
        adam->betas({config.beta1, config.beta2})
            .eps(config.eps)
            .weight_decay(config.weight_decay);
      } else if (auto* lion = dynamic_cast<LionOptions*>(&options)) {
        lion->beta1(config.lion_beta1)
            .beta2(config.lion_beta2)
            .weight_decay(config.weight_decay);
      } else if (auto* soap = dynamic_cast<SoapOptions*>(&options)) {
        *soap = SoapOptionsFromConfig(config);
      } else if (auto* muon = dynamic_cast<MuonOptions*>(&options)) {
        muon->momentum(config.momentum)
            .nesterov(config.nesterov)
            .weight_decay(config.weight_decay);
      }
    }
  }
  config_ = config;
  SetLr(config.lr);
  return absl::OkStatus();
}

double SlotOptimizer::lr() const {
  if (children_.empty()) return empty_lr_;
  return children_.front().optimizer->param_groups().front().options().get_lr();
}

SlotOptimizer EmptySlotOptimizer(const OptimizerConfig& config) {
  SlotOptimizer optimizer(config, {}, {}, {});
  optimizer.empty_lr_ = config.lr;
  return optimizer;
}

void SlotOptimizer::Save(torch::serialize::OutputArchive& archive) const {
  archive.write("version", c10::IValue(kArchiveVersion));
  WriteArchiveEnum(archive, "family", config_.family, kAllOptimizerFamilies);
  archive.write("num_children",
                c10::IValue(static_cast<int64_t>(children_.size())));
  for (size_t i = 0; i < children_.size(); ++i) {
    torch::serialize::OutputArchive child(archive.compilation_unit());
    WriteArchiveEnum(child, "kind", children_[i].kind, kAllOptimizerChildKinds);
    const std::vector<ParamStateRef> states = children_[i].states();
    child.write("num_params", c10::IValue(static_cast<int64_t>(states.size())));
    for (size_t j = 0; j < states.size(); ++j) {
      TORCH_CHECK(states[j].step != nullptr, "optimizer child ", i,
                  " parameter ", j, " has no state");
      torch::serialize::OutputArchive param(archive.compilation_unit());
      param.write("step", c10::IValue(*states[j].step));
      for (const auto& [name, tensor] : states[j].tensors) {
        param.write(name, tensor, /*is_buffer=*/true);
      }
      child.write(absl::StrCat("param", j), param);
    }
    archive.write(absl::StrCat("child", i), child);
  }
}

absl::Status SlotOptimizer::Load(torch::serialize::InputArchive& archive) {
  // Everything is read and checked first; state changes only at the end.
  struct Staged {
    int64_t* step;
    int64_t step_value;
    std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;  // to, from
  };
  std::vector<Staged> staged;
  try {
    const int64_t version = ReadArchiveScalar<int64_t>(archive, "version");
    TORCH_CHECK(version == kArchiveVersion, "archive version ", version,
                " is not supported (expected ", kArchiveVersion, ")");
    const OptimizerFamily family =
        ReadArchiveEnum(archive, "family", kAllOptimizerFamilies);
    TORCH_CHECK(family == config_.family, "archive holds optimizer family ",
                std::string(OptimizerFamilyName(family)), ", this slot uses ",
                std::string(OptimizerFamilyName(config_.family)));
    const int64_t num_children =
        ReadArchiveScalar<int64_t>(archive, "num_children");
    TORCH_CHECK(num_children == static_cast<int64_t>(children_.size()),
                "archive has ", num_children, " optimizer children, this slot ",
                children_.size());
    for (size_t i = 0; i < children_.size(); ++i) {
      torch::serialize::InputArchive child;
      TORCH_CHECK(archive.try_read(absl::StrCat("child", i), child),
                  "archive has no optimizer child ", i);
      const OptimizerChildKind kind =
          ReadArchiveEnum(child, "kind", kAllOptimizerChildKinds);
      TORCH_CHECK(kind == children_[i].kind, "optimizer child ", i, " is ",
                  std::string(OptimizerChildKindName(kind)), ", expected ",
                  std::string(OptimizerChildKindName(children_[i].kind)));
      const std::vector<torch::Tensor> params = ChildParameters(children_[i]);
      const std::vector<ParamStateRef> states = children_[i].states();
      const int64_t num_params =
          ReadArchiveScalar<int64_t>(child, "num_params");
      TORCH_CHECK(num_params == static_cast<int64_t>(params.size()),
                  "optimizer child ", i, " has ", num_params,
                  " parameters in the archive, ", params.size(), " here");
      for (size_t j = 0; j < params.size(); ++j) {
        torch::serialize::InputArchive param;
        TORCH_CHECK(child.try_read(absl::StrCat("param", j), param),
                    "optimizer child ", i, " has no parameter ", j);
        TORCH_CHECK(states[j].step != nullptr, "parameter ", j,
                    " has no state to load into");
        Staged entry{
            states[j].step, ReadArchiveScalar<int64_t>(param, "step"), {}};
        TORCH_CHECK(entry.step_value >= 0, "parameter ", j,
                    ": step is negative");
        for (size_t t = 0; t < states[j].tensors.size(); ++t) {
          const auto& [name, target] = states[j].tensors[t];
          torch::Tensor loaded;
          TORCH_CHECK(param.try_read(name, loaded, /*is_buffer=*/true),
                      "parameter ", j, ": ", name, " is missing");
          TORCH_CHECK(loaded.is_floating_point(), "parameter ", j, ": ", name,
                      " is not a float tensor");
          // Device and dtype may differ (copy_ converts); the shape may not.
          const c10::IntArrayRef shape = ExpectedShape(states[j], t, params[j]);
          TORCH_CHECK(loaded.sizes() == shape, "parameter ", j, ": ", name,
                      " has shape ", ShapeString(loaded.sizes()), ", expected ",
                      ShapeString(shape));
          entry.copies.emplace_back(target, loaded);
        }
        staged.push_back(std::move(entry));
      }
    }
  } catch (const c10::Error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state does not fit this slot: ",
                     e.what_without_backtrace()));
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer state does not fit this slot: ", e.what()));
  }

  torch::NoGradGuard no_grad;
  for (Staged& entry : staged) {
    *entry.step = entry.step_value;
    for (auto& [target, source] : entry.copies) target.copy_(source);
  }
  return absl::OkStatus();
}

}  // namespace loraplex
