// Per-slot gradient clipping by global L2 norm.
//
// The norm is taken over all of one slot's gradients together (as PyTorch's
// clip_grad_norm_), so slots never influence each other's clipping:
//
//   GradNorm norm = ClipGradNorm(slot_params, config.grad_clip);
//   if (!norm.finite) { skip this slot's step; }
#ifndef LORAPLEX_CORE_OPTIM_GRAD_CLIP_H_
#define LORAPLEX_CORE_OPTIM_GRAD_CLIP_H_

#include <torch/types.h>

#include <vector>

namespace loraplex {

struct GradNorm {
  double norm = 0.0;     // Global L2 norm before clipping.
  bool finite = true;    // False when the norm is NaN or infinite.
  bool clipped = false;  // True when the gradients were scaled down.
};

// Measures the global L2 norm of the defined gradients of `params` and, when
// max_norm > 0 and the norm exceeds it, scales them in place by
// max_norm / (norm + 1e-6). max_norm == 0 only measures. A non-finite norm
// leaves the gradients untouched and reports finite = false.
GradNorm ClipGradNorm(const std::vector<torch::Tensor>& params,
                      double max_norm);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_GRAD_CLIP_H_
