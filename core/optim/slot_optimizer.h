// The optimizer of one adapter slot: the factory that routes a slot's
// parameters to family-matched children, and the operations the slot
// lifecycle needs (eager state, in-place reset on retire, save/load).
//
//   LORAPLEX_ASSIGN_OR_RETURN(
//       SlotOptimizer optimizer,
//       BuildSlotOptimizer(config, weights.parameters(),
//                          weights.parameter_layouts()));
//   ... backward ...
//   optimizer.Step();
//   optimizer.ZeroGrad();
//   ... on retire ...
//   optimizer.ZeroState();  // The next job starts from zero moments.
#ifndef LORAPLEX_CORE_OPTIM_SLOT_OPTIMIZER_H_
#define LORAPLEX_CORE_OPTIM_SLOT_OPTIMIZER_H_

#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "core/optim/optimizer_config.h"
#include "core/optim/param_layout.h"

namespace loraplex {

enum class OptimizerChildKind {
  kMuon,   // core/optim/muon.h, 2-D matrices of the muon family.
  kAdamW,  // torch::optim::AdamW.
  kAdam,   // torch::optim::Adam.
  kLion,   // core/optim/lion.h: the lion family, or a scalar child.
  kSoap,   // core/optim/soap.h, 2-D matrices of the soap family.
};

absl::string_view OptimizerChildKindName(OptimizerChildKind kind);

// One parameter's optimizer state: its step counter and named tensors
// (Muon: momentum_buffer; Adam/AdamW: exp_avg, exp_avg_sq; Lion: exp_avg;
// SOAP: exp_avg, exp_avg_sq, kronecker_left/right, eigenbasis_left/right),
// referring to the optimizer's own storage. Tensors have the parameter's
// shape, except SOAP's factors and bases (`shapes`).
struct ParamStateRef {
  int64_t* step = nullptr;  // nullptr when the parameter has no state yet.
  std::vector<std::pair<const char*, torch::Tensor>> tensors;
  // Each of `tensors`' expected shape: empty (or `shapes` shorter than
  // `tensors`) for the parameter's own.
  std::vector<std::vector<int64_t>> shapes;
};

// One optimizer over a subset of the slot's parameters.
struct OptimizerChild {
  OptimizerChildKind kind;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  // Creates the complete state of every parameter (zeros, step 0) now.
  std::function<void()> init_state;
  // Resets every moment, momentum buffer and step counter in place (SOAP's
  // eigenbases to the identity).
  std::function<void()> zero_state;
  // Every parameter's state, in the optimizer's parameter order.
  std::function<std::vector<ParamStateRef>()> states;
};

// Empty when every parameter of `child` has complete state with its own
// shape, dtype and device, else what is wrong ("parameter 3: exp_avg has
// shape [4, 8], expected [8, 4]").
std::string OptimizerChildStateError(const OptimizerChild& child);

class SlotOptimizer {
 public:
  SlotOptimizer(SlotOptimizer&&) = default;
  SlotOptimizer& operator=(SlotOptimizer&&) = default;

  // Steps every child. Parameters without a gradient are left alone.
  void Step();
  // Zeroes the gradients in place (keeping their storage).
  void ZeroGrad();
  // Resets all optimizer state in place and the learning rate to the
  // config's: afterwards the optimizer behaves exactly like a freshly built
  // one. Used when a slot is retired.
  void ZeroState();
  // Sets the learning rate of every child's every parameter group.
  void SetLr(double lr);
  // Replaces the hyperparameters of every child (lr, weight decay; betas
  // and eps of the Adam family and of the muon family's AdamW child; Lion's
  // betas; Muon's momentum and Nesterov flag) with `config`'s, keeping all
  // state: a client that drives its own schedule sets them before each
  // step. INVALID_ARGUMENT naming the field for a bad config, another
  // family or another scalar optimizer (nothing changes then).
  absl::Status SetHyperparameters(const OptimizerConfig& config);
  double lr() const;

  const OptimizerConfig& config() const { return config_; }
  const std::vector<OptimizerChild>& children() const { return children_; }
  // All parameters, in the order given to BuildSlotOptimizer.
  const std::vector<torch::Tensor>& parameters() const { return parameters_; }
  // Each parameter's layout, parallel to parameters().
  const std::vector<ParamLayout>& layouts() const { return layouts_; }

  // The state of every parameter, by position, in a LibTorch archive that
  // does not depend on the LibTorch version. Load accepts only an archive
  // of the same family, children and parameter shapes; it checks all of it
  // before copying into the existing state tensors (in place, converting
  // dtype and device), so on error (INVALID_ARGUMENT) nothing has changed.
  // Hyperparameters and the learning rate are not part of the archive: they
  // come from the job's config and schedule.
  void Save(torch::serialize::OutputArchive& archive) const;
  absl::Status Load(torch::serialize::InputArchive& archive);

 private:
  friend absl::StatusOr<SlotOptimizer> BuildSlotOptimizer(
      const OptimizerConfig& config, std::vector<torch::Tensor> parameters,
      std::vector<ParamLayout> layouts);
  friend SlotOptimizer EmptySlotOptimizer(const OptimizerConfig& config);
  friend std::vector<absl::Status> StepSlotOptimizers(
      const std::vector<SlotOptimizer*>& optimizers);
  SlotOptimizer(OptimizerConfig config, std::vector<torch::Tensor> parameters,
                std::vector<ParamLayout> layouts,
                std::vector<OptimizerChild> children);

  OptimizerConfig config_;
  std::vector<torch::Tensor> parameters_;
  std::vector<ParamLayout> layouts_;
  std::vector<OptimizerChild> children_;
  double empty_lr_ = 0.0;  // lr() when there are no children.
};

// The factory. Family muon (soap): Muon (SOAP) for 2-D parameters, the
// scalar optimizer (AdamW with the config's betas/eps/weight_decay, or
// Lion) for the rest; adamw/adam/lion: one child for all. Children with no
// parameters are not created. Every child's state is created eagerly.
// `layouts[i]` says which matrices parameters[i] holds (Muon orthogonalizes,
// and SOAP preconditions, each expert's matrix of a mixture-of-experts LoRA on
// its own); empty means each parameter is one. INVALID_ARGUMENT for a bad
// config, no parameters, a parameter that is not a float leaf tensor
// requiring grad, the same tensor twice, parameters on different devices,
// or layouts that are not one per parameter or do not fit it.
absl::StatusOr<SlotOptimizer> BuildSlotOptimizer(
    const OptimizerConfig& config, std::vector<torch::Tensor> parameters,
    std::vector<ParamLayout> layouts = {});

// Steps every optimizer as its Step() would, with the Newton–Schulz calls of
// all their Muon children shared (ApplyMuonUpdates): same-shape LoRA
// matrices of many slots are orthogonalized in one batched call. Returns one
// status per optimizer: OK, or INTERNAL with the error of its step, in which
// case that optimizer alone failed (its parameters may be partly updated)
// and the others stepped as they would have without it.
std::vector<absl::Status> StepSlotOptimizers(
    const std::vector<SlotOptimizer*>& optimizers);

// An optimizer over no parameters (a data-parallel rank that owns none of
// a slot's): Step and ZeroState do nothing; lr() is the last SetLr.
SlotOptimizer EmptySlotOptimizer(const OptimizerConfig& config);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_SLOT_OPTIMIZER_H_
