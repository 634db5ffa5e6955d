#include "core/optim/muon.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>
#include <torch/utils.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "core/optim/archive_fields.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {

MuonOptions::MuonOptions(double lr) : lr_(lr) {}

double MuonOptions::get_lr() const { return lr(); }

void MuonOptions::set_lr(const double lr) { this->lr(lr); }

NewtonSchulzOptions MuonOptions::newton_schulz() const {
  NewtonSchulzOptions ns;
  ns.coefficient_set = coefficient_set();
  ns.custom_coefficients = custom_coefficients();
  // Out-of-range counts are reported by MuonOptionsError; clamping only
  // keeps the narrowing well defined.
  ns.steps = static_cast<int>(
      std::clamp<int64_t>(ns_steps(), 0, std::numeric_limits<int>::max()));
  ns.precision = precision();
  return ns;
}

void MuonOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("momentum", c10::IValue(momentum()));
  archive.write("nesterov", c10::IValue(nesterov()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  WriteArchiveEnum(archive, "weight_decay_mode", weight_decay_mode(),
                   kAllMuonWeightDecayModes);
  WriteArchiveEnum(archive, "coefficient_set", coefficient_set(),
                   kAllNsCoefficientSets);
  std::vector<double> flat;
  for (const NsCoefficients& t : custom_coefficients()) {
    flat.insert(flat.end(), {t.a, t.b, t.c});
  }
  archive.write("custom_coefficients",
                torch::tensor(flat, torch::kFloat64).reshape({-1, 3}));
  archive.write("ns_steps", c10::IValue(ns_steps()));
  WriteArchiveEnum(archive, "precision", precision(), kAllNsPrecisions);
  WriteArchiveEnum(archive, "scale_mode", scale_mode(), kAllMuonScaleModes);
  archive.write("extra_scale_factor", c10::IValue(extra_scale_factor()));
}

void MuonOptions::serialize(torch::serialize::InputArchive& archive) {
  lr(ReadArchiveScalar<double>(archive, "lr"));
  momentum(ReadArchiveScalar<double>(archive, "momentum"));
  nesterov(ReadArchiveScalar<bool>(archive, "nesterov"));
  weight_decay(ReadArchiveScalar<double>(archive, "weight_decay"));
  weight_decay_mode(
      ReadArchiveEnum(archive, "weight_decay_mode", kAllMuonWeightDecayModes));
  coefficient_set(
      ReadArchiveEnum(archive, "coefficient_set", kAllNsCoefficientSets));
  torch::Tensor flat;
  TORCH_CHECK(archive.try_read("custom_coefficients", flat),
              "archive has no field custom_coefficients");
  flat = flat.to(torch::kFloat64).contiguous();
  TORCH_CHECK(flat.dim() == 2 && flat.size(1) == 3,
              "archive field custom_coefficients must be [k, 3]");
  std::vector<NsCoefficients> custom;
  const double* data = flat.data_ptr<double>();
  for (int64_t i = 0; i < flat.size(0); ++i) {
    custom.push_back({data[3 * i], data[3 * i + 1], data[3 * i + 2]});
  }
  custom_coefficients(std::move(custom));
  ns_steps(ReadArchiveScalar<int64_t>(archive, "ns_steps"));
  precision(ReadArchiveEnum(archive, "precision", kAllNsPrecisions));
  scale_mode(ReadArchiveEnum(archive, "scale_mode", kAllMuonScaleModes));
  extra_scale_factor(ReadArchiveScalar<double>(archive, "extra_scale_factor"));
}

std::string MuonOptionsError(const MuonOptions& options) {
  return MuonSettingsError(options.lr(), options.momentum(),
                           options.weight_decay(), options.extra_scale_factor(),
                           options.ns_steps(), options.newton_schulz());
}

MuonOptions MuonOptionsFromConfig(const OptimizerConfig& config) {
  return MuonOptions(config.lr)
      .momentum(config.momentum)
      .nesterov(config.nesterov)
      .weight_decay(config.weight_decay)
      .weight_decay_mode(config.weight_decay_mode)
      .coefficient_set(config.coefficient_set)
      .custom_coefficients(config.custom_coefficients)
      .ns_steps(config.ns_steps)
      .precision(config.ns_precision)
      .scale_mode(config.scale_mode)
      .extra_scale_factor(config.extra_scale_factor);
}

void MuonParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step()));
  archive.write("momentum_buffer", momentum_buffer(), /*is_buffer=*/true);
}

void MuonParamState::serialize(torch::serialize::InputArchive& archive) {
  c10::IValue value;
  archive.read("step", value);
  step(value.toInt());
  torch::Tensor buffer;
  archive.read("momentum_buffer", buffer, /*is_buffer=*/true);
  momentum_buffer(buffer);
}

Muon::Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
           MuonOptions defaults)
    : torch::optim::Optimizer(std::move(param_groups),
                              std::make_unique<MuonOptions>(defaults)) {
  const std::string default_error = MuonOptionsError(defaults);
  TORCH_CHECK(default_error.empty(), "Muon: ", default_error);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const auto& options =
        static_cast<const MuonOptions&>(param_groups_[g].options());
    const std::string error = MuonOptionsError(options);
    TORCH_CHECK(error.empty(), "Muon: param group ", g, ": ", error);
    const std::vector<torch::Tensor>& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      TORCH_CHECK(params[i].dim() == 2 && params[i].is_floating_point(),
                  "Muon: param group ", g, " parameter ", i, " has shape ",
                  params[i].sizes(), " and dtype ", params[i].scalar_type(),
                  "; Muon takes 2-D float matrices only (give the rest to "
                  "AdamW)");
    }
  }
}

Muon::Muon(std::vector<torch::Tensor> params, MuonOptions defaults)
    : Muon({torch::optim::OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

Muon::Muon(std::vector<torch::Tensor> params, std::vector<ParamLayout> layouts,
           MuonOptions defaults)
    : Muon(params, std::move(defaults)) {
  TORCH_CHECK(layouts.empty() || layouts.size() == params.size(),
              "Muon: ", layouts.size(), " layouts for ", params.size(),
              " parameters");
  for (size_t i = 0; i < layouts.size(); ++i) {
    const std::string error = ParamLayoutError(layouts[i], params[i].sizes());
    TORCH_CHECK(error.empty(), "Muon: parameter ", i, " ", error);
    if (layouts[i].matrices() > 1) {
      layouts_[params[i].unsafeGetTensorImpl()] = layouts[i];
    }
  }
}

ParamLayout Muon::LayoutOf(const torch::Tensor& param) const {
  auto it = layouts_.find(param.unsafeGetTensorImpl());
  return it == layouts_.end() ? ParamLayout{} : it->second;
}

MuonParamState* Muon::StateOf(const torch::Tensor& param) {
  return FindOptimizerState<MuonParamState>(*this, param);
}

MuonParamState& Muon::EnsureState(const torch::Tensor& param) {
  if (MuonParamState* state = StateOf(param)) return *state;
  auto state = std::make_unique<MuonParamState>();
  state->momentum_buffer(
      torch::zeros_like(param, torch::MemoryFormat::Preserve));
  MuonParamState& ref = *state;
  state_[OptimizerStateKeyOf(param)] = std::move(state);
  return ref;
}

void Muon::InitState() {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) EnsureState(param);
  }
}

void Muon::ZeroState() {
  torch::NoGradGuard no_grad;
  for (auto& entry : state_) {
    auto& state = static_cast<MuonParamState&>(*entry.second);
    state.step(0);
    if (state.momentum_buffer().defined()) state.momentum_buffer().zero_();
  }
}

torch::Tensor Muon::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  std::vector<MuonPendingUpdate> pending;
  PrepareStep(pending);
  ApplyMuonUpdates(pending);
  return loss;
}

void Muon::PrepareStep(std::vector<MuonPendingUpdate>& pending) {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) PrepareGroup(group, pending);
}

void Muon::PrepareGroup(torch::optim::OptimizerParamGroup& group,
                        std::vector<MuonPendingUpdate>& pending) {
  const auto& options = static_cast<const MuonOptions&>(group.options());
  const double lr = options.lr();
  const double beta = options.momentum();
  const double wd = options.weight_decay();
  const NewtonSchulzOptions ns = options.newton_schulz();
  // The group's parameters with a gradient, stepped with multi-tensor ops
  // (the per-tensor ops on the CPU; a few fused kernels on a GPU).
  std::vector<torch::Tensor> params;
  std::vector<torch::Tensor> grads;
  std::vector<torch::Tensor> buffers;
  std::vector<MuonParamState*> states;
  for (const torch::Tensor& param : group.params()) {
    if (!param.grad().defined()) continue;
    MuonParamState& state = EnsureState(param);
    params.push_back(param);
    grads.push_back(param.grad());
    buffers.push_back(state.momentum_buffer());
    states.push_back(&state);
  }
  if (params.empty()) return;
  if (wd != 0.0) {
    switch (options.weight_decay_mode()) {
      case MuonWeightDecayMode::kDecoupled:
        at::_foreach_mul_(params, 1.0 - lr * wd);
        break;
      case MuonWeightDecayMode::kIndependent:
        at::_foreach_mul_(params, 1.0 - wd);
        break;
      case MuonWeightDecayMode::kL2:
        grads = at::_foreach_add(grads, params, wd);
        break;
    }
  }
  at::_foreach_mul_(buffers, beta);
  at::_foreach_add_(buffers, grads, 1.0 - beta);
  std::vector<torch::Tensor> updates = buffers;
  if (options.nesterov()) {
    updates = at::_foreach_mul(grads, 1.0 - beta);
    at::_foreach_add_(updates, buffers, beta);
  }
  auto add_pending = [&](const torch::Tensor& param,
                         const torch::Tensor& update) {
    MuonPendingUpdate entry;
    entry.param = param;
    entry.update = update;
    entry.newton_schulz = ns;
    entry.step_scale =
        lr *
        MuonScaleFactor(param.size(0), param.size(1), options.scale_mode()) *
        options.extra_scale_factor();
    pending.push_back(std::move(entry));
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamLayout layout = LayoutOf(params[i]);
    if (layout.matrices() == 1) {
      add_pending(params[i], updates[i]);
    } else {
      // Each expert's matrix on its own (never the concatenation), written
      // back through views into the stacked parameter.
      const std::vector<torch::Tensor> param_matrices =
          MatricesOf(params[i], layout).unbind(0);
      const std::vector<torch::Tensor> update_matrices =
          MatricesOf(updates[i], layout).unbind(0);
      for (size_t e = 0; e < param_matrices.size(); ++e) {
        add_pending(param_matrices[e], update_matrices[e]);
      }
    }
    // Counted after the momentum update, as the per-parameter step did.
    states[i]->step(states[i]->step() + 1);
  }
}

namespace {

// What must be equal for two updates to share a batched Newton–Schulz call.
struct NsBatchKey {
  int64_t rows;
  int64_t cols;
  torch::ScalarType dtype;
  std::string device;
  NsCoefficientSet coefficient_set;
  std::vector<std::array<double, 3>> custom_coefficients;
  int steps;
  NsPrecision precision;

  auto Tied() const {
    return std::tie(rows, cols, dtype, device, coefficient_set,
                    custom_coefficients, steps, precision);
  }
  bool operator<(const NsBatchKey& other) const {
    return Tied() < other.Tied();
  }
};

NsBatchKey BatchKeyOf(const MuonPendingUpdate& update) {
  NsBatchKey key{update.update.size(0),
                 update.update.size(1),
                 update.update.scalar_type(),
                 update.update.device().str(),
                 update.newton_schulz.coefficient_set,
                 {},
                 update.newton_schulz.steps,
                 update.newton_schulz.precision};
  if (key.coefficient_set == NsCoefficientSet::kCustom) {
    for (const NsCoefficients& t : update.newton_schulz.custom_coefficients) {
      key.custom_coefficients.push_back({t.a, t.b, t.c});
    }
  }
  return key;
}

// Orthogonalizes the updates `indices` of `pending` in one batched call and
// applies them; when the call throws, no parameter has moved.
void ApplyBatch(const std::vector<MuonPendingUpdate>& pending,
                const std::vector<size_t>& indices) {
  std::vector<torch::Tensor> same;
  same.reserve(indices.size());
  for (size_t i : indices) same.push_back(pending[i].update);
  // One unbind for the batch, not a select (and a to()) per matrix: a few
  // dispatches per batch instead of thousands per step.
  const std::vector<torch::Tensor> orthogonal =
      NewtonSchulz(at::stack(same), pending[indices.front()].newton_schulz)
          .unbind(0);
  // p -= step_scale · O, one multi-tensor op per step scale (a slot's
  // same-shape matrices share one).
  std::map<std::pair<double, torch::ScalarType>,
           std::pair<std::vector<torch::Tensor>, std::vector<torch::Tensor>>>
      by_scale;
  for (size_t k = 0; k < indices.size(); ++k) {
    const MuonPendingUpdate& update = pending[indices[k]];
    auto& [params, deltas] =
        by_scale[{update.step_scale, update.param.scalar_type()}];
    params.push_back(update.param);
    const torch::Tensor& delta = orthogonal[k];
    deltas.push_back(delta.scalar_type() == update.param.scalar_type()
                         ? delta
                         : delta.to(update.param.scalar_type()));
  }
  for (auto& [scale, lists] : by_scale) {
    at::_foreach_add_(lists.first, lists.second, -scale.first);
  }
}

}  // namespace

void ApplyMuonUpdates(const std::vector<MuonPendingUpdate>& pending,
                      const MuonUpdateFailure& on_failure) {
  torch::NoGradGuard no_grad;
  std::map<NsBatchKey, std::vector<size_t>> groups;
  for (size_t i = 0; i < pending.size(); ++i) {
    groups[BatchKeyOf(pending[i])].push_back(i);
  }
  for (const auto& [key, indices] : groups) {
    const torch::Tensor& first = pending[indices.front()].update;
    const size_t per_batch = static_cast<size_t>(
        NewtonSchulzBatchSize(key.rows, key.cols, first.device()));
    for (size_t begin = 0; begin < indices.size(); begin += per_batch) {
      const std::vector<size_t> batch(
          indices.begin() + begin,
          indices.begin() + std::min(indices.size(), begin + per_batch));
      if (on_failure == nullptr) {
        ApplyBatch(pending, batch);
        continue;
      }
      try {
        ApplyBatch(pending, batch);
        continue;
      } catch (const c10::Error&) {
        // Nothing of this batch moved: retry it owner by owner.
      }
      std::map<size_t, std::vector<size_t>> by_owner;
      for (size_t i : batch) by_owner[pending[i].owner].push_back(i);
      for (const auto& [owner, own] : by_owner) {
        try {
          ApplyBatch(pending, own);
        } catch (const c10::Error& e) {
          on_failure(owner, e);
        }
      }
    }
  }
}

void Muon::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<MuonParamState, MuonOptions>(archive, *this);
}

void Muon::load(torch::serialize::InputArchive& archive) {
  LoadOptimizerKeepingValidOptions<MuonParamState, MuonOptions>(
      *this, archive, &MuonOptionsError, "Muon");
}

}  // namespace loraplex
