// A slot's optimizer configuration as plain values, with validation that
// names the offending field ("optimizer.momentum must be in [0, 1), got 1").
//
// The transport layer fills an OptimizerConfig from the request and calls
// ValidateOptimizerConfig before anything is built; BuildSlotOptimizer
// (slot_optimizer.h) turns it into the slot's optimizer children.
#ifndef LORAPLEX_CORE_OPTIM_OPTIMIZER_CONFIG_H_
#define LORAPLEX_CORE_OPTIM_OPTIMIZER_CONFIG_H_

#include <array>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "core/optim/muon_config.h"
#include "core/optim/newton_schulz_config.h"

namespace loraplex {

enum class OptimizerFamily {
  kAdamW,  // AdamW (decoupled weight decay) for every parameter.
  kAdam,   // Adam (L2 weight decay into the gradient) for every parameter.
  kMuon,   // Muon for 2-D matrices, the scalar optimizer for the rest.
  kLion,   // Lion (core/optim/lion.h) for every parameter.
  kSoap,   // SOAP (core/optim/soap.h) for 2-D matrices, the scalar
           // optimizer for the rest.
};

// Appended only: checkpoints store a family as its index here.
inline constexpr std::array<OptimizerFamily, 5> kAllOptimizerFamilies = {
    OptimizerFamily::kAdamW, OptimizerFamily::kAdam, OptimizerFamily::kMuon,
    OptimizerFamily::kLion, OptimizerFamily::kSoap};

absl::string_view OptimizerFamilyName(OptimizerFamily family);
std::optional<OptimizerFamily> ParseOptimizerFamily(absl::string_view name);

// The optimizer of the muon and soap families' parameters that the matrix
// optimizer does not take (everything but 2-D matrices), as
// Emerging-Optimizers pairs a matrix optimizer with a scalar one.
enum class ScalarOptimizer {
  kAdamW,  // The default: betas, eps, weight_decay as the adamw family.
  kLion,   // lion_betas, weight_decay as the lion family.
};

inline constexpr std::array<ScalarOptimizer, 2> kAllScalarOptimizers = {
    ScalarOptimizer::kAdamW, ScalarOptimizer::kLion};

absl::string_view ScalarOptimizerName(ScalarOptimizer scalar);
std::optional<ScalarOptimizer> ParseScalarOptimizer(absl::string_view name);

struct OptimizerConfig {
  OptimizerFamily family = OptimizerFamily::kAdamW;
  // Peak learning rate: the slot's LR schedule warms up to it and decays
  // from it.
  double lr = 1e-4;
  double weight_decay = 0.0;

  // Adam/AdamW, and the AdamW child of the muon family. LibTorch defaults.
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;

  // Muon only (docs/DESIGN.md §4).
  double momentum = 0.95;
  bool nesterov = false;
  MuonWeightDecayMode weight_decay_mode = MuonWeightDecayMode::kDecoupled;
  int ns_steps = 5;
  NsCoefficientSet coefficient_set = NsCoefficientSet::kQuintic;
  std::vector<NsCoefficients> custom_coefficients;  // For kCustom.
  NsPrecision ns_precision = NsPrecision::kFp32;
  MuonScaleMode scale_mode = MuonScaleMode::kSpectral;
  // 0.2 with spectral scaling gives Muon updates the RMS of AdamW's (as in
  // Moonlight, arXiv:2502.16982), so a job can switch family without
  // retuning lr. Megatron-LM's own default is 1.0.
  double extra_scale_factor = 0.2;
  ScalarOptimizer scalar_optimizer = ScalarOptimizer::kAdamW;

  // Lion: the lion family, and the muon family's scalar optimizer when it
  // is kLion. Emerging-Optimizers' defaults. (Its weight decay default,
  // 0.01, is not taken: weight_decay above applies to every family.)
  double lion_beta1 = 0.9;
  double lion_beta2 = 0.99;

  // SOAP (docs/DESIGN.md §4): the betas of its Adam in the eigenbasis and
  // of the Kronecker factors, Emerging-Optimizers' defaults; eps and
  // weight_decay are the shared fields above.
  double soap_beta1 = 0.9;
  double soap_beta2 = 0.95;
  double shampoo_beta = 0.95;
  // The eigenbases are refreshed at step 1 and then every this many steps
  // (1: every step, as Emerging-Optimizers 0.3.0).
  int precondition_frequency = 1;
  // A side of a matrix longer than this is not preconditioned (identity
  // basis, no factor kept), as max_precond_dim of Vyas et al.'s SOAP. Its
  // default there, 10000, is meant for full weights: on LoRA matrices the
  // long side's factor and basis cost side² floats each (about 40 GB per
  // slot with 10000, 200 GB with no limit, for every projection of a
  // Llama-3-8B), while the rank side's are r². 1024 keeps the rank side and
  // the long sides of small models; Emerging-Optimizers has no limit (0
  // here).
  int max_precond_dim = 1024;
  // Rounds of orthogonal iteration per refresh, or a full eigh each time.
  int power_iter_steps = 1;
  bool use_eigh = false;
  // Clip the update's RMS to this (0: no clipping).
  double max_update_rms = 0.0;
};

// INVALID_ARGUMENT naming the first bad field, else OK.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_OPTIMIZER_CONFIG_H_
