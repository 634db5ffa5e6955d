#include "core/optim/param_layout.h"

#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"

namespace loraplex {

std::pair<int64_t, int64_t> MatrixShapeOf(const ParamLayout& layout,
                                          c10::IntArrayRef shape) {
  if (!ParamLayoutError(layout, shape).empty()) return {-1, -1};
  if (shape.size() != 2) return {-1, -1};
  switch (layout.stacking) {
    case ExpertStacking::kNone:
      break;
    case ExpertStacking::kRows:
      return {shape[0] / layout.experts, shape[1]};
    case ExpertStacking::kColumns:
      return {shape[0], shape[1] / layout.experts};
  }
  return {shape[0], shape[1]};
}

std::string ParamLayoutError(const ParamLayout& layout,
                             c10::IntArrayRef shape) {
  if (layout.stacking == ExpertStacking::kNone) return "";
  const bool rows = layout.stacking == ExpertStacking::kRows;
  const std::string what =
      absl::StrCat("holds ", layout.experts, " experts stacked in ",
                   rows ? "rows" : "columns");
  if (layout.experts < 1) {
    return absl::StrCat(what, "; the expert count must be at least 1");
  }
  std::ostringstream shape_text;
  shape_text << shape;
  if (shape.size() != 2) {
    return absl::StrCat(what, ", but its shape ", shape_text.str(),
                        " is not a matrix");
  }
  const int64_t stacked = rows ? shape[0] : shape[1];
  if (stacked % layout.experts != 0 || stacked == 0) {
    return absl::StrCat(what, ", but its shape ", shape_text.str(), " has ",
                        stacked, rows ? " rows" : " columns");
  }
  return "";
}

torch::Tensor MatricesOf(const torch::Tensor& param,
                         const ParamLayout& layout) {
  switch (layout.stacking) {
    case ExpertStacking::kNone:
      break;
    case ExpertStacking::kRows:
      return param.view({layout.experts, -1, param.size(1)});
    case ExpertStacking::kColumns:
      return param.view({param.size(0), -1, layout.experts}).permute({2, 0, 1});
  }
  return param.unsqueeze(0);
}

}  // namespace loraplex
