// Per-slot gradient clipping by global L2 norm.
//
// The norm is taken over all of one slot's gradients together (as PyTorch's
// clip_grad_norm_), so slots never influence each other's clipping. Many
// slots are measured together, with one read from the device for all of
// them (on a GPU each read waits for the device):
//
//   std::vector<GradNorm> norms =
//       ClipGradNorms({slot_a_params, slot_b_params}, {1.0, 0.0});
//   if (!norms[0].finite) { skip slot a's step; }
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

// For each i: measures the global L2 norm of the defined gradients of
// `params[i]` (in fp64) and, when max_norms[i] > 0 and the norm exceeds it,
// scales them in place by max_norm / (norm + 1e-6). max_norm == 0 only
// measures. A non-finite norm leaves the gradients untouched and reports
// finite = false. The norms are read from their device once for all.
std::vector<GradNorm> ClipGradNorms(
    const std::vector<std::vector<torch::Tensor>>& params,
    const std::vector<double>& max_norms);

// ClipGradNorms for one set of parameters.
GradNorm ClipGradNorm(const std::vector<torch::Tensor>& params,
                      double max_norm);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_GRAD_CLIP_H_
