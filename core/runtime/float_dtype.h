// The one rule for the floating dtype of everything the engine computes
// beyond the base model's weights (LoRA weights and math, optimizer state,
// Newton-Schulz, norms, logits, losses): fp32, whatever the base computes
// in (docs/DESIGN.md §2), except fp64, which stays fp64 so the engine's
// identities can be checked beyond fp32 rounding.
#ifndef LORAPLEX_CORE_RUNTIME_FLOAT_DTYPE_H_
#define LORAPLEX_CORE_RUNTIME_FLOAT_DTYPE_H_

#include <torch/types.h>

namespace loraplex {

inline torch::ScalarType Fp32OrFp64(torch::ScalarType dtype) {
  return dtype == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

}  // namespace loraplex

#endif  // LORAPLEX_CORE_RUNTIME_FLOAT_DTYPE_H_
