// Newton–Schulz orthogonalization, the core of the Muon optimizer.
//
// NewtonSchulz(x) approximates the orthogonal polar factor U Vᵀ of
// x = U Σ Vᵀ by a fixed number of odd-polynomial iterations
// X ← a·X + (b·A + c·A²)·X with A = X Xᵀ, as in NVIDIA Emerging-Optimizers
// (see DESIGN.md §4 for the exact rule and the coefficient tables). Every
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

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace loraplex {

// One iteration's polynomial coefficients (a, b, c).
struct NsCoefficients {
  double a = 0.0;
  double b = 0.0;
  double c = 0.0;
};

enum class NsCoefficientSet {
  kSimple,        // One tuple, cycled (Keller Jordan's Muon).
  kQuintic,       // Five tuples, cycled (Megatron-LM default).
  kPolarExpress,  // Eight tuples; the last repeats past the end.
  kAol,           // Four tuples, cycled.
  kCustom,        // The caller's own list, cycled.
};

enum class NsPrecision {
  kFp32,  // Whole iteration in fp32.
  kBf16,  // Loop in bf16 ("medium" matmul precision); result back in fp32.
};

inline constexpr std::array<NsCoefficientSet, 5> kAllNsCoefficientSets = {
    NsCoefficientSet::kSimple, NsCoefficientSet::kQuintic,
    NsCoefficientSet::kPolarExpress, NsCoefficientSet::kAol,
    NsCoefficientSet::kCustom};
inline constexpr std::array<NsPrecision, 2> kAllNsPrecisions = {
    NsPrecision::kFp32, NsPrecision::kBf16};

struct NewtonSchulzOptions {
  NsCoefficientSet coefficient_set = NsCoefficientSet::kQuintic;
  // Used only with kCustom; must then be non-empty.
  std::vector<NsCoefficients> custom_coefficients;
  int steps = 5;  // At least 1.
  NsPrecision precision = NsPrecision::kFp32;
};

// The published table of a built-in set (empty for kCustom).
const std::vector<NsCoefficients>& BuiltinNsCoefficients(NsCoefficientSet set);

// The tuple used at iteration `step` (0-based), applying the cycle/repeat
// rule of the set.
NsCoefficients NsCoefficientsForStep(const NewtonSchulzOptions& options,
                                     int step);

absl::string_view NsCoefficientSetName(NsCoefficientSet set);
std::optional<NsCoefficientSet> ParseNsCoefficientSet(absl::string_view name);
absl::string_view NsPrecisionName(NsPrecision precision);
std::optional<NsPrecision> ParseNsPrecision(absl::string_view name);

// Empty when the options are usable, else the reason ("ns_steps must be
// >= 1, got 0").
std::string NewtonSchulzOptionsError(const NewtonSchulzOptions& options);

// Orthogonalizes x ([m, n] or [k, m, n], any floating dtype) and returns an
// fp32 tensor of the same shape (fp64 for fp64 x). A zero matrix maps to zeros.
// Throws c10::Error on invalid options or input rank.
torch::Tensor NewtonSchulz(const torch::Tensor& x,
                           const NewtonSchulzOptions& options);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_NEWTON_SCHULZ_H_
