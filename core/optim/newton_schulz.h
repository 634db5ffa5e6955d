// Newton–Schulz orthogonalization, the core of the Muon optimizer.
//
// NewtonSchulz(x) approximates the orthogonal polar factor U Vᵀ of
// x = U Σ Vᵀ by a fixed number of odd-polynomial iterations
// X ← a·X + (b·A + c·A²)·X with A = X Xᵀ, as in NVIDIA Emerging-Optimizers
// (see docs/DESIGN.md §4 for the exact rule and the coefficient tables). Every
// singular value σ of the normalised input follows the scalar map
// σ ← aσ + bσ³ + cσ⁵, so the result has the singular vectors of x and
// singular values pushed towards 1.
//
// A 3-D input [k, m, n] is k independent matrices orthogonalized in one
// batched computation, each with its own normalisation; the result equals
// running the 2-D function on each matrix.
//
//   NewtonSchulzOptions ns;  // quintic, 5 steps, fp32
//   torch::Tensor o = NewtonSchulz(update, ns);
#ifndef LORAPLEX_CORE_OPTIM_NEWTON_SCHULZ_H_
#define LORAPLEX_CORE_OPTIM_NEWTON_SCHULZ_H_

#include <torch/types.h>

#include "core/optim/newton_schulz_config.h"

namespace loraplex {

// The tuple used at iteration `step` (0-based), applying the cycle/repeat
// rule of the set.
NsCoefficients NsCoefficientsForStep(const NewtonSchulzOptions& options,
                                     int step);

// Orthogonalizes x ([m, n] or [k, m, n], any floating dtype) and returns an
// fp32 tensor of the same shape (fp64 for fp64 x). A zero matrix maps to zeros.
// Throws c10::Error on invalid options or input rank.
torch::Tensor NewtonSchulz(const torch::Tensor& x,
                           const NewtonSchulzOptions& options);

// How many [rows, cols] matrices on `device` one batched call should take:
// on CPU up to 1 MiB of them with MKL, 128 KiB with another BLAS (at least
// one; newton_schulz.cc has the measurements), elsewhere no limit. NewtonSchulz
// splits larger batches itself; callers that stack matrices for it can stack
// only this many at a time.
int64_t NewtonSchulzBatchSize(int64_t rows, int64_t cols,
                              const torch::Device& device);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_NEWTON_SCHULZ_H_
