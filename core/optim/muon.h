// Muon: momentum SGD whose update is orthogonalized by Newton–Schulz, for 2-D
// weight matrices (NVIDIA Emerging-Optimizers' OrthogonalizedOptimizer/Muon
// semantics; DESIGN.md §4). Per parameter p with gradient g and state
// momentum_buffer:
//   1. weight decay (decoupled: p -= lr·wd·p; independent: p -= wd·p;
//      l2: g += wd·p)
//   2. buf = β·buf + (1−β)·g
//   3. u = nesterov ? (1−β)·g + β·buf : buf
//   4. O = NS(u) · scale(m, n) · extra_scale_factor
//   5. p -= lr·O
// All parameters of a group with equal shape are orthogonalized in one batched
// Newton–Schulz call, which is what keeps many small LoRA matrices cheap.
//
//   Muon muon(params, MuonOptions(0.02).extra_scale_factor(0.2));
//   loss.backward();
//   muon.step();
#ifndef LORAPLEX_CORE_OPTIM_MUON_H_
#define LORAPLEX_CORE_OPTIM_MUON_H_

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/optim/muon_config.h"
#include "core/optim/newton_schulz.h"
#include "core/optim/optimizer_config.h"

namespace loraplex {

// Defaults are Megatron-LM's. loraplex's service default sets
// extra_scale_factor 0.2 (see OptimizerConfig).
struct MuonOptions
    : public torch::optim::OptimizerCloneableOptions<MuonOptions> {
  MuonOptions(double lr = 1e-3);  // NOLINT(runtime/explicit): as LibTorch's.
  TORCH_ARG(double, lr);
  TORCH_ARG(double, momentum) = 0.95;
  TORCH_ARG(bool, nesterov) = false;
  TORCH_ARG(double, weight_decay) = 0.0;
  TORCH_ARG(MuonWeightDecayMode,
            weight_decay_mode) = MuonWeightDecayMode::kDecoupled;
  TORCH_ARG(NsCoefficientSet, coefficient_set) = NsCoefficientSet::kQuintic;
  TORCH_ARG(std::vector<NsCoefficients>, custom_coefficients);
  TORCH_ARG(int64_t, ns_steps) = 5;
  TORCH_ARG(NsPrecision, precision) = NsPrecision::kFp32;
  TORCH_ARG(MuonScaleMode, scale_mode) = MuonScaleMode::kSpectral;
  TORCH_ARG(double, extra_scale_factor) = 1.0;

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
  double get_lr() const override;
  void set_lr(const double lr) override;

  NewtonSchulzOptions newton_schulz() const;
};

// Empty when the options are valid, else "<field> ..., got <value>"
// (MuonSettingsError).
std::string MuonOptionsError(const MuonOptions& options);

// The Muon options a muon-family config implies.
MuonOptions MuonOptionsFromConfig(const OptimizerConfig& config);

struct MuonParamState
    : public torch::optim::OptimizerCloneableParamState<MuonParamState> {
  TORCH_ARG(int64_t, step) = 0;
  TORCH_ARG(torch::Tensor, momentum_buffer);

 public:
  void serialize(torch::serialize::InputArchive& archive) override;
  void serialize(torch::serialize::OutputArchive& archive) const override;
};

class Muon : public torch::optim::Optimizer {
 public:
  // Throws c10::Error naming the bad option or parameter: every group's
  // options are validated and every parameter must be a 2-D float matrix.
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                MuonOptions defaults = {});
  explicit Muon(std::vector<torch::Tensor> params, MuonOptions defaults = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  // LibTorch's optimizer archive format. It keys state by parameter address
  // as LibTorch prints it, which differs between LibTorch 1.x and 2.x, so
  // such archives do not move between them; SlotOptimizer::Save writes a
  // portable one.
  void save(torch::serialize::OutputArchive& archive) const override;
  void load(torch::serialize::InputArchive& archive) override;

  // Creates every parameter's state (zero momentum, step 0) now rather than
  // at its first gradient, so a checkpoint can be saved or loaded at once.
  void InitState();
  // Zeroes every momentum buffer and step counter in place (no
  // reallocation); afterwards the optimizer behaves as a fresh one.
  void ZeroState();

  // The state of `param`, which must belong to this optimizer; nullptr
  // before InitState or its first step.
  MuonParamState* StateOf(const torch::Tensor& param);

 private:
  MuonParamState& EnsureState(const torch::Tensor& param);
  void StepGroup(torch::optim::OptimizerParamGroup& group);
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_MUON_H_
