// Muon: momentum SGD whose update is orthogonalized by Newton–Schulz, for 2-D
// weight matrices (NVIDIA Emerging-Optimizers' OrthogonalizedOptimizer/Muon
// semantics; docs/DESIGN.md §4). Per parameter p with gradient g and state
// momentum_buffer:
//   1. weight decay (decoupled: p -= lr·wd·p; independent: p -= wd·p;
//      l2: g += wd·p)
//   2. buf = β·buf + (1−β)·g
//   3. u = nesterov ? (1−β)·g + β·buf : buf
//   4. O = NS(u) · scale(m, n) · extra_scale_factor
//   5. p -= lr·O
// All parameters with equal shape and Newton–Schulz settings are
// orthogonalized in one batched Newton–Schulz call, which is what keeps many
// small LoRA matrices cheap. A parameter that stacks one matrix per expert
// (ParamLayout, a mixture-of-experts LoRA) is E matrices to steps 4–5, each
// with its own scale(m, n), batched with every other matrix of its shape;
// steps 1–3 stay elementwise on the whole parameter. Many optimizers (one per
// adapter slot) can share those calls: PrepareStep runs steps 1–3 of each, and
// one ApplyMuonUpdates over all their pending updates runs steps 4–5.
//
//   Muon muon(params, MuonOptions(0.02).extra_scale_factor(0.2));
//   loss.backward();
//   muon.step();
//
//   std::vector<MuonPendingUpdate> pending;
//   for (Muon* m : slot_muons) m->PrepareStep(pending);
//   ApplyMuonUpdates(pending);  // Same result as each m->step().
#ifndef LORAPLEX_CORE_OPTIM_MUON_H_
#define LORAPLEX_CORE_OPTIM_MUON_H_

#include <torch/arg.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "core/optim/muon_config.h"
#include "core/optim/newton_schulz.h"
#include "core/optim/optimizer_config.h"
#include "core/optim/param_layout.h"

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

// One parameter after steps 1–3 of a Muon step, waiting for steps 4–5.
struct MuonPendingUpdate {
  // The matrix to update: the parameter, or a view of one expert's matrix
  // in it (strided for ParamLayout's kColumns).
  torch::Tensor param;
  torch::Tensor update;  // u, the Newton–Schulz input, shaped as param.
  NewtonSchulzOptions newton_schulz;
  // lr · scale(m, n) · extra_scale_factor of the parameter's group, m×n the
  // matrix's shape.
  double step_scale = 0.0;
  // Whose update this is (e.g. the index of a slot), for failure reports.
  size_t owner = 0;
};

// Called with the owner of updates whose orthogonalization failed.
using MuonUpdateFailure =
    std::function<void(size_t owner, const c10::Error& error)>;

// Steps 4–5 for every pending update: p -= step_scale · NS(u). Updates with
// equal shape, dtype, device and Newton–Schulz settings share batched
// Newton–Schulz calls (as many matrices per call as NewtonSchulzBatchSize
// says), whichever optimizer they come from; the result equals
// orthogonalizing each alone. Without `on_failure` an error is thrown.
// With it, a batch that fails is retried owner by owner, and an owner whose
// own batch fails is reported (its parameters may be partly updated) while
// every other owner's updates are applied.
void ApplyMuonUpdates(const std::vector<MuonPendingUpdate>& pending,
                      const MuonUpdateFailure& on_failure = nullptr);

class Muon : public torch::optim::Optimizer {
 public:
  // Throws c10::Error naming the bad option or parameter: every group's
  // options are validated and every parameter must be a 2-D float matrix.
  explicit Muon(std::vector<torch::optim::OptimizerParamGroup> param_groups,
                MuonOptions defaults = {});
  explicit Muon(std::vector<torch::Tensor> params, MuonOptions defaults = {});
  // `layouts[i]` says which matrices params[i] holds (empty: every parameter
  // is one matrix); a layout that does not fit its parameter throws.
  Muon(std::vector<torch::Tensor> params, std::vector<ParamLayout> layouts,
       MuonOptions defaults = {});

  // PrepareStep followed by ApplyMuonUpdates.
  torch::Tensor step(LossClosure closure = nullptr) override;
  // Steps 1–3 (weight decay, momentum, step counter) of every parameter that
  // has a gradient; appends what steps 4–5 need to `pending`. The parameters
  // are complete after ApplyMuonUpdates(pending).
  void PrepareStep(std::vector<MuonPendingUpdate>& pending);
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
  // The layout `param` was given (one matrix when none was).
  ParamLayout LayoutOf(const torch::Tensor& param) const;

 private:
  MuonParamState& EnsureState(const torch::Tensor& param);
  void PrepareGroup(torch::optim::OptimizerParamGroup& group,
                    std::vector<MuonPendingUpdate>& pending);

  // The parameters that stack several matrices, by TensorImpl.
  std::map<const void*, ParamLayout> layouts_;
};

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_MUON_H_
