// SOAP (Vyas et al., "SOAP: Improving and Stabilizing Shampoo using Adam",
// arXiv:2409.11321) as NVIDIA Emerging-Optimizers 0.3.0 defines it
// (emerging_optimizers.soap.SOAP, decoupled weight decay, no KL-Shampoo).
// For 2-D parameters only (LoRA A and B); other shapes are rejected. A
// parameter may hold one matrix per expert (ParamLayout, as a mixture-of-
// experts LoRA stacks them): each is stepped as its own matrix with its own
// factors and bases ([E, m, m] state then). Per
// matrix p (m×n) with gradient g, step t (1-based), state: Kronecker
// factors L (m×m) and R (n×n) (zeros), their eigenbases Q_L, Q_R
// (identity), Adam moments exp_avg, exp_avg_sq (m×n, zeros, kept in the
// eigenbasis):
//   1. β_s = shampoo_beta, bias-corrected if correct_shampoo_beta_bias:
//      β_s ← 1 − (1 − β_s)/(1 − β_s^t); L ← lerp(L, g·gᵀ, 1 − β_s),
//      R ← lerp(R, gᵀ·g, 1 − β_s)
//   2. refresh the eigenbasis (at step 1, then every precondition_frequency
//      steps: when (t − 1) is a multiple of it): exp_avg ← Q_L·exp_avg·Q_Rᵀ;
//      sort the columns of Q_L, Q_R by descending diag(QᵀKQ) (K = L, R)
//      and permute exp_avg_sq's rows and columns alike; then Q ← eigh(K)
//      (eigenvalues descending; always at the first step, or with
//      use_eigh) or power_iter_steps rounds of Q ← qr(K·Q).Q; exp_avg ←
//      Q_Lᵀ·exp_avg·Q_R in the new basis
//   3. p ← p − lr·wd·p                     (decoupled weight decay)
//   4. g̃ = Q_Lᵀ·g·Q_R; Adam on g̃: exp_avg ← lerp(exp_avg, g̃, 1 − β1),
//      exp_avg_sq ← lerp(exp_avg_sq, g̃², 1 − β2), u = m̂/(√v̂ + eps) with
//      bias correction if correct_bias (Nesterov optional)
//   5. U = Q_L·u·Q_Rᵀ, scaled to RMS ≤ max_update_rms if that is > 0;
//      p ← p − lr·U
// State and arithmetic are float32 (the reference's, whatever the
// parameter's dtype), except for float64 parameters, which keep float64
// state: the reference casts to float32 internally, and float64 is what
// lets the tests compare with its algorithm tightly. The reference runs its
// matmuls at float32 matmul precision "high" (TF32 on CUDA); these run at
// the process's setting (full float32 unless TF32 is enabled). Emerging-
// Optimizers 0.3.0 has no precondition frequency (the basis is refreshed at
// every step, precondition_frequency 1 here) and preconditions every side;
// max_precond_dim (Vyas et al.'s SOAP) leaves a side longer than it
// unpreconditioned: its factor and basis are 0×0 and projections only
// transpose across it.
//
//   Soap soap(lora_matrices, SoapOptions(3e-4).weight_decay(0.01));
//   loss.backward();
//   soap.step();
#ifndef LORAPLEX_CORE_OPTIM_SOAP_H_
#define LORAPLEX_CORE_OPTIM_SOAP_H_

#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "core/optim/param_layout.h"

namespace loraplex {

// Defaults are Emerging-Optimizers' (which has no default lr; 1e-4 as the
// other loraplex optimizers). correct_shampoo_beta_bias defaults, like the
// reference's, to correct_bias's default.
struct SoapOptions
    : public torch::optim::OptimizerCloneableOptions<SoapOptions> {
  SoapOptions(double lr = 1e-4);  // NOLINT(runtime/explicit): as LibTorch's.
  TORCH_ARG(double, lr);
  TORCH_ARG(double, beta1) = 0.9;
  TORCH_ARG(double, beta2) = 0.95;
  TORCH_ARG(double, shampoo_beta) = 0.95;
  TORCH_ARG(double, eps) = 1e-8;
  TORCH_ARG(double, weight_decay) = 0.01;
  TORCH_ARG(bool, nesterov) = false;
  TORCH_ARG(bool, correct_bias) = true;
  TORCH_ARG(bool, correct_shampoo_beta_bias) = true;
  // Full eigendecomposition at every step instead of orthogonal iteration
  // (the first step always uses it).
  TORCH_ARG(bool, use_eigh) = false;
  TORCH_ARG(int64_t, power_iter_steps) = 1;
  // 0: no clipping.
  TORCH_ARG(double, max_update_rms) = 0.0;
  // 1: refresh the eigenbases at every step.
  TORCH_ARG(int64_t, precondition_frequency) = 1;
  // Sides longer than this are not preconditioned; 0: every side is.
  TORCH_ARG(int64_t, max_precond_dim) = 0;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;
};

// Empty when the options are valid, else "<field> must be ..., got <value>".
std::string SoapOptionsError(const SoapOptions& options);

struct SoapParamState
    : public torch::optim::OptimizerCloneableParamState<SoapParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, exp_avg);
  TORCH_ARG(torch::Tensor, exp_avg_sq);
  // [m, m] (L, Q_L) and [n, n] (R, Q_R), with a leading [E] for a
  // parameter of E stacked matrices; 0×0 for a side not preconditioned.
  TORCH_ARG(torch::Tensor, kronecker_left);    // L
  TORCH_ARG(torch::Tensor, kronecker_right);   // R
  TORCH_ARG(torch::Tensor, eigenbasis_left);   // Q_L
  TORCH_ARG(torch::Tensor, eigenbasis_right);  // Q_R

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Soap : public torch::optim::Optimizer {
 public:
  // Throws c10::Error naming the bad option or the parameter that is not a
  // matrix: every group's options and parameters are checked.
  explicit Soap(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                SoapOptions defaults = {});
  explicit Soap(std::vector<torch::Tensor> params, SoapOptions defaults = {});
  // `layouts[i]` says which matrices params[i] holds (empty: every
  // parameter is one matrix); a layout that does not fit throws.
  Soap(std::vector<torch::Tensor> params, std::vector<ParamLayout> layouts,
       SoapOptions defaults);
  torch::Tensor step(LossClosure closure = nullptr) override;
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;
  // Creates every parameter's state (zero moments and factors, identity
  // eigenbases, step 0) now rather than at its first gradient, so a
  // checkpoint can be saved or loaded at once.
  void InitState();
  // Resets every state in place (no reallocation) to its initial values;
  // afterwards the optimizer behaves as a fresh one.
  void ZeroState();
  // The state of `param`, which must belong to this optimizer; nullptr
  // before InitState or its first step.
  SoapParamState* StateOf(const torch::Tensor& param);
  // The layout `param` was given (one matrix when none was).
  ParamLayout LayoutOf(const torch::Tensor& param) const;
  // The shapes of `param`'s state tensors in SoapParamState's order
  // (exp_avg, exp_avg_sq, kronecker_left, kronecker_right, eigenbasis_left,
  // eigenbasis_right), as InitState creates them.
  std::vector<std::vector<int64_t>> StateShapes(
      const torch::Tensor& param) const;

 private:
  SoapParamState& EnsureState(const torch::Tensor& param);

  std::map<const void*, ParamLayout> layouts_;  // Only stacked ones.
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_SOAP_H_
