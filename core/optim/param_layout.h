// How a parameter holds the matrices that Muon orthogonalizes and LayerWise
// ownership weighs (docs/DESIGN.md §4, §6): the parameter itself, or one
// matrix per expert of a mixture-of-experts LoRA nested as PEFT's
// target_parameters do (core/lora/lora_weights.h, LoraModule):
//
//   ParamLayout a{ExpertStacking::kRows, experts};     // A [E*r, in]
//   ParamLayout b{ExpertStacking::kColumns, experts};  // B [out, r*E]
//   BuildSlotOptimizer(config, weights.parameters(),
//                      weights.parameter_layouts());
//
// Elementwise optimizers (Adam, AdamW, Lion) ignore the layout.
#ifndef LORAPLEX_CORE_OPTIM_PARAM_LAYOUT_H_
#define LORAPLEX_CORE_OPTIM_PARAM_LAYOUT_H_

#include <torch/types.h>

#include <cstdint>
#include <string>
#include <utility>

namespace loraplex {

enum class ExpertStacking {
  kNone,     // One matrix: the parameter.
  kRows,     // [E*m, n]: expert e's m×n matrix is rows e*m..(e+1)*m-1.
  kColumns,  // [m, n*E]: expert e's m×n matrix is columns e, e+E, e+2E, ...
};

struct ParamLayout {
  ExpertStacking stacking = ExpertStacking::kNone;
  int64_t experts = 1;  // Matrices in the parameter when stacked.

  // How many matrices the parameter holds.
  int64_t matrices() const {
    return stacking == ExpertStacking::kNone ? 1 : experts;
  }
};

// Empty when a parameter of shape `shape` can hold `layout`, else why
// ("holds 4 experts stacked in rows, but its shape [10, 8] has 10 rows").
std::string ParamLayoutError(const ParamLayout& layout, c10::IntArrayRef shape);

// The rows and columns of each of the parameter's matrices (the shape
// itself for kNone; -1, -1 when the layout does not fit the shape).
std::pair<int64_t, int64_t> MatrixShapeOf(const ParamLayout& layout,
                                          c10::IntArrayRef shape);

// The parameter's matrices as one [matrices, m, n] view of `param` (a
// strided view for kColumns): writing into it writes the parameter. The
// layout must fit (ParamLayoutError).
torch::Tensor MatricesOf(const torch::Tensor& param, const ParamLayout& layout);

}  // namespace loraplex

#endif  // LORAPLEX_CORE_OPTIM_PARAM_LAYOUT_H_
