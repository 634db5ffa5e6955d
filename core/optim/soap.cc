#include "core/optim/soap.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/optim/serialize.h>

#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/optim/archive_fields.h"
#include "core/runtime/torch_compat.h"

namespace loraplex {
namespace {

// float32 as the reference, float64 state for float64 parameters.
torch::ScalarType StateTypeOf(const torch::Tensor& param) {
  return param.scalar_type() == torch::kFloat64 ? torch::kFloat64
                                                : torch::kFloat32;
}

std::string MatrixError(const torch::Tensor& param) {
  if (param.dim() == 2) return "";
  return absl::StrCat(
      "SOAP takes 2-D parameters only (use AdamW or Lion for the others), "
      "got one with ",
      param.dim(), " dimensions");
}

// Each contraction is the reference's tensordot over the first dimension:
// into the eigenbasis (Qᵀ·x·Q) with `into`, back (Q·x·Qᵀ) without. The same
// call as the reference's keeps the same rounding.
// A side without a basis (0×0, not preconditioned) only moves x's first
// dimension last, as the contraction would.
torch::Tensor Project(torch::Tensor x, const torch::Tensor& left,
                      const torch::Tensor& right, bool into) {
  const std::vector<int64_t> x_dim = {0};
  const std::vector<int64_t> q_dim = {into ? 0 : 1};
  for (const torch::Tensor* basis : {&left, &right}) {
    x = basis->numel() == 0 ? x.t() : at::tensordot(x, *basis, x_dim, q_dim);
  }
  return x;
}

// One matrix's views of its parameter, gradient and state.
struct MatrixViews {
  torch::Tensor param;
  torch::Tensor grad;
  torch::Tensor exp_avg;
  torch::Tensor exp_avg_sq;
  std::array<torch::Tensor, 2> factors;  // L, R.
  std::array<torch::Tensor, 2> bases;    // Q_L, Q_R.
};

// Eigenvectors of a symmetric matrix, columns by descending eigenvalue; in
// float64 if the factor's own precision fails (the reference's fallback).
torch::Tensor EigenbasisEigh(const torch::Tensor& factor) {
  torch::Tensor vectors;
  try {
    vectors = std::get<1>(at::linalg_eigh(factor));
  } catch (const c10::Error&) {
    if (factor.scalar_type() == torch::kFloat64) throw;
    vectors = std::get<1>(at::linalg_eigh(factor.to(torch::kFloat64)))
                  .to(factor.scalar_type());
  }
  return at::flip(vectors, {-1});
}

// diag(Qᵀ·K·Q), as the reference's conjugate(diag=True).
torch::Tensor ApproximateEigenvalues(const torch::Tensor& factor,
                                     const torch::Tensor& basis) {
  const torch::Tensor basis_t = basis.t();
  return (at::matmul(basis_t, factor) * basis_t).sum(1);
}

}  // namespace

SoapOptions::SoapOptions(double lr) : lr_(lr) {}

double SoapOptions::get_lr() const { return lr(); }

void SoapOptions::set_lr(const double lr) { this->lr(lr); }

void SoapOptions::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("lr", c10::IValue(lr()));
  archive.write("beta1", c10::IValue(beta1()));
  archive.write("beta2", c10::IValue(beta2()));
  archive.write("shampoo_beta", c10::IValue(shampoo_beta()));
  archive.write("eps", c10::IValue(eps()));
  archive.write("weight_decay", c10::IValue(weight_decay()));
  archive.write("nesterov", c10::IValue(nesterov()));
  archive.write("correct_bias", c10::IValue(correct_bias()));
  archive.write("correct_shampoo_beta_bias",
                c10::IValue(correct_shampoo_beta_bias()));
  archive.write("use_eigh", c10::IValue(use_eigh()));
  archive.write("power_iter_steps", c10::IValue(power_iter_steps()));
  archive.write("max_update_rms", c10::IValue(max_update_rms()));
  archive.write("precondition_frequency",
                c10::IValue(precondition_frequency()));
  archive.write("max_precond_dim", c10::IValue(max_precond_dim()));
}

void SoapOptions::serialize(torch::serialize::InputArchive& archive) {
  lr(ReadArchiveScalar<double>(archive, "lr"));
  beta1(ReadArchiveScalar<double>(archive, "beta1"));
  beta2(ReadArchiveScalar<double>(archive, "beta2"));
  shampoo_beta(ReadArchiveScalar<double>(archive, "shampoo_beta"));
  eps(ReadArchiveScalar<double>(archive, "eps"));
  weight_decay(ReadArchiveScalar<double>(archive, "weight_decay"));
  nesterov(ReadArchiveScalar<bool>(archive, "nesterov"));
  correct_bias(ReadArchiveScalar<bool>(archive, "correct_bias"));
  correct_shampoo_beta_bias(
      ReadArchiveScalar<bool>(archive, "correct_shampoo_beta_bias"));
  use_eigh(ReadArchiveScalar<bool>(archive, "use_eigh"));
  power_iter_steps(ReadArchiveScalar<int64_t>(archive, "power_iter_steps"));
  max_update_rms(ReadArchiveScalar<double>(archive, "max_update_rms"));
  precondition_frequency(
      ReadArchiveScalar<int64_t>(archive, "precondition_frequency"));
  max_precond_dim(ReadArchiveScalar<int64_t>(archive, "max_precond_dim"));
}

std::string SoapOptionsError(const SoapOptions& options) {
  // The reference checks none of these; the ranges are where its formulas
  // are defined. NaN fails every comparison.
  if (!(options.lr() >= 0.0)) {
    return absl::StrCat("lr must be >= 0, got ", options.lr());
  }
  if (!(options.beta1() >= 0.0 && options.beta1() < 1.0)) {
    return absl::StrCat("beta1 must be in [0, 1), got ", options.beta1());
  }
  if (!(options.beta2() >= 0.0 && options.beta2() < 1.0)) {
    return absl::StrCat("beta2 must be in [0, 1), got ", options.beta2());
  }
  if (!(options.shampoo_beta() >= 0.0 && options.shampoo_beta() < 1.0)) {
    return absl::StrCat("shampoo_beta must be in [0, 1), got ",
                        options.shampoo_beta());
  }
  if (!(options.eps() >= 0.0)) {
    return absl::StrCat("eps must be >= 0, got ", options.eps());
  }
  if (!(options.weight_decay() >= 0.0)) {
    return absl::StrCat("weight_decay must be >= 0, got ",
                        options.weight_decay());
  }
  if (options.precondition_frequency() < 1) {
    return absl::StrCat("precondition_frequency must be >= 1, got ",
                        options.precondition_frequency());
  }
  if (options.max_precond_dim() < 0) {
    return absl::StrCat("max_precond_dim must be >= 0 (0: no limit), got ",
                        options.max_precond_dim());
  }
  if (options.power_iter_steps() < 0) {
    return absl::StrCat("power_iter_steps must be >= 0, got ",
                        options.power_iter_steps());
  }
  if (!(options.max_update_rms() >= 0.0)) {
    return absl::StrCat("max_update_rms must be >= 0 (0: no clipping), got ",
                        options.max_update_rms());
  }
  return "";
}

void SoapParamState::serialize(torch::serialize::OutputArchive& archive) const {
  archive.write("step", c10::IValue(step()));
  archive.write("exp_avg", exp_avg(), /*is_buffer=*/true);
  archive.write("exp_avg_sq", exp_avg_sq(), /*is_buffer=*/true);
  archive.write("kronecker_left", kronecker_left(), /*is_buffer=*/true);
  archive.write("kronecker_right", kronecker_right(), /*is_buffer=*/true);
  archive.write("eigenbasis_left", eigenbasis_left(), /*is_buffer=*/true);
  archive.write("eigenbasis_right", eigenbasis_right(), /*is_buffer=*/true);
}

void SoapParamState::serialize(torch::serialize::InputArchive& archive) {
  step(ReadArchiveScalar<int64_t>(archive, "step"));
  const auto read = [&archive](const char* key) {
    torch::Tensor buffer;
    archive.read(key, buffer, /*is_buffer=*/true);
    return buffer;
  };
  exp_avg(read("exp_avg"));
  exp_avg_sq(read("exp_avg_sq"));
  kronecker_left(read("kronecker_left"));
  kronecker_right(read("kronecker_right"));
  eigenbasis_left(read("eigenbasis_left"));
  eigenbasis_right(read("eigenbasis_right"));
}

Soap::Soap(std::vector<torch::optim::OptimizerParamGroup> param_groups,
           SoapOptions defaults)
    : torch::optim::Optimizer(std::move(param_groups),
                              std::make_unique<SoapOptions>(defaults)) {
  const std::string default_error = SoapOptionsError(defaults);
  TORCH_CHECK(default_error.empty(), "Soap: ", default_error);
  for (size_t g = 0; g < param_groups_.size(); ++g) {
    const std::string error = SoapOptionsError(
        static_cast<const SoapOptions&>(param_groups_[g].options()));
    TORCH_CHECK(error.empty(), "Soap: param group ", g, ": ", error);
    const auto& params = param_groups_[g].params();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string shape_error = MatrixError(params[i]);
      TORCH_CHECK(shape_error.empty(), "Soap: param group ", g, ", parameter ",
                  i, ": ", shape_error);
    }
  }
}

Soap::Soap(std::vector<torch::Tensor> params, SoapOptions defaults)
    : Soap({torch::optim::OptimizerParamGroup(std::move(params))},
           std::move(defaults)) {}

Soap::Soap(std::vector<torch::Tensor> params, std::vector<ParamLayout> layouts,
           SoapOptions defaults)
    : Soap(params, std::move(defaults)) {
  TORCH_CHECK(layouts.empty() || layouts.size() == params.size(),
              "Soap: ", layouts.size(), " layouts for ", params.size(),
              " parameters");
  for (size_t i = 0; i < layouts.size(); ++i) {
    const std::string error = ParamLayoutError(layouts[i], params[i].sizes());
    TORCH_CHECK(error.empty(), "Soap: parameter ", i, " ", error);
    if (layouts[i].matrices() > 1) {
      layouts_[params[i].unsafeGetTensorImpl()] = layouts[i];
    }
  }
}

ParamLayout Soap::LayoutOf(const torch::Tensor& param) const {
  auto it = layouts_.find(param.unsafeGetTensorImpl());
  return it == layouts_.end() ? ParamLayout{} : it->second;
}

SoapParamState* Soap::StateOf(const torch::Tensor& param) {
  return FindOptimizerState<SoapParamState>(*this, param);
}

std::vector<std::vector<int64_t>> Soap::StateShapes(
    const torch::Tensor& param) const {
  const ParamLayout layout = LayoutOf(param);
  const auto [rows, cols] = MatrixShapeOf(layout, param.sizes());
  // Every parameter group shares the limit (the factory makes one group).
  const int64_t limit =
      static_cast<const SoapOptions&>(param_groups_.front().options())
          .max_precond_dim();
  // [E] first for a stacked parameter; a plain one's state is 2-D.
  const auto square = [&](int64_t size) {
    const int64_t side = limit > 0 && size > limit ? 0 : size;
    std::vector<int64_t> shape = {side, side};
    if (layout.matrices() > 1) shape.insert(shape.begin(), layout.matrices());
    return shape;
  };
  const std::vector<int64_t> moments(param.sizes().begin(),
                                     param.sizes().end());
  return {moments,      moments,      square(rows),
          square(cols), square(rows), square(cols)};
}

SoapParamState& Soap::EnsureState(const torch::Tensor& param) {
  if (SoapParamState* state = StateOf(param)) return *state;
  const std::string shape_error = MatrixError(param);
  TORCH_CHECK(shape_error.empty(), "Soap: ", shape_error);
  const auto options =
      torch::TensorOptions().dtype(StateTypeOf(param)).device(param.device());
  const std::vector<std::vector<int64_t>> shapes = StateShapes(param);
  const auto identity = [&](const std::vector<int64_t>& shape) {
    return torch::eye(shape.back(), options).expand(shape).contiguous();
  };
  auto state = std::make_unique<SoapParamState>();
  state->exp_avg(torch::zeros(shapes[0], options));
  state->exp_avg_sq(torch::zeros(shapes[1], options));
  state->kronecker_left(torch::zeros(shapes[2], options));
  state->kronecker_right(torch::zeros(shapes[3], options));
  state->eigenbasis_left(identity(shapes[4]));
  state->eigenbasis_right(identity(shapes[5]));
  SoapParamState& ref = *state;
  state_[OptimizerStateKeyOf(param)] = std::move(state);
  return ref;
}

void Soap::InitState() {
  torch::NoGradGuard no_grad;
  for (auto& group : param_groups_) {
    for (const torch::Tensor& param : group.params()) EnsureState(param);
  }
}

void Soap::ZeroState() {
  torch::NoGradGuard no_grad;
  for (auto& entry : state_) {
    auto& state = static_cast<SoapParamState&>(*entry.second);
    state.step(0);
    for (torch::Tensor* zeroed :
         {&state.exp_avg(), &state.exp_avg_sq(), &state.kronecker_left(),
          &state.kronecker_right()}) {
      if (zeroed->defined()) zeroed->zero_();
    }
    for (torch::Tensor* basis :
         {&state.eigenbasis_left(), &state.eigenbasis_right()}) {
      if (!basis->defined()) continue;
      basis->zero_();
      basis->diagonal(0, -2, -1).fill_(1.0);
    }
  }
}

namespace {

// One step of one matrix (each operation is the reference's, in its order,
// so that float32 runs round as it does). `iteration` is 1-based.
void StepMatrix(MatrixViews& m, const SoapOptions& options, int64_t iteration,
                bool refresh, bool use_eigh) {
  const double lr = options.lr();
  const double beta1 = options.beta1();
  const double beta2 = options.beta2();
  const torch::Tensor& grad = m.grad;
  double shampoo_beta = options.shampoo_beta();
  if (options.correct_shampoo_beta_bias()) {
    shampoo_beta = 1.0 - (1.0 - shampoo_beta) /
                             (1.0 - std::pow(shampoo_beta,
                                             static_cast<double>(iteration)));
  }
  if (m.factors[0].numel() > 0) {
    m.factors[0].lerp_(at::matmul(grad, grad.t()), 1.0 - shampoo_beta);
  }
  if (m.factors[1].numel() > 0) {
    m.factors[1].lerp_(at::matmul(grad.t(), grad), 1.0 - shampoo_beta);
  }

  if (refresh) {
    // Momentum back to the parameter's basis, bases sorted (second moment
    // permuted with them), new bases, momentum into them.
    const torch::Tensor momentum =
        Project(m.exp_avg, m.bases[0], m.bases[1], /*into=*/false);
    torch::Tensor second_moment = m.exp_avg_sq;
    std::array<torch::Tensor, 2> new_bases;
    for (int64_t side = 0; side < 2; ++side) {
      const torch::Tensor& factor = m.factors[side];
      if (factor.numel() == 0) continue;
      const torch::Tensor order =
          at::argsort(ApproximateEigenvalues(factor, m.bases[side]),
                      /*dim=*/-1, /*descending=*/true);
      second_moment = second_moment.index_select(side, order);
      if (use_eigh) {
        new_bases[side] = EigenbasisEigh(factor);
      } else {
        torch::Tensor basis = m.bases[side].index_select(1, order);
        for (int64_t i = 0; i < options.power_iter_steps(); ++i) {
          basis = std::get<0>(at::linalg_qr(at::matmul(factor, basis)));
        }
        new_bases[side] = basis;
      }
    }
    for (int64_t side = 0; side < 2; ++side) {
      if (new_bases[side].defined()) m.bases[side].copy_(new_bases[side]);
    }
    m.exp_avg.copy_(Project(momentum, m.bases[0], m.bases[1], /*into=*/true));
    m.exp_avg_sq.copy_(second_moment);
  }

  if (options.weight_decay() != 0.0) {
    m.param.add_(m.param, -options.weight_decay() * lr);
  }

  // Adam in the eigenbasis (Emerging-Optimizers' calculate_adam_update).
  const torch::Tensor projected =
      Project(grad, m.bases[0], m.bases[1], /*into=*/true);
  m.exp_avg.lerp_(projected, 1.0 - beta1);
  m.exp_avg_sq.lerp_(projected.square(), 1.0 - beta2);
  double bias_correction1 = 1.0;
  double bias_correction2 = 1.0;
  if (options.correct_bias()) {
    bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(iteration));
    bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(iteration));
  }
  torch::Tensor numerator;
  if (options.nesterov()) {
    const double bias_correction_nesterov =
        options.correct_bias()
            ? 1.0 - std::pow(beta1, static_cast<double>(iteration + 1))
            : 1.0;
    numerator = beta1 * m.exp_avg / bias_correction_nesterov +
                (1.0 - beta1) * projected / bias_correction1;
  } else {
    numerator = m.exp_avg / bias_correction1;
  }
  const torch::Tensor denominator =
      (m.exp_avg_sq / bias_correction2).sqrt() + options.eps();
  const torch::Tensor adam_update = numerator / denominator;

  torch::Tensor update =
      Project(adam_update, m.bases[0], m.bases[1], /*into=*/false);
  if (options.max_update_rms() != 0.0) {
    // min(1, max_rms/(rms + 1e-7)); `float / tensor` is reciprocal()·float
    // in PyTorch.
    const torch::Tensor rms = update.square().mean().sqrt();
    const torch::Tensor scale =
        ((rms + 1e-7).reciprocal() * options.max_update_rms()).clamp_max(1.0);
    update.mul_(scale);
  }
  m.param.add_(update, -lr);
}

}  // namespace

torch::Tensor Soap::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss = {};
  if (closure != nullptr) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const SoapOptions&>(group.options());
    for (torch::Tensor& param : group.params()) {
      if (!param.grad().defined()) continue;
      SoapParamState& state = EnsureState(param);
      const int64_t iteration = state.step() + 1;  // 1-based.
      const bool refresh = state.step() % options.precondition_frequency() == 0;
      const bool use_eigh = options.use_eigh() || state.step() == 0;
      const torch::Tensor grad = param.grad().to(StateTypeOf(param));
      const ParamLayout layout = LayoutOf(param);
      if (layout.matrices() == 1) {
        MatrixViews m{param,
                      grad,
                      state.exp_avg(),
                      state.exp_avg_sq(),
                      {state.kronecker_left(), state.kronecker_right()},
                      {state.eigenbasis_left(), state.eigenbasis_right()}};
        StepMatrix(m, options, iteration, refresh, use_eigh);
      } else {
        const auto views = [&layout](const torch::Tensor& t) {
          return MatricesOf(t, layout);
        };
        const torch::Tensor params = views(param);
        const torch::Tensor grads = views(grad);
        const torch::Tensor exp_avgs = views(state.exp_avg());
        const torch::Tensor exp_avg_sqs = views(state.exp_avg_sq());
        for (int64_t e = 0; e < layout.matrices(); ++e) {
          // Contiguous copies of strided (column-stacked) matrices, written
          // back after: the step then rounds as it does on a plain matrix.
          MatrixViews m{
              params[e].contiguous(),
              grads[e].contiguous(),
              exp_avgs[e].contiguous(),
              exp_avg_sqs[e].contiguous(),
              {state.kronecker_left()[e], state.kronecker_right()[e]},
              {state.eigenbasis_left()[e], state.eigenbasis_right()[e]}};
          StepMatrix(m, options, iteration, refresh, use_eigh);
          for (auto [to, from] : {std::pair{params[e], m.param},
                                  std::pair{exp_avgs[e], m.exp_avg},
                                  std::pair{exp_avg_sqs[e], m.exp_avg_sq}}) {
            if (!to.is_same(from)) to.copy_(from);
          }
        }
      }
      state.step(iteration);
    }
  }
  return loss;
}

void Soap::save(torch::serialize::OutputArchive& archive) const {
  torch::optim::serialize<SoapParamState, SoapOptions>(archive, *this);
}

void Soap::load(torch::serialize::InputArchive& archive) {
  LoadOptimizerKeepingValidOptions<SoapParamState, SoapOptions>(
      *this, archive, &SoapOptionsError, "Soap");
}

}  // namespace loraplex
